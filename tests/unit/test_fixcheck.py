"""A fix that changes the build environment is resolved (dry, real pip) before it is
printed (issue 35, item 1): against a local index of metadata-only wheels standing in for
PyPI's torch and NCCL (the real index is not the test's to depend on)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from kiln.config.models import Profile
from kiln.orchestrate import fixcheck

RESOLVE = {
    "pinner": "torch",
    "pinner_version": "2.14.1",
    "dist": "nvidia-nccl-cu13",
    "above": "2.30.7",
}


def _wheel(
    folder: Path, name: str, version: str, requires: list[str], tag: str = "py3-none-any"
) -> None:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        f"Tag: {tag}\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{k},,\n" for k in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{dist}-{version}-{tag}.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The profile's index: a folder, pip's own configuration (this machine's constraint
    file and find-links) left out."""
    folder = tmp_path / "index"
    folder.mkdir()
    _wheel(folder, "torch", "2.14.1", ["nvidia-nccl-cu13==2.30.7"])
    _wheel(folder, "nvidia-nccl-cu13", "2.30.7", [])
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return folder


PROFILE = Profile(cuda="13.2", python="3.12", torch="2.14.1", archs=["sm_100a"])


def test_a_newer_torch_that_pins_a_newer_nccl_is_named_with_its_version(index: Path) -> None:
    _wheel(index, "torch", "2.15.0", ["nvidia-nccl-cu13==2.31.2"])
    _wheel(index, "nvidia-nccl-cu13", "2.31.2", [])
    said = fixcheck.check(RESOLVE, PROFILE, offline=False)
    assert said == (
        "torch 2.15.0 pins nvidia-nccl-cu13 2.31.2 (a dry resolve of torch>2.14.1 with "
        "nvidia-nccl-cu13>2.30.7 on the profile's index): set the profile's torch to 2.15.0"
    )


def test_no_torch_pins_a_newer_nccl_is_said_not_advised(index: Path) -> None:
    # a newer torch that still pins the old NCCL: the resolve is impossible
    _wheel(index, "torch", "2.15.0", ["nvidia-nccl-cu13==2.30.7"])
    _wheel(index, "nvidia-nccl-cu13", "2.31.2", [])
    said = fixcheck.check(RESOLVE, PROFILE, offline=False)
    assert said.startswith("no torch on the profile's index pins a newer nvidia-nccl-cu13"), said


def test_offline_gives_the_command_that_would_resolve_it(index: Path) -> None:
    said = fixcheck.check(RESOLVE, PROFILE, offline=True)
    assert said == (
        "not resolved (--offline); to find one: "
        "pip install --dry-run 'torch>2.14.1' 'nvidia-nccl-cu13>2.30.7'"
    )


def test_an_index_that_does_not_answer_is_not_read_as_no_torch(
    index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens
    monkeypatch.setenv("PIP_RETRIES", "0")
    said = fixcheck.check(RESOLVE, PROFILE, offline=False)
    assert said.startswith(
        "not resolved (the index pip reached lists no torch); to find one: pip"
    ), said


def test_a_module_setup_py_imports_is_checked_to_be_a_distribution_before_it_is_advised(
    index: Path, tmp_path: Path
) -> None:
    """Issue 41: setup.py imported a module that is no distribution and the screen said
    "pin it in build_tools". On the index: the version to pin; not on it: the fix is
    replaced by what the module is (the upstream's own or another project's); and a
    module the tree holds is named where it lies, with no build_tools advice at all."""
    from kiln.inside import diagnose

    _wheel(index, "pybind11", "3.0.1", [])
    found = {"kind": "distribution", "dist": "pybind11", "module": "pybind11"}
    assert fixcheck.check(found, PROFILE, offline=False) == (
        'the profile\'s index has pybind11 3.0.1: "pybind11==3.0.1"'
    )
    absent = {"kind": "distribution", "dist": "kiln_gen", "module": "kiln_gen"}
    said = fixcheck.check(absent, PROFILE, offline=False)
    assert said.startswith(fixcheck.INSTEAD + "no distribution named kiln_gen is on the")
    offline = fixcheck.check(absent, PROFILE, offline=True)
    assert offline.endswith("to check: pip install --dry-run kiln_gen")

    tree = tmp_path / "tree"
    (tree / "tools" / "kiln_gen").mkdir(parents=True)
    (tree / "tools" / "kiln_gen" / "__init__.py").write_text("")
    (tree / "setup.py").write_text("import kiln_gen\n")
    output = (
        'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'kiln_gen'\n"
    )
    d = diagnose.diagnose(output, tree, {}, "v")
    assert d.cause is not None and d.cause.row == "setup-import"
    assert "a module of the upstream's own tree (tools/kiln_gen/__init__.py)" in d.cause.cause
    assert "build_tools" not in d.cause.fix.replace("no build_tools entry", "")
    assert d.cause.resolve is None
    (tree / "tools" / "kiln_gen" / "__init__.py").unlink()
    d = diagnose.diagnose(output, tree, {}, "v")
    assert d.cause is not None and d.cause.resolve == absent


def test_a_resolved_sentence_that_says_instead_replaces_the_fix(tmp_path: Path) -> None:
    import json

    from kiln.errors import BuildError
    from kiln.orchestrate import failure

    record = {
        "vendor": "v",
        "errors": [{"text": "ModuleNotFoundError: No module named 'kiln_gen'"}],
        "cause": {
            "row": "setup-import",
            "cause": "setup.py:1 imports kiln_gen",
            "fix": 'add "kiln_gen==VERSION" to the profile\'s build_tools',
            "resolve": {"kind": "distribution", "dist": "kiln_gen"},
        },
    }
    failure.record_path(tmp_path, "v").write_text(json.dumps(record))
    explained = failure.explain(
        BuildError("failed"),
        "v",
        tmp_path,
        tmp_path / "v-build.log",
        lambda resolve: fixcheck.INSTEAD + "no distribution named kiln_gen is on the index",
    )
    assert "  fix: no distribution named kiln_gen is on the index" in str(explained)
    assert "build_tools" not in str(explained)


def test_only_a_resolved_pin_makes_the_setup_import_fix_an_edit() -> None:
    found = {"kind": "distribution", "dist": "pybind11", "module": "pybind11"}
    edit = fixcheck.build_tools_edit(
        found, 'the profile\'s index has pybind11 3.0.1: "pybind11==3.0.1"', "v"
    )
    assert edit == {
        "file": "vendors/v.toml",
        "keys": ["build", "build_tools"],
        "append": ["pybind11==3.0.1"],
    }
    offline = fixcheck.distribution(found, PROFILE, offline=True)
    assert fixcheck.build_tools_edit(found, offline, "v") is None
    nccl = {"kind": "pin", "pinner": "torch", "dist": "nvidia-nccl-cu13"}
    assert fixcheck.build_tools_edit(nccl, 'the profile\'s index has x 1: "x==1"', "v") is None
