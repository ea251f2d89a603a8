"""What a build step tried to download, named from the attempt itself (issue 55 (1); stdlib
only: it runs inside the step's network namespace, around its command).

In a step's namespace nothing past its own loopback answers, so a download fails with
"Name or service not known" or "Connection refused", which names no URL when the URL was
in a variable, in exec'd code, or fetched by curl, git or pip. Here a listener on the
step's loopback is every client's HTTP and HTTPS proxy (``http_proxy``, ``https_proxy``,
``ALL_PROXY``, read by Python's urllib, requests, pip, curl and git alike): each request
it gets is refused (403) and written to the step's log as ``kiln: refused a download:
URL`` (an HTTPS one as ``https://HOST:PORT``, all a proxy sees of it), which the cause
table's network row reads. Loopback itself is not proxied (``no_proxy``): a step's own
servers (sccache) still answer. A client that ignores proxies still fails, as before.

    python -m kiln.inside.netrefuse -- COMMAND...
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

try:
    from kiln.inside.kit import contract
except ImportError:  # run as a file, isolated (python -I .../netrefuse.py): the kit beside
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kit"))
    import contract  # type: ignore[no-redef]

MARK = "kiln: refused a download: "
# The step's own process diagnoses its failure from its command's output, which this
# wrapper's lines are not part of: they also go to this file, named in its environment.
RECORD_ENV = contract.REFUSED_DOWNLOADS
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")
LOCAL = "localhost,127.0.0.1,::1"


def requested(line: str) -> str:
    """The URL a proxy request line asks for: ``CONNECT host:443 HTTP/1.1`` is
    ``https://host:443``; ``GET http://x/y HTTP/1.1`` is ``http://x/y``."""
    parts = line.split()
    if len(parts) < 2:
        return line.strip() or "(an empty request)"
    method, target = parts[0].upper(), parts[1]
    if method == "CONNECT":
        return f"https://{target}"
    return target


def _answer(conn: socket.socket, record: str) -> None:
    with conn:
        conn.settimeout(10)
        try:
            data = conn.recv(8192)
        except OSError:
            return
        line = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")
        said = f"{MARK}{requested(line)} (the build step has no network)\n"
        sys.stderr.write(said)
        sys.stderr.flush()
        with contextlib.suppress(OSError), open(record, "a") as fh:
            fh.write(said)
        with contextlib.suppress(OSError):
            conn.sendall(
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )


def _serve(server: socket.socket, record: str) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=_answer, args=(conn, record), daemon=True).start()


def recorded() -> str:
    """What this step's wrapper refused so far (its record file), "" where none."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return ""
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        sys.stderr.write("usage: python -m kiln.inside.netrefuse -- COMMAND...\n")
        return 2
    command = argv[1:]
    env = dict(os.environ)
    try:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(16)
    except OSError:  # no loopback in this namespace: the step as it is
        os.execvp(command[0], command)
    proxy = f"http://127.0.0.1:{server.getsockname()[1]}"
    env.update(dict.fromkeys(PROXY_VARS, proxy))
    env["no_proxy"] = env["NO_PROXY"] = LOCAL
    fd, record = tempfile.mkstemp(prefix="kiln-refused-", suffix=".txt")
    os.close(fd)
    env[RECORD_ENV] = record
    threading.Thread(target=_serve, args=(server, record), daemon=True).start()
    try:
        child = subprocess.Popen(command, env=env)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        rc = child.wait()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(record)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
