"""A stand-in for the Hugging Face Hub: the few endpoints huggingface_hub 2.4 calls to make
one commit (``HfApi.create_commit``), served on 127.0.0.1 for the publish tests.

- ``POST /api/validate-yaml``: README.md's metadata check (always valid here);
- ``POST /api/models/{repo}/preupload/{revision}``: the upload mode of each file. The
  stand-in answers ``regular`` for every file, so contents travel base64-encoded inside the
  commit itself (the real Hub sends large files through LFS/Xet storage first; that part of
  the protocol is not served here);
- ``POST /api/models/{repo}/commit/{revision}``: the NDJSON commit (files added and
  deleted). It is applied only once the whole request has been read, so a commit is all
  files or none, as on the Hub;
- ``GET /api/models/{repo}/tree/{revision}``: the files the repository holds (one page);
- ``GET /{repo}/resolve/{revision}/{path}``: a file's bytes.

Every request must carry ``Authorization: Bearer <token>``. Every request is recorded.
``echo_token_on_commit`` makes the commit fail with an error message that repeats the
request's Authorization header, as a careless server might: kiln must not print it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Commit:
    repo: str
    summary: str
    description: str
    files: dict[str, bytes]


@dataclass
class StandinHub:
    root: Path  # committed files land in root/<org>/<name>/
    token: str
    repos: set[str]
    echo_token_on_commit: bool = False
    requests: list[tuple[str, str]] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)
        return f"http://{host}:{port}"

    def __enter__(self) -> StandinHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                hub.requests.append(("POST", self.path))
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts == ["api", "validate-yaml"]:
                    return self._send(200, {"errors": [], "warnings": []})
                if len(parts) == 6 and parts[:2] == ["api", "models"]:
                    repo, action = f"{parts[2]}/{parts[3]}", parts[4]
                    if repo not in hub.repos:
                        return self._send(
                            404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
                        )
                    if action == "preupload":
                        return self._preupload(json.loads(body))
                    if action == "commit":
                        return self._commit(repo, body)
                return self._send(404, {"error": f"the stand-in does not serve {self.path}"})

            def do_GET(self) -> None:
                hub.requests.append(("GET", self.path))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) >= 5 and parts[:2] == ["api", "models"] and parts[4] == "tree":
                    repo = f"{parts[2]}/{parts[3]}"
                    if repo not in hub.repos:
                        return self._send(
                            404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
                        )
                    folder = hub.root / repo
                    files = (
                        sorted(p for p in folder.rglob("*") if p.is_file())
                        if folder.is_dir()
                        else []
                    )
                    listing = [
                        {
                            "type": "file",
                            "path": str(p.relative_to(folder)),
                            "size": p.stat().st_size,
                            "oid": hashlib.sha1(p.read_bytes()).hexdigest(),
                        }
                        for p in files
                    ]
                    return self._send_json_list(listing)
                if len(parts) >= 5 and parts[2] == "resolve":
                    path = hub.root / parts[0] / parts[1] / "/".join(parts[4:])
                    if path.is_file():
                        return self._send_bytes(path.read_bytes())
                self._send(404, {"error": f"the stand-in does not serve {self.path}"})

            def _send_json_list(self, listing: list[dict[str, Any]]) -> None:
                data = json.dumps(listing).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_bytes(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _preupload(self, payload: dict[str, Any]) -> None:
                files = [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                    for f in payload["files"]
                ]
                self._send(200, {"files": files})

            def _commit(self, repo: str, body: bytes) -> None:
                if hub.echo_token_on_commit:
                    auth = self.headers.get("Authorization")
                    return self._send(500, {"error": f"storage failed for request ({auth})"})
                lines = [json.loads(ln) for ln in body.splitlines() if ln.strip()]
                header = lines[0]["value"]
                files: dict[str, bytes] = {}
                deletes: list[str] = []
                for item in lines[1:]:
                    if item["key"] == "deletedFile":
                        deletes.append(item["value"]["path"])
                        continue
                    if item["key"] != "file" or item["value"].get("encoding") != "base64":
                        return self._send(400, {"error": f"stand-in: unsupported {item['key']}"})
                    files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                for rel in deletes:
                    (hub.root / repo / rel).unlink()
                    hub.deleted.append(rel)
                for rel, content in files.items():
                    dest = hub.root / repo / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(content)
                hub.commits.append(Commit(repo, header["summary"], header["description"], files))
                oid = hashlib.sha1(body).hexdigest()
                self._send(
                    200,
                    {
                        "commitUrl": f"{hub.url}/{repo}/commit/{oid}",
                        "commitOid": oid,
                        "pullRequestUrl": None,
                    },
                )

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
