"""The recipes' system needs (``[[build.system]]``) are checked before anything is
provisioned or fetched (issue 21): a missing ``-dev`` package is known in seconds, not
after kiln made a 5 GB build venv with torch and the pip CUDA. Only a header NVIDIA's pip
wheels may provide (preflight.PIP_CUDA_HEADERS) waits for their folders."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from kiln.config.models import Profile, SystemRequirement
from kiln.orchestrate.preflight import pip_cuda_may_provide
from kiln.toolchain import buildenv
from tests.conftest import (
    BEFORE_ANY_COMPILE_S,
    artifacts_files,
    build_args,
    compiled_units,
    run_kiln,
)
from tests.faults.conftest import (
    ABSENT,
    FAULT_PROFILE,
    error_lines,
    make_tiny,
    mirrors_file,
    tiny_build_args,
    tiny_vendor,
)
from tests.workspace import PROFILE, write

ABSENT_LINE = (
    "vendors/tiny.toml: build.system.0: header <kiln_no_such/absent.h> not found on this "
    "machine: install it (apt-get install libkiln-absent-dev)"
)


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[str, Path]:
    up = tmp_path / "up"
    commit = make_tiny(up)
    return commit, mirrors_file(up / "mirrors.toml", f"{up}/")


def _unprovisioned_build(ws: Path, tmp: Path, mirrors: Path, cache: Path):
    """``kiln build`` of ``ws`` with the tests' profile (torch, CUDA 13.2 from PyPI) into
    the empty ``cache``, without --python: passing preflight means provisioning the
    build venv and the pip CUDA there. pip is pointed at no index and no wheels, so a
    preflight that provisions first fails in seconds instead of installing 5 GB."""
    no_wheels = tmp / "no-wheels"
    no_wheels.mkdir(exist_ok=True)
    args = build_args(ws, tmp, mirrors=mirrors, toolchain="pypi", cache=cache)
    env = {
        buildenv.ENV_VAR: "",  # no build Python from the environment either
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(no_wheels),
    }
    started = time.monotonic()
    res = run_kiln(*args, env=env)
    return res, time.monotonic() - started


def _provisioned(cache: Path) -> list[str]:
    """What provisioning made under ``cache``: a build venv, a pip CUDA."""
    venv = buildenv.env_dir(Profile.model_validate(PROFILE), cache)
    return [str(p) for p in (venv, cache / "envs", cache / "toolchains") if p.exists()]


def test_a_missing_system_header_stops_preflight_before_anything_is_provisioned(
    tmp_path: Path, tiny: tuple[str, Path]
) -> None:
    commit, mirrors = tiny
    ws = write(tmp_path / "ws", {"tiny": tiny_vendor(commit, system=[ABSENT])}, profile=PROFILE)
    cache = tmp_path / "cache"
    cache.mkdir()
    res, took = _unprovisioned_build(ws, tmp_path, mirrors, cache)
    assert _provisioned(cache) == [], res.stderr[-3000:]
    assert "provisioning" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == 9, res.stderr[-3000:]
    assert error_lines(res.stderr) == ["kiln: error: cannot build test-release here (1 problem):"]
    assert f"  - {ABSENT_LINE}" in res.stderr.splitlines()
    assert took < BEFORE_ANY_COMPILE_S, took
    assert compiled_units(tmp_path / "artifacts") == []
    assert artifacts_files(tmp_path / "artifacts") == []


def _gone_patch_workspace(
    tmp_path: Path, tiny: tuple[str, Path], system: list[dict[str, str]]
) -> tuple[Path, Path, Path]:
    """(workspace, mirrors, an empty cache): the tiny vendor with ``system`` needs and a
    series naming a patch file that is not there."""
    commit, mirrors = tiny
    ws = write(
        tmp_path / "ws",
        {"tiny": tiny_vendor(commit, system=system)},
        series=[{"file": "gone.patch", "target": "tiny"}],
        profile=PROFILE,
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    return ws, mirrors, cache


def test_system_needs_are_listed_with_the_other_cheap_problems(
    tmp_path: Path, tiny: tuple[str, Path]
) -> None:
    """A missing patch, a missing header and a missing library: all three at once, and
    still nothing provisioned."""
    lib = {"library": "kiln_no_such_lib", "package": "libkiln-nolib-dev"}
    ws, mirrors, cache = _gone_patch_workspace(tmp_path, tiny, [ABSENT, lib])
    res, _took = _unprovisioned_build(ws, tmp_path, mirrors, cache)
    assert res.returncode == 9, res.stderr[-3000:]
    assert error_lines(res.stderr) == ["kiln: error: cannot build test-release here (3 problems):"]
    problems = [ln for ln in res.stderr.splitlines() if ln.startswith("  - ")]
    assert len(problems) == 3, problems
    assert "gone.patch" in problems[0], problems
    assert problems[1:] == [
        f"  - {ABSENT_LINE}",
        "  - vendors/tiny.toml: build.system.1: library -lkiln_no_such_lib not found on this "
        "machine: install it (apt-get install libkiln-nolib-dev)",
    ]
    assert _provisioned(cache) == []


def test_a_system_header_that_is_there_passes(tmp_path: Path, tiny: tuple[str, Path]) -> None:
    commit, mirrors = tiny
    here = {"header": "stdio.h", "package": "libc6-dev"}
    ws = write(tmp_path / "ws", {"tiny": tiny_vendor(commit, system=[here])}, profile=FAULT_PROFILE)
    res = run_kiln(*tiny_build_args(ws, tmp_path, mirrors, "--offline", "--dry-run"))
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    assert "preflight: passed" in res.stdout
    assert "stdio.h" not in res.stdout + res.stderr


def test_headers_nvidias_wheels_may_provide_wait_for_them(
    tmp_path: Path, tiny: tuple[str, Path], build_python: Path
) -> None:
    """nccl.h is on no system include path here, but in the build venv's nvidia/nccl
    (torch's NCCL wheel): checked after provisioning, against those folders, it passes;
    an NVIDIA-named header that no wheel has is still named, with its package."""
    commit, mirrors = tiny
    needs = [
        {"header": "nccl.h", "package": "libnccl-dev"},
        {"header": "nvshmem_kiln_absent.h", "package": "libnvshmem-kiln-dev"},
    ]
    profile = {**FAULT_PROFILE, "torch": PROFILE["torch"]}  # the system CUDA 13.0, cu130 torch
    ws = write(tmp_path / "ws", {"tiny": tiny_vendor(commit, system=needs)}, profile=profile)
    args = tiny_build_args(ws, tmp_path, mirrors, "--offline", "--dry-run")
    args[args.index(sys.executable)] = str(build_python)
    res = run_kiln(*args)
    assert res.returncode == 9, res.stderr[-3000:] + res.stdout[-3000:]
    problems = [ln for ln in res.stdout.splitlines() if ln.startswith("  - ")]
    assert problems == [
        "  - vendors/tiny.toml: build.system.1: header <nvshmem_kiln_absent.h> not found on "
        "this machine: install it (apt-get install libnvshmem-kiln-dev)"
    ], res.stdout


@pytest.mark.parametrize(
    ("header", "deferred"),
    [
        ("nccl.h", True),
        ("nvshmemx.h", True),
        ("cuda_runtime.h", True),
        ("cudnn_version.h", True),
        ("cublasLt.h", True),
        ("cuda/std/atomic", True),
        ("cub/cub.cuh", True),
        ("thrust/device_vector.h", True),
        ("nvtx3/nvToolsExt.h", True),
        ("infiniband/mlx5dv.h", False),
        ("numa.h", False),
        ("stdio.h", False),
        ("kiln_no_such/absent.h", False),
    ],
)
def test_the_deferral_rule(header: str, deferred: bool) -> None:
    assert pip_cuda_may_provide(SystemRequirement(header=header, package="x")) is deferred
    assert not pip_cuda_may_provide(SystemRequirement(library="nccl", package="libnccl-dev"))


def test_a_failed_preflight_leaves_the_artifacts_folder_as_it_was(
    tmp_path: Path, tiny: tuple[str, Path]
) -> None:
    """Issue 41: a refused build left ``logs/.kiln.sources.lock`` and the inputs' snapshot
    (``.inputs/patches/series.toml``) behind. Refused before any step, nothing stays: not
    in a folder it made, and not in one that held an earlier release's files."""
    ws, mirrors, cache = _gone_patch_workspace(tmp_path, tiny, [ABSENT])
    res, _took = _unprovisioned_build(ws, tmp_path, mirrors, cache)
    assert res.returncode == 9, res.stderr[-3000:]
    assert not (tmp_path / "artifacts").exists()  # it made it: gone again

    kept = tmp_path / "artifacts" / "logs" / "earlier.log"
    kept.parent.mkdir(parents=True)
    kept.write_text("an earlier run's log\n")
    (tmp_path / "artifacts" / "other-release").mkdir()
    before = sorted(str(p) for p in (tmp_path / "artifacts").rglob("*"))
    res, _took = _unprovisioned_build(ws, tmp_path, mirrors, cache)
    assert res.returncode == 9, res.stderr[-3000:]
    assert sorted(str(p) for p in (tmp_path / "artifacts").rglob("*")) == before
