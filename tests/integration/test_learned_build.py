"""What a build learned travels (issue 24): a build in other folders, with an empty cache,
started from another build's manifest, is scheduled as that build's next one would be:
its largest unit first, each unit's learned memory instead of the recipe's; the bound
(critical path, CPU floor) in its summary and manifest.

The fixture upstream is ninja's own kind of build (a build.ninja of four C units, one of
them heavy, then a link): compiles of a second each, no CUDA."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kiln.errors import ConfigError
from kiln.orchestrate import stages
from kiln.plan import jobs, schedule
from kiln.release import manifest
from kiln.sources.gitrepo import CommitSpec, make_repo
from tests import ninjafix as ninjafix_tree
from tests.conftest import build_args, run_kiln, shared_cache
from tests.upstreams import BASE_URL
from tests.workspace import write


@pytest.fixture
def ninjafix(tmp_path: Path) -> tuple[Path, str]:
    """A git repository of the fixture upstream and a mirrors file naming it."""
    root = tmp_path / "upstreams"
    big = ninjafix_tree.heavy(60)
    tree = ninjafix_tree.files("libninjafix.so", big, "ninjafix", padding=20 * len(big))
    (commit,) = make_repo(root / "ninjafix.git", [CommitSpec("ninjafix", tree)])
    (root / "mirrors.toml").write_text(f'[mirrors]\n"{BASE_URL}" = "{root}/"\n')
    return root / "mirrors.toml", commit


def _workspace(root: Path, commit: str) -> Path:
    # 6 GiB: the recipe's guess, far above what its units use
    vendor = ninjafix_tree.vendor(f"{BASE_URL}ninjafix.git", commit, "libninjafix.so", 6.0)
    return write(root, {"fix": vendor})


def _compiled_in_order(artifacts: Path) -> list[str]:
    stats = jobs.job_stats(artifacts / "logs" / "test-release" / "fix.jobs")
    compiled = [s for s in stats if s.get("result") == "compiled"]
    return [str(s.get("source")) for s in sorted(compiled, key=lambda s: s.get("start", 0.0))]


def test_a_build_from_another_builds_learned_data_starts_like_its_next(
    tmp_path: Path, options, ninjafix: tuple[Path, str], build_python: Path
) -> None:
    mirrors, commit = ninjafix
    ws = _workspace(tmp_path / "ws", commit)
    first = options(
        ws, mirrors=mirrors, jobs=1, mem_budget_gib=8.0, no_compiler_cache=True, save_learned=True
    )
    release = stages.build(first)
    # Nothing learned: the estimate from the code, which src/a.c's long comment misleads
    # (the check below can fail): it reads the most, so it goes first.
    assert _compiled_in_order(first.artifacts) == ["src/a.c", "src/big.c", "src/b.c", "src/c.c"]
    made = manifest.read(release / manifest.FILE_NAME)
    learned = made.vendors["fix"].learned
    assert learned is not None and set(learned.units) == {
        f"src/{n}.c" for n in ("a", "b", "c", "big")
    }
    heaviest = max(learned.units, key=lambda u: learned.units[u].cpu_s)
    assert heaviest == "src/big.c"
    assert json.loads((ws / "learned.json").read_text())["vendors"]["fix"] == learned.data()

    # Another machine's first build: other folders, an empty cache, no learned.json in its
    # workspace, a memory budget the recipe's 6 GiB per job does not fit.
    other = tmp_path / "other"
    ws_b = shutil.copytree(ws, other / "ws", ignore=shutil.ignore_patterns("learned.json"))
    common = build_args(
        ws_b,
        other,
        *("--jobs", "1", "--mem-budget", "3", "--no-compiler-cache"),
        mirrors=mirrors,
        python=build_python,
        toolchain="pypi",
        cache=shared_cache(other / "cache"),
    )
    refused = run_kiln(*common)
    assert refused.returncode == ConfigError.exit_code, refused.stderr
    assert "fix: one compile needs an estimated 6 GiB (recipe)" in refused.stderr

    res = run_kiln(*common, "--learned-from", release / manifest.FILE_NAME)
    assert res.returncode == 0, res.stderr
    assert _compiled_in_order(other / "artifacts")[0] == "src/big.c"  # the largest first
    again = manifest.read(other / "artifacts" / "test-release" / manifest.FILE_NAME)
    sched = again.vendors["fix"].schedule
    assert sched is not None
    assert (sched.estimate_source, sched.max_jobs) == ("learned", 1)  # MAX_JOBS: the 1 slot
    assert sched.mem_per_job_gib == round(learned.peak_job_gib * schedule.LEARNED_MARGIN, 3)
    assert sched.mem_per_job_gib < 3.0 < 6.0
    assert sched.longest_unit == "src/big.c" and (sched.critical_path_s or 0) > 0

    # The bound: in the manifest (its models, hence its schema) and the summary.
    assert again.scheduler is not None and again.scheduler.bound is not None
    b = again.scheduler.bound
    assert b.critical_vendor == "fix" and b.critical_unit == "src/big.c" and b.cpus == 1
    assert b.cpu_floor_s == pytest.approx(sched.compile_cpu_s or 0, abs=0.01)
    assert b.bound_by in ("critical path", "CPU floor") and b.wall_over_bound >= 1.0
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("bound: critical path")]
    assert "fix: src/big.c" in line and "CPU floor" in line and " x the " in line  # one line


def test_a_step_that_fails_after_its_compiles_is_learned_from_by_the_pipeline(
    tmp_path: Path, options, ninjafix: tuple[Path, str], build_python: Path
) -> None:
    """The steps only read the learned store; what a step measured comes back to the
    pipeline with its result, or with its error when it failed after compiling (here: an
    output the recipe names and the build never makes), and the pipeline merges it: the
    fix's build plans from the units' own figures. The error is the step's own."""
    mirrors, commit = ninjafix
    vendor = ninjafix_tree.vendor(f"{BASE_URL}ninjafix.git", commit, "libnever.so", 6.0)
    ws = write(tmp_path / "ws", {"fix": vendor})
    opts = options(ws, mirrors=mirrors, jobs=1, mem_budget_gib=8.0, no_compiler_cache=True)
    with pytest.raises(Exception) as raised:
        stages.build(opts)
    assert "libnever.so" in str(raised.value), raised.value
    assert type(raised.value).__name__ != "StepFailed"
    learned = json.loads((opts.cache / "peaks.json").read_text())["fix"]
    assert set(learned["units"]) == {f"src/{n}.c" for n in ("a", "b", "c", "big")}
