"""``kiln build --dry-run`` is dry and honest: on an empty cache it provisions, fetches,
clones and writes nothing (the cache, work/, artifacts/, the workspace, the bundles are
the same files before and after), says in seconds what a build would provision first
(where, about how large) and what it would fetch, and makes every refusal the build
would make, in the build's own words and with its exit code (the memory budget,
preflight's system needs, another build holding artifacts/). Nothing here compiles."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kiln.config.workspace import Workspace
from kiln.errors import Busy, ConfigError, PreflightError, ToolchainError
from kiln.orchestrate import runlock
from kiln.sources.git import git
from kiln.toolchain import buildenv, cudapypi
from tests import public
from tests.conftest import BEFORE_ANY_COMPILE_S, build_args, run_kiln
from tests.faults.conftest import (
    ABSENT,
    FAULT_PROFILE,
    error_lines,
    make_tiny,
    mirrors_file,
    tiny_build_args,
    tiny_vendor,
)
from tests.upstreams import BASE_URL
from tests.workspace import PROFILE, write


def snapshot(*roots: Path) -> dict[str, tuple[str, int, int]]:
    """Every file, link and folder under ``roots``: kind, size, mtime (a folder's mtime
    changes when anything is made in it, even if removed again)."""
    seen = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            st = path.lstat()
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            seen[str(path)] = (kind, st.st_size if kind == "file" else 0, st.st_mtime_ns)
    return seen


def _folders(tmp: Path) -> tuple[Path, Path, Path]:
    folders = (tmp / "cache", tmp / "work", tmp / "artifacts")
    for f in folders:
        f.mkdir()
    return folders


def _kiln_errors(text: str) -> list[str]:
    """The error block as kiln prints it: its ``kiln: error:`` line and the problems."""
    lines = text.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("kiln: error:"))
    return [lines[first], *[ln for ln in lines[first + 1 :] if ln.startswith("  - ")]]


def test_a_dry_run_on_an_empty_cache_writes_nothing_and_refuses_as_the_build(
    tmp_path: Path,
) -> None:
    bundles = public.require_bundles()
    ws = public.copy_workspace(tmp_path / "ws")
    cache, work, _artifacts = _folders(tmp_path)
    args = build_args(ws, tmp_path, "--bundles", bundles, "--profile", "cu132", toolchain="pypi")
    env = {buildenv.ENV_VAR: ""}  # no build Python from the environment: one to provision
    before = snapshot(tmp_path, bundles)
    started = time.monotonic()
    res = run_kiln(*args, "--dry-run", env=env)
    tight = run_kiln(*args, "--dry-run", "--mem-budget", "0.5", env=env)
    took = time.monotonic() - started
    assert snapshot(tmp_path, bundles) == before
    assert took < BEFORE_ANY_COMPILE_S, took  # nothing made: no venv, no CUDA, no compile
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    out = res.stdout.splitlines()

    # What a build provisions first: where, about how large (nothing of it is there).
    profile = Workspace(ws, "cu132").profile
    venv = buildenv.env_dir(profile, cache)
    cuda = cudapypi.root_dir("13.2", cache)
    mirrors = work / "mirrors-from-bundles"
    assert "would provision first (a dry run makes nothing):" in out
    for where in (venv, cuda, mirrors):
        line = next((ln for ln in out if f" at {where}: about " in ln), None)
        assert line is not None and " GiB (" in line, (where, res.stdout)
    assert not any(ln.startswith("reuses ") for ln in out)
    # What it would fetch: each pinned commit from its bundle, into a new bare clone.
    fetches = [ln for ln in out if ln.startswith("  would fetch ")]
    assert len(fetches) == 3 and all(f"into a new bare clone {cache}/git/" in f for f in fetches)
    assert all("a head of it" in f for f in fetches), fetches
    # Preflight cannot pass what only provisioning tells: it says so instead.
    assert "preflight: passed" not in res.stdout
    assert "preflight: no problem found so far; checked only once provisioned:" in out

    # A budget the build refuses: the dry run's exit code and words are the build's.
    assert tight.returncode == ConfigError.exit_code == 2, tight.stdout[-3000:]
    real = run_kiln(*args, "--mem-budget", "0.5", env=env)
    assert real.returncode == 2, real.stderr[-3000:]
    (said,) = error_lines(real.stderr)
    assert "more than the memory budget of 0.5 GiB (--mem-budget)" in said
    assert said in tight.stdout.splitlines()
    assert "exit code: 2 (the build's: it stops at budget)" in tight.stdout


def test_a_missing_system_header_exits_with_preflights_code_and_words(tmp_path: Path) -> None:
    """The tests' profile (torch, CUDA 13.2 from PyPI) on an empty cache: the header is
    checked before anything would be provisioned, by the dry run as by the build."""
    up = tmp_path / "up"
    commit = make_tiny(up)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    ws = write(tmp_path / "ws", {"tiny": tiny_vendor(commit, system=[ABSENT])}, profile=PROFILE)
    _folders(tmp_path)
    args = build_args(ws, tmp_path, mirrors=mirrors, toolchain="pypi")
    # No build Python from the environment, and pip pointed at nothing: a build that
    # provisioned before its checks would fail in seconds instead of installing 5 GB.
    (tmp_path / "no-wheels").mkdir()
    env = {buildenv.ENV_VAR: "", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels")}
    before = snapshot(tmp_path)
    dry = run_kiln(*args, "--dry-run", env=env)
    assert snapshot(tmp_path) == before
    assert dry.returncode == PreflightError.exit_code == 9, dry.stderr[-3000:] + dry.stdout
    real = run_kiln(*args, env=env)
    assert real.returncode == 9, real.stderr[-3000:]
    assert _kiln_errors(dry.stdout) == _kiln_errors(real.stderr)
    assert "kiln_no_such/absent.h" in _kiln_errors(dry.stdout)[1]


def test_another_build_holding_artifacts_is_the_builds_refusal(tmp_path: Path) -> None:
    """The dry run only reads the lock file (taking the lock, even for a moment, could
    make a build starting then refuse)."""
    up = tmp_path / "up"
    commit = make_tiny(up)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    ws = write(tmp_path / "ws", {"tiny": tiny_vendor(commit)}, profile=FAULT_PROFILE)
    args = tiny_build_args(ws, tmp_path, mirrors, "--offline")
    free = run_kiln(*args, "--dry-run")
    assert free.returncode == 0, free.stderr[-3000:] + free.stdout
    assert "preflight: passed" in free.stdout
    (tmp_path / "artifacts" / "logs").mkdir(parents=True)
    with runlock.hold([tmp_path / "artifacts"]):
        dry = run_kiln(*args, "--dry-run")
        real = run_kiln(*args)
    assert dry.returncode == real.returncode == Busy.exit_code == 15, dry.stdout + real.stderr
    (said,) = error_lines(real.stderr)
    assert f"pid {os.getpid()}" in said and said in dry.stdout.splitlines()


def test_bundles_are_read_by_the_dry_run_and_unbundled_by_the_build(tmp_path: Path) -> None:
    """``--bundles``: the dry run reads the bundle's heads where it is; the build makes
    it a mirror in its inputs stage (in the work folder) and builds through it."""
    up = tmp_path / "up"
    commit = make_tiny(up)
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    git("bundle", "create", bundles / "tiny.bundle", "--all", cwd=up / "tiny.git")
    ws = write(tmp_path / "ws", {"tiny": tiny_vendor(commit)}, profile=FAULT_PROFILE)
    (ws / "bundles.toml").write_text(f'[bundles]\n"{BASE_URL}tiny.git" = "tiny.bundle"\n')
    _cache, work, _artifacts = _folders(tmp_path)
    args = build_args(ws, tmp_path, "--bundles", bundles, python=sys.executable)
    before = snapshot(tmp_path)
    dry = run_kiln(*args, "--dry-run")
    assert snapshot(tmp_path) == before
    assert dry.returncode == 0, dry.stderr[-3000:] + dry.stdout
    assert f"(from bundle {bundles / 'tiny.bundle'}, unbundled first; a head of it)" in dry.stdout
    assert f"the mirrors of 1 git bundles at {work / 'mirrors-from-bundles'}: about " in dry.stdout
    real = run_kiln(*args)
    assert real.returncode == 0, real.stderr[-3000:]
    assert (work / "mirrors-from-bundles" / "tiny.git" / "HEAD").is_file()
    again = run_kiln(*args, "--dry-run")
    assert f"reuses the mirrors of 1 git bundles at {work / 'mirrors-from-bundles'}" in again.stdout
    assert "artifact cache hit" in again.stdout, again.stdout


def test_a_venv_that_cannot_be_made_is_the_builds_refusal(tmp_path: Path) -> None:
    """No Python of the profile's version to make the build venv from: the build stops
    when it would provision (ToolchainError, 5); the dry run says so, in its words."""
    up = tmp_path / "up"
    commit = make_tiny(up)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    profile = {**FAULT_PROFILE, "python": "3.99"}
    ws = write(tmp_path / "ws", {"tiny": tiny_vendor(commit)}, profile=profile)
    args = [a for a in tiny_build_args(ws, tmp_path, mirrors, "--offline") if a != sys.executable]
    args.remove("--python")
    env = {buildenv.ENV_VAR: ""}
    dry = run_kiln(*args, "--dry-run", env=env)
    real = run_kiln(*args, env=env)
    assert dry.returncode == real.returncode == ToolchainError.exit_code == 5, real.stderr
    (said,) = error_lines(real.stderr)
    assert "python3.99 not found on PATH" in said and said in dry.stdout.splitlines()
