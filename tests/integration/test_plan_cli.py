"""``kiln build --dry-run``: the plan without the build (fetches, cache hits and why,
MAX_JOBS and memory, CPU slots under affinity and a real cgroup quota), and the
``kiln_commit`` a real build records. The tiny upstream builds in seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiln import source_commit
from tests import require
from tests.conftest import REPO, artifacts_files, run_kiln
from tests.faults.conftest import make_tiny, mirrors_file, tiny_build_args, tiny_workspace
from tests.releases import manifest_json


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path, str]:
    up = tmp_path / "up"
    commit = make_tiny(up)
    ws = tiny_workspace(tmp_path / "ws", commit)
    return ws, mirrors_file(up / "mirrors.toml", f"{up}/"), commit


def _plan(ws: Path, tmp: Path, mirrors: Path, *extra: str) -> dict:
    res = run_kiln(*tiny_build_args(ws, tmp, mirrors, "--offline", "--dry-run", "--json", *extra))
    assert res.returncode == 0, res.stderr[-3000:]
    plan: dict[str, Any] = json.loads(res.stdout)
    return plan


def test_dry_run_says_what_would_be_fetched_then_that_the_build_is_a_hit(
    tmp_path: Path, tiny: tuple[Path, Path, str]
) -> None:
    ws, mirrors, commit = tiny
    before = _plan(ws, tmp_path, mirrors)
    (vendor,) = before["vendors"]
    assert vendor["name"] == "tiny" and vendor["commit"] is None
    assert len(vendor["fetch"]) == 1 and commit in vendor["fetch"][0]
    assert vendor["cache"] == "unknown" and "not fetched" in vendor["why"]
    assert vendor["schedule"]["units_from"] == "unknown" and before["problems"] == []
    # nothing to count yet: what the slots allow, as the build would offer (issue 35)
    assert vendor["schedule"]["max_jobs"] == before["budget"]["cpus"]
    assert before["budget"]["cpus"] >= 1 and before["budget"]["cpus_from"]
    assert artifacts_files(tmp_path / "artifacts") == []
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").rglob("*.so"))

    summary = tmp_path / "step-summary.md"
    built = run_kiln(
        *tiny_build_args(ws, tmp_path, mirrors, "--offline"),
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "### kiln build summary" in summary.read_text()
    assert "| tiny | local |" in summary.read_text(), summary.read_text()
    manifest = manifest_json(tmp_path / "artifacts" / "test-release")
    assert manifest["kiln_commit"] == source_commit() and manifest["kiln_commit"]

    after = _plan(ws, tmp_path, mirrors)
    (vendor,) = after["vendors"]
    assert vendor["commit"] == commit and vendor["fetch"] == []
    assert vendor["cache"] == "hit", vendor
    # fetched, its work tree elsewhere (another --work): its units counted in the pinned
    # commit, and the figures are the build's own
    elsewhere = _plan(ws, tmp_path, mirrors, "--work", str(tmp_path / "other-work"))
    (vendor,) = elsewhere["vendors"]
    built = manifest["vendors"]["tiny"]["schedule"]
    assert vendor["schedule"]["units_from"] == "the pinned commit", vendor
    assert vendor["schedule"]["translation_units"] == built["translation_units"]
    assert vendor["schedule"]["max_jobs"] == built["max_jobs"]

    text = run_kiln(*tiny_build_args(ws, tmp_path, mirrors, "--offline", "--dry-run"))
    assert text.returncode == 0, text.stderr[-2000:]
    assert f"tiny @ {commit[:12]}: artifact cache hit" in text.stdout
    assert "nothing to fetch" in text.stdout and "MAX_JOBS" in text.stdout

    (ws / "vendors" / "tiny.toml").write_text(
        (ws / "vendors" / "tiny.toml").read_text().replace("[build]", '[build]\nenv = {X = "1"}')
    )
    changed = _plan(ws, tmp_path, mirrors)
    (vendor,) = changed["vendors"]
    assert vendor["cache"] == "miss" and "changed since entry" in vendor["why"], vendor


def test_dry_run_with_a_preflight_problem_exits_9(
    tmp_path: Path, tiny: tuple[Path, Path, str]
) -> None:
    ws, mirrors, _commit = tiny
    with open(ws / "vendors" / "tiny.toml", "a") as fh:
        fh.write(
            '\n[[build.system]]\nheader = "kiln-no-such-header/really.h"\npackage = "libnope-dev"\n'
        )
    res = run_kiln(*tiny_build_args(ws, tmp_path, mirrors, "--offline", "--dry-run"))
    assert res.returncode == 9, res.stderr[-2000:]
    assert "kiln-no-such-header/really.h" in res.stdout and "libnope-dev" in res.stdout


def _slots_under(prefix: list[str], ws: Path, tmp: Path, mirrors: Path) -> dict:
    args = tiny_build_args(ws, tmp, mirrors, "--offline", "--dry-run", "--json")
    res = subprocess.run(
        [*prefix, sys.executable, "-m", "kiln", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    budget: dict[str, Any] = json.loads(res.stdout)["budget"]
    return budget


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin to one")
def test_cpu_slots_follow_the_affinity_mask(tmp_path: Path, tiny: tuple[Path, Path, str]) -> None:
    ws, mirrors, _commit = tiny
    assert shutil.which("taskset"), "taskset (util-linux) is missing"
    budget = _slots_under(["taskset", "-c", "0"], ws, tmp_path, mirrors)
    assert budget["cpus"] == 1 and budget["cpus_from"] == "affinity", budget


def _cgroup_with_one_cpu(tmp_path: Path) -> Path | None:
    """A real cgroup limited to one CPU (v2 cpu.max or v1 cfs quota), or None."""
    name = f"kiln-test-{os.getpid()}-{tmp_path.name}"
    for root, files in (
        (Path("/sys/fs/cgroup"), {"cpu.max": "100000 100000"}),
        (Path("/sys/fs/cgroup/cpu"), {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}),
    ):
        if not (root / "cgroup.procs").exists():
            continue
        if "cpu.max" in files and not (root / "cgroup.controllers").exists():
            continue
        group = root / name
        try:
            group.mkdir()
            for f, value in files.items():
                (group / f).write_text(value)
            return group
        except OSError:
            if group.exists():
                group.rmdir()
    return None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to cap to one")
def test_cpu_slots_follow_a_real_cgroup_quota(tmp_path: Path, tiny: tuple[Path, Path, str]) -> None:
    ws, mirrors, _commit = tiny
    group = _cgroup_with_one_cpu(tmp_path)
    if group is None:
        require.missing("CGROUP", "no writable cgroup cpu controller (v1 or v2) here")
    try:
        enter = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh"]
        budget = _slots_under(enter, ws, tmp_path, mirrors)
        assert budget["cpus"] == 1 and budget["cpus_from"].startswith("cgroup"), budget
    finally:
        group.rmdir()
