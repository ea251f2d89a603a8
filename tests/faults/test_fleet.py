"""What goes wrong in a fleet of builders (issue 15), with the real servers: a shared
compiler cache that does not answer, dies during a build or holds a damaged entry, a
build server killed while it compiles, and credentials that must stay out of everything
kiln writes. A build goes on in each case, here, with the bytes a local build makes."""

from __future__ import annotations

import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from kiln.errors import ConfigError
from kiln.inside.sccache import free_port
from kiln.orchestrate import stages
from tests import fleet
from tests.conftest import step_marker
from tests.fleet import builder, compiler_info, wheels
from tests.upstreams import Upstreams
from tests.workspace import plain_vendor, write


def _kill_when(marker: Path, kill, after_s: float = 0.0) -> threading.Thread:
    """Run ``kill`` once the build writes ``marker`` (the fixture's compile starts)."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(after_s)
        kill()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _slow_plain(tmp_path: Path, upstreams: Upstreams) -> Path:
    """The fixture with a second's pause before its nvcc compile: time for a fault."""
    vendor = plain_vendor(upstreams.plain[2], env={"PLAIN_BUILD_DELAY": "1"})
    return write(tmp_path / "ws", {"plain": vendor})


@pytest.mark.parametrize("backend", ["ccache", "sccache"])
def test_an_unreachable_store_costs_one_warning_and_the_build_goes_on(
    tmp_path: Path, upstreams: Upstreams, options, caplog, backend: str
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    nobody = f"redis://127.0.0.1:{free_port()}"  # nothing listens there
    local = stages.build(builder(options, ws, tmp_path, "local", cache_backend=backend))
    with caplog.at_level("WARNING", logger="kiln"):
        release = stages.build(
            builder(options, ws, tmp_path, "b", cache_backend=backend, cache_store=nobody)
        )
    info = compiler_info(release)
    fleet.report(f"{backend}, store unreachable", info)
    assert info["store"] == "unreachable" and info["warnings"], info
    said = [r.getMessage() for r in caplog.records if "shared compiler cache" in r.getMessage()]
    assert len(said) == 1, said
    assert wheels(release) == wheels(local)


def test_a_store_killed_during_the_build_is_a_warning_not_a_failure(
    tmp_path: Path, upstreams: Upstreams, options, redis_server: fleet.Redis, monkeypatch
) -> None:
    """ccache's remote storage: the first compile reaches Redis, the next finds it gone."""
    ws = _slow_plain(tmp_path, upstreams)
    marker = step_marker(tmp_path / "b", "compiling")  # in builder b's logs: it may write there
    local = stages.build(builder(options, ws, tmp_path, "local"))
    _kill_when(marker, redis_server.kill)
    monkeypatch.setenv("PLAIN_STARTED_MARKER", str(marker))
    release = stages.build(builder(options, ws, tmp_path, "b", cache_store=redis_server.url))
    info = compiler_info(release)
    fleet.report("ccache, Redis killed mid-build", info)
    assert info["store"] == "reachable" and info["errors"] >= 1, info
    assert any("failed during the step" in w for w in info["warnings"]), info
    assert wheels(release) == wheels(local)


@pytest.mark.parametrize("backend", ["ccache", "sccache"])
def test_a_damaged_remote_entry_is_never_used(
    tmp_path: Path, upstreams: Upstreams, options, redis_server: fleet.Redis, backend: str
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    shared = {"cache_backend": backend, "cache_store": redis_server.url}
    a = stages.build(builder(options, ws, tmp_path, "a", **shared))
    keys = [k for k in redis_server.cli("--scan").split() if k]
    assert keys
    for key in keys:  # every entry damaged at its start and in its middle
        size = int(redis_server.cli("STRLEN", key).strip() or 0)
        for offset in (0, size // 2):
            redis_server.cli("SETRANGE", key, str(offset), "damaged-" * 8)
    where = {"work": tmp_path / "a" / "work"} if backend == "sccache" else {}
    if where:
        shutil.rmtree(tmp_path / "a" / "work")
    b = stages.build(builder(options, ws, tmp_path, "b", **shared, **where))
    info = compiler_info(b)
    fleet.report(f"{backend}, every remote entry damaged", info)
    assert info["remote_hits"] == 0, info  # nothing damaged was used: everything compiled
    assert info["misses"] >= 2, info
    assert wheels(b) == wheels(a)


def _kill_at_a_started_job(scheduler_log: Path, kill) -> tuple[threading.Thread, list[str]]:
    """Run ``kill`` the moment the scheduler records a job as Started at a build server
    (polled every 10 ms: a remote compile takes about a second); returns the thread and
    the list that gets the job's number."""
    started: list[str] = []

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            found = re.search(r"Job (\d+) updated state to Started", scheduler_log.read_text())
            if found:
                kill()
                started.append(found[1])
                return
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t, started


def test_a_build_server_killed_mid_compile_leaves_the_compile_to_this_machine(
    tmp_path: Path, upstreams: Upstreams, options, dist_servers: fleet.Dist, monkeypatch
) -> None:
    """The servers are killed while a compile runs at one of them (the scheduler saw the
    job start and never saw it complete), not before any was sent: the build falls back
    to this machine and makes the same wheel."""
    ws = _slow_plain(tmp_path, upstreams)
    local = stages.build(builder(options, ws, tmp_path, "local", cache_backend="sccache"))
    monkeypatch.setenv("KILN_DIST_TOKEN", dist_servers.token)

    def kill_servers() -> None:
        for s in dist_servers.servers:
            s.kill()

    scheduler_log = dist_servers.logs[0]
    watcher, started = _kill_at_a_started_job(scheduler_log, kill_servers)
    release = stages.build(builder(options, ws, tmp_path, "remote", distribute=dist_servers.url))
    watcher.join(timeout=5)
    info = compiler_info(release)
    fleet.report("build servers killed mid-compile", info)
    assert started, "no compile ever started at a build server"
    log = scheduler_log.read_text()
    assert f"Job {started[0]} updated state to Complete" not in log, "killed too late"
    assert info["distributed"]["errors"] >= 1, info
    assert wheels(release) == wheels(local)


def test_credentials_stay_out_of_everything_kiln_writes(
    tmp_path: Path, upstreams: Upstreams, options, monkeypatch
) -> None:
    secret, token = "s3cr3t-redis-password-4711", "s3cr3t-dist-token-0815"
    redis_server = fleet.start_redis(tmp_path / "redis-auth", password=secret)
    monkeypatch.setenv("SCCACHE_REDIS_PASSWORD", secret)
    monkeypatch.setenv("KILN_DIST_TOKEN", token)
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    opts = builder(
        options,
        ws,
        tmp_path,
        "b",
        cache_backend="sccache",
        cache_store=redis_server.url,
        distribute=f"http://127.0.0.1:{free_port()}",  # no scheduler: a warning
    )
    try:
        release = stages.build(opts)
    finally:
        redis_server.kill()
    # The password was used (Redis refuses a client without it) and written down nowhere.
    assert compiler_info(release)["store"] == "reachable"
    written = [p for p in (tmp_path / "b").rglob("*") if p.is_file()]
    assert release.is_dir() and written
    for path in written:
        data = path.read_bytes()
        assert secret.encode() not in data and token.encode() not in data, path

    with pytest.raises(ConfigError, match="credentials do not go in the URL"):
        stages.build(
            builder(options, ws, tmp_path, "c", cache_store=f"redis://:{secret}@127.0.0.1:1")
        )
