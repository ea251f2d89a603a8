"""A fleet of builders (issue 15), with the real servers on loopback: builds share a
compiler cache in a ``redis-server`` through sccache, and send compiles to an
``sccache-dist`` scheduler whose two build servers run them in bubblewrap sandboxes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kiln.orchestrate import stages
from tests import fleet
from tests.fleet import builder as _builder
from tests.fleet import compiler_info as _compiler
from tests.fleet import wheels as _wheels
from tests.releases import manifest_json
from tests.upstreams import Upstreams
from tests.workspace import plain_vendor, write


@pytest.mark.parametrize("backend", ["ccache", "sccache"])
def test_a_second_builder_takes_the_first_builders_compiles_from_redis(
    tmp_path: Path, upstreams: Upstreams, options, redis_server: fleet.Redis, backend: str
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    shared = {"cache_store": redis_server.url, "cache_backend": backend}
    a = stages.build(_builder(options, ws, tmp_path, "a", **shared))
    first = _compiler(a)
    assert first["tool"] == backend and first["store"] == "reachable"
    assert first["misses"] >= 2 and first["hits"] == 0, first
    assert int(redis_server.cli("DBSIZE").strip()) >= first["misses"]  # written through to Redis

    # B: its own compiler-cache folder and artifacts, nothing local. With ccache also its
    # own work folder; sccache 0.16 hashes nvcc's internal -orig_src_path_name as written,
    # so B builds where A did (A's tree gone), as the jobs of a CI matrix do.
    where = {}
    if backend == "sccache":
        shutil.rmtree(tmp_path / "a" / "work")
        where = {"work": tmp_path / "a" / "work"}
    b = stages.build(_builder(options, ws, tmp_path, "b", **shared, **where))
    second = _compiler(b)
    assert second["local_hits"] == 0  # B's own folder was empty
    rate = second["remote_hits"] / (second["hits"] + second["misses"])
    fleet.report(f"{backend} A cold", first)
    fleet.report(f"{backend} B from A's store ({100 * rate:.0f} % remote hits)", second)
    assert rate >= 0.95, second
    assert _wheels(b) == _wheels(a)

    # And the bytes a build without any compiler cache makes (kiln verify's way).
    plain = stages.build(_builder(options, ws, tmp_path, "c", no_compiler_cache=True))
    assert _compiler(plain)["tool"] is None
    assert _wheels(plain) == _wheels(a)


def test_a_distributed_build_gives_the_bytes_of_a_local_one(
    tmp_path: Path, upstreams: Upstreams, options, dist_servers: fleet.Dist, monkeypatch
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    local = stages.build(_builder(options, ws, tmp_path, "local", cache_backend="sccache"))
    monkeypatch.setenv("KILN_DIST_TOKEN", dist_servers.token)
    remote = stages.build(_builder(options, ws, tmp_path, "remote", distribute=dist_servers.url))
    data = manifest_json(remote)
    assert data["scheduler"]["remote_slots"] >= 2
    step = data["vendors"]["plain"]
    assert step["schedule"]["compiles_remote"] >= 1, step["schedule"]
    ran = step["caches"]["compiler"]["distributed"]
    fleet.report(
        f"distributed ({step['schedule']['compiles_remote']} of "
        f"{step['schedule']['compiles']} compiles in remote slots)",
        step["caches"]["compiler"],
    )
    assert sum(ran["servers"].values()) >= 1, ran
    assert _wheels(remote) == _wheels(local)
