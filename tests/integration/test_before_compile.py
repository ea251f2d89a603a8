"""Nothing learned after the compile that could be known before it, and nothing compiled
twice for a failure that is not the compiler's (issue 40), through ``kiln build`` on the
import proof's real fixture wheels (tests/landing.py: nvcc for sm_100a and sm_103a,
setuptools), offline: the runtime requirement is a fixture wheel of a local wheelhouse
that pip finds through its own PIP_FIND_LINKS, as install.sh's pip would.

- A wheel whose setup.py requires a distribution the consumer environment lacks is
  refused before any compile (its PEP 517 metadata, read in seconds), with the line to
  add; that line written as printed (and ``kiln lock`` run) makes the next build release.
- A wheel that compiled and verified but failed its proof is kept under its build key:
  the proof's printed fix applied, the next build compiles nothing and proves it alone.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest
import tomlkit

from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, ImportFailed
from kiln.verbs.runtime_lock import lock_runtime
from tests import landing
from tests.conftest import artifacts_files, compiled_units
from tests.integration.test_import_proof import PROFILE_NO_TORCH, _build, _record
from tests.integration.test_inplace import DEP, make_wheel
from tests.releases import manifest_json
from tests.workspace import write


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> landing.Landing:
    return landing.make(tmp_path_factory.mktemp("landing"))


def test_a_wheel_requiring_what_the_environment_lacks_is_refused_before_any_compile(
    tmp_path: Path, cases: landing.Landing, build_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse)
    offline_pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    ws = write(
        tmp_path / "ws",
        {"requires-dep": landing.vendor("requires-dep", cases.commits["requires-dep"])},
        profile=PROFILE_NO_TORCH,
    )
    res = _build(tmp_path, ws, cases.mirrors, build_python, env=offline_pip)
    assert res.returncode == ImportFailed.exit_code, res.stderr[-3000:]
    assert compiled_units(tmp_path / "artifacts") == []  # refused before the first compile
    assert artifacts_files(tmp_path / "artifacts") == []
    err = res.stderr
    assert (
        "requires-dep: the wheel's metadata (read before any compile) requires what the "
        "consumer environment (the profile's torch) does not hold:"
    ) in err, err[-3000:]
    assert f"    {DEP}>=1.0 (not installed)" in err
    assert _record(tmp_path, "requires-dep")["cause"]["row"] == "requirements-unmet"
    fix = re.search(r"fix: write runtime-requirements.txt in (\S+) with the line `([^`]+)`", err)
    assert fix, err[-3000:]
    assert Path(fix[1]) == ws and fix[2] == f"{DEP}>=1.0"

    # the fix, as printed: the line, then `kiln lock` (its runtime half: the rest pins
    # vendors from the network)
    (ws / "runtime-requirements.txt").write_text(fix[2] + "\n")
    for key, value in offline_pip.items():
        monkeypatch.setenv(key, value)
    assert lock_runtime(Workspace(ws)) == [
        "runtime requirements: 1 packages pinned by hash in runtime-requirements.lock"
    ]
    res = _build(tmp_path, ws, cases.mirrors, build_python, env=offline_pip)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "requires-dep: the wheel's requirements (kiln_fixture_dep>=1.0) are met where it "
        "lands: checked before the compile"
    ) in res.stderr
    assert "requires-dep: import proof: landing._C, landing imported in " in res.stderr


def test_a_proof_that_failed_after_the_compile_is_fixed_without_compiling_again(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """``needs-gpu`` compiles and verifies, then its GPU module cannot be imported here:
    the wheel is kept under its build key, so once the printed fix (the module listed in
    ``build.import_proof.needs_gpu``) is applied, the next build compiles nothing, proves
    the kept wheel alone and keeps that proof for the build after it."""
    recipe = landing.vendor("needs-gpu", cases.commits["needs-gpu"])
    ws = write(tmp_path / "ws", {"needs-gpu": recipe}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == ImportFailed.exit_code, res.stderr[-3000:]
    assert compiled_units(tmp_path / "artifacts")  # it compiled
    fix = re.search(
        r"fix: .*list it in (build\.import_proof\.needs_gpu) in (vendors/\S+\.toml)", res.stderr
    )
    assert fix, res.stderr[-3000:]
    unit = _record(tmp_path, "needs-gpu")["unit"]
    module = unit.split(".cpython")[0].replace("/", ".")
    assert module == "landing._gpu"

    path = ws / fix[2]
    doc = tomlkit.parse(path.read_text())
    doc["build"]["import_proof"] = {"needs_gpu": [module]}
    path.write_text(tomlkit.dumps(doc))
    logs = tmp_path / "artifacts" / "logs"
    for jobs in logs.rglob("*.jobs"):
        jobs.unlink()
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 0, res.stderr[-3000:]
    assert compiled_units(tmp_path / "artifacts") == []  # the proof alone
    manifest = manifest_json(tmp_path / "artifacts/test-release")
    entry = manifest["vendors"]["needs-gpu"]
    assert entry["caches"]["artifact"]["status"] == "hit"
    assert entry["recipe"]["import_proof"]["needs_gpu"] == ["landing._gpu"]
    (output,) = [o for o in entry["outputs"] if o["kind"] == "wheel"]
    statuses = {m["module"]: m["status"] for m in output["import_proof"]["modules"]}
    assert statuses["landing._gpu"] == "skipped" and statuses["landing._C"] == "ok"

    # kept with its proof: the build after proves nothing again
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "import proof: landing._C" not in res.stderr


def test_a_build_system_pin_the_build_venv_breaks_is_refused_before_any_compile(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """pyproject.toml requires setuptools<75; the build venv has a newer one. Refused
    before the compile, naming both; the printed fix (patch the pin out, where the code
    does not need it) applied as a patch, the next build releases."""
    name = "build-system-pin"
    ws = write(
        tmp_path / "ws", {name: landing.vendor(name, cases.commits[name])}, profile=PROFILE_NO_TORCH
    )
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == ConfigError.exit_code, res.stderr[-3000:]
    assert compiled_units(tmp_path / "artifacts") == []
    assert re.search(
        r"build-system-pin: the upstream's pyproject.toml \[build-system\] requires "
        r"setuptools<75 \(the build venv has setuptools \d+\.[\d.]+\): kiln builds without "
        r"isolation",
        res.stderr,
    ), res.stderr[-3000:]
    assert "or patch the pin where the upstream's code does not need it (patches/)" in res.stderr
    pyproject = landing.CASES[name][1]["pyproject.toml"]
    patch = "".join(
        difflib.unified_diff(
            pyproject.splitlines(keepends=True),
            pyproject.replace('"setuptools<75"', '"setuptools"').splitlines(keepends=True),
            "a/pyproject.toml",
            "b/pyproject.toml",
        )
    )
    (ws / "patches" / "unpin-setuptools.patch").write_text(patch)
    (ws / "patches" / "series.toml").write_text(
        '[[patch]]\nfile = "unpin-setuptools.patch"\ntarget = "build-system-pin"\n'
    )
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 0, res.stderr[-3000:]


def test_a_build_that_failed_after_compiling_still_teaches_the_next_plan(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """``good`` compiles for sm_100a and sm_103a; a recipe that lists sm_100a alone is
    refused by verify after the compile. What its units used is learned all the same
    (issue 40: the next builds planned from the draft's guess), and a fix of the recipe's
    memory guess keeps it."""
    recipe = landing.vendor("good", cases.commits["good"], archs=["sm_100a"])
    ws = write(tmp_path / "ws", {"good": recipe}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode != 0 and "sm_103a" in res.stderr, res.stderr[-3000:]
    assert compiled_units(tmp_path / "artifacts")  # it compiled, then was refused
    peaks = json.loads((tmp_path / "cache" / "peaks.json").read_text())
    assert set(peaks["good"]["units"]) >= {"csrc/module.cpp", "csrc/ops.cpp"}, peaks
    res = _build(tmp_path, ws, cases.mirrors, build_python, "--dry-run")
    assert res.returncode == 0, res.stderr[-2000:]
    said = res.stdout + res.stderr
    assert re.search(r"GiB per compile, its nvcc threads included \(learned\)", said), said[-2000:]


def test_the_printed_skip_of_a_package_that_raises_is_one_round_trip(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """Issue 41: the screen named landing._C; skipping it alone led to a second failure on
    landing, whose __init__.py is what raises. The printed fix names both; pasted into
    [build] as printed (REASON filled in), the next build releases without compiling."""
    recipe = landing.vendor("raises", cases.commits["raises"])
    ws = write(tmp_path / "ws", {"raises": recipe}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == ImportFailed.exit_code, res.stderr[-3000:]
    fix = re.search(
        r"import_proof\.skip = (\{[^}]*\}) in \[build\] of (vendors/\S+\.toml)", res.stderr
    )
    assert fix, res.stderr[-3000:]
    assert "(the code of landing, which importing landing._C runs first)" in res.stderr
    path = ws / fix[2]
    text = path.read_text().replace(
        "[build]\n",
        "[build]\nimport_proof.skip = "
        + fix[1].replace("REASON", "configured for another cluster: raises by design off it")
        + "\n",
        1,
    )
    path.write_text(text)
    for jobs in (tmp_path / "artifacts" / "logs").rglob("*.jobs"):
        jobs.unlink()
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 0, res.stderr[-3000:]
    assert compiled_units(tmp_path / "artifacts") == []
