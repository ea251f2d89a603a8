"""sccache's servers for one build step, where the step runs (stdlib only).

sccache reads its base directories (the step's tree) when its server starts, so each
step runs servers of its own on free loopback ports: one that compiles here and, with
``KILN_DIST_URL``, one that sends compiles to the ``sccache-dist`` scheduler. kiln's
compile gate decides which of the two a compile goes to (a remote slot or a local one),
so the plan says what ran where. When the step ends, both servers' statistics go into
``KILN_SCCACHE_STATS`` (JSON) and the servers stop.

A shared store that cannot be reached when the step starts does not stop the build:
the server is started again with the local folder alone, one warning says so and the
statistics record it. A store that fails later costs sccache read or write errors,
which it counts, and the compile runs. The scheduler's token (``KILN_DIST_TOKEN``)
goes into a config file only this step's servers read, removed when the step ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, MutableMapping
from typing import TypedDict

from kiln.inside import say
from kiln.inside.kit import contract

DIST_PORT = contract.SCCACHE_DIST_PORT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sccache(binary: str, args: list[str], env: MutableMapping[str, str]) -> tuple[int, str]:
    res = subprocess.run(
        [binary, *args], env=dict(env), capture_output=True, text=True, check=False, timeout=120
    )
    return res.returncode, (res.stdout + res.stderr).strip()


def _warn(text: str) -> None:
    say.report(f"kiln: warning: {text}")


def _conf(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def dist_config(url: str, token: str, folder: str) -> str:
    """The client side of sccache-dist, token auth (the only secret: this file is 0600)."""
    return (
        f'[dist]\nscheduler_url = "{url}"\ntoolchains = []\n'
        f'cache_dir = "{folder}/toolchains"\n'
        f'[dist.auth]\ntype = "token"\ntoken = "{token}"\n'
    )


def _start(binary: str, env: MutableMapping[str, str]) -> tuple[bool, str]:
    rc, out = _sccache(binary, ["--start-server"], env)
    return rc == 0, out.splitlines()[-1] if out else f"exit {rc}"


class StatsRecord(TypedDict, total=False):
    """What a step's sccache servers did (``KILN_SCCACHE_STATS``, read by
    kiln.toolchain.compilercache.sccache_counts)."""

    servers: list[dict[str, object]]  # sccache's own statistics (JSON), with its port
    warnings: list[str]
    store: str  # the shared store: "reachable" or "unreachable"
    distributed_to: str


@contextlib.contextmanager
def served(env: MutableMapping[str, str]) -> Iterator[None]:
    """Run the step's sccache servers while the body runs; ``env`` (the step's
    environment) gets their ports, or loses ``KILN_SCCACHE`` where none would start."""
    binary = env.get(contract.SCCACHE)
    if not binary:
        yield
        return
    record: StatsRecord = {"servers": [], "warnings": []}
    folder = tempfile.mkdtemp(prefix="kiln-sccache-")
    started: list[dict[str, str]] = []
    try:
        # sccache reads ~/.config/sccache/config too: the local server gets an empty one.
        env["SCCACHE_CONF"] = _conf(folder, "local.toml", "")
        env["SCCACHE_SERVER_PORT"] = str(free_port())
        ok, why = _start(binary, env)
        if not ok and env.get(contract.SCCACHE_STORE_VARS):
            record["warnings"].append(
                f"the shared compiler cache could not be reached ({why}): compiling with "
                "the local cache alone"
            )
            _warn(record["warnings"][-1])
            record["store"] = "unreachable"
            for k in env.pop(contract.SCCACHE_STORE_VARS).split():
                env.pop(k, None)
            ok, why = _start(binary, env)
        elif ok and env.get(contract.SCCACHE_STORE_VARS):
            record["store"] = "reachable"
        if not ok:
            record["warnings"].append(f"sccache did not start ({why}): compiling without it")
            _warn(record["warnings"][-1])
            del env[contract.SCCACHE]
        else:
            started.append(dict(env))
        url, token = env.get(contract.DIST_URL), env.get(contract.DIST_TOKEN, "")
        if ok and url:
            record["distributed_to"] = url
            dist = {**env, "SCCACHE_SERVER_PORT": str(free_port())}
            dist["SCCACHE_CONF"] = _conf(folder, "dist.toml", dist_config(url, token, folder))
            dok, dwhy = _start(binary, dist)
            if dok:
                env[DIST_PORT] = dist["SCCACHE_SERVER_PORT"]
                started.append(dist)
            else:
                record["warnings"].append(
                    f"sccache could not start a server for {url} ({dwhy}): compiling here"
                )
                _warn(record["warnings"][-1])
        yield
    finally:
        for server in started:
            rc, out = _sccache(binary, ["--show-stats", "--stats-format=json"], server)
            with contextlib.suppress(ValueError):
                stats = json.loads(out) if rc == 0 else {}
                record["servers"].append({**stats, "port": server["SCCACHE_SERVER_PORT"]})
            _sccache(binary, ["--stop-server"], server)
        stats_file = env.get(contract.SCCACHE_STATS)
        if stats_file:
            with open(stats_file, "w") as fh:
                json.dump(record, fh, indent=1, sort_keys=True)
        shutil.rmtree(folder, ignore_errors=True)  # the token's file with it


def dist_slots(binary: str, url: str, token: str, base: MutableMapping[str, str]) -> int:
    """The CPUs of the build servers the scheduler at ``url`` has now (0: none answered),
    asked through a short-lived sccache server, as the build's own will ask."""
    folder = tempfile.mkdtemp(prefix="kiln-sccache-")
    env = {k: v for k, v in base.items() if not k.startswith("SCCACHE_")}
    env["SCCACHE_CONF"] = _conf(folder, "dist.toml", dist_config(url, token, folder))
    env["SCCACHE_SERVER_PORT"] = str(free_port())
    env["SCCACHE_DIR"] = os.path.join(folder, "cache")
    try:
        ok, _ = _start(binary, env)
        if not ok:
            return 0
        rc, out = _sccache(binary, ["--dist-status"], env)
        _sccache(binary, ["--stop-server"], env)
        try:
            status = json.loads(out.splitlines()[-1]) if rc == 0 and out else {}
        except ValueError:
            return 0
        answer = status.get("SchedulerStatus") if isinstance(status, dict) else None
        if isinstance(answer, list) and len(answer) == 2 and isinstance(answer[1], dict):
            return int(answer[1].get("num_cpus", 0))
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
