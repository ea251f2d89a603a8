"""An upstream's ``[build-system] requires`` against the build venv (issue 40): a pin the
non-isolated build would break, or a requirement it lacks, is named before any compile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tomlkit

from kiln.verbs import add as kiln_add
from kiln.verbs.add import recipe, scan
from kiln.verify import buildsystem
from tests.unit.test_fixcheck import PROFILE, _wheel

PYPROJECT = """\
[build-system]
requires = ["setuptools<75", "wheel", "torch>=2.10", "pybind11>=2.12",
            "tomli; python_version < '3.0'"]
build-backend = "setuptools.build_meta"
"""


def test_pins_the_build_venv_breaks_and_what_it_lacks_are_named(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    venv = {"setuptools": "80.9.0", "wheel": "0.45.1", "torch": "2.14.1+cu130"}
    assert buildsystem.problems(tmp_path, venv) == [
        "setuptools<75 (the build venv has setuptools 80.9.0)",
        "pybind11>=2.12 (the build venv has no pybind11)",
    ]
    said = buildsystem.refusal("v", buildsystem.problems(tmp_path, venv))
    assert said.startswith("v: the upstream's pyproject.toml [build-system] requires setuptools<75")
    assert "or the profile's build_tools (kiln.toml)" in said
    venv |= {"setuptools": "74.1.3", "pybind11": "3.0.1"}
    assert buildsystem.problems(tmp_path, venv) == []


def test_a_tree_without_a_build_system_has_nothing_to_hold(tmp_path: Path) -> None:
    assert buildsystem.problems(tmp_path, {}) == []
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert buildsystem.problems(tmp_path, {}) == []
    (tmp_path / "pyproject.toml").write_text("not toml [")
    assert buildsystem.problems(tmp_path, {}) == []


def test_add_pins_the_build_systems_requires_with_their_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 (1): a scikit-build-core project's ``[build-system] requires`` the build
    venv does not meet are resolved on the profile's index into the vendor's build_tools
    with their dependencies (scikit-build-core's pathspec: left out, the build died with
    ``No module named 'pathspec'``); what the build venv already holds at the resolved
    version is not pinned again. --offline keeps the sentence asking for them by hand."""
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "skbuild-core", "0.11.6", ["pathspec>=0.10.1", "packaging>=21.3"])
    # a wheel of an older manylinux alone (as swig's): pip, told manylinux_2_28 alone,
    # did not take it ("from versions: none"), and the draft said "set by hand"
    _wheel(index, "pathspec", "0.12.1", [], tag="py3-none-manylinux_2_12_x86_64")
    _wheel(index, "packaging", "25.0", [])
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["skbuild-core>=0.10", "packaging"]\n'
        'build-backend = "scikit_build_core.build"\n'
    )
    found = scan.Findings("https://x.invalid/x.git", "0" * 40, scan.Backend("pep517", "x"))
    found.build_venv = {"packaging": "25.0", "setuptools": "80.9.0"}
    found.build_requires = buildsystem.problems(tree, found.build_venv)
    found.build_system_unmet = buildsystem.unmet(tree, found.build_venv)
    assert found.build_system_unmet == ["skbuild-core>=0.10"]
    assert kiln_add._pins(found, PROFILE, offline=True) == {}
    found.pins = kiln_add._pins(found, PROFILE, offline=False)
    assert found.pins == {"skbuild-core": "0.11.6", "pathspec": "0.12.1"}
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._build_tools(table, found, decided)
    recipe._build_system(table, found)
    assert decided["build_tools"] == ["pathspec==0.12.1", "skbuild-core==0.11.6"]
    said = " ".join(tomlkit.dumps(table).replace("#", " ").split())
    assert "resolved on the profile's index with their dependencies" in said
    assert "set by hand" not in said
    found.pins = {}  # not resolved (--offline): the sentence asks for them, no key
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._build_tools(table, found, decided)
    recipe._build_system(table, found)
    assert "build_tools" not in decided
    assert "set by hand" in " ".join(tomlkit.dumps(table).replace("#", " ").split())


def test_a_build_tool_without_its_dependency_is_refused_with_the_pin_to_add(
    tmp_path: Path,
) -> None:
    """Build tools are installed without their dependencies (each pinned, as a lock): a
    dependency left out is named before the compile with the pin to add, and met (by the
    tools or the build venv) it is not (the check can fail)."""
    tools = tmp_path / "tools"
    info = tools / "skbuild_core-0.11.6.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: skbuild-core\nVersion: 0.11.6\n"
        "Requires-Dist: pathspec>=0.10.1\nRequires-Dist: packaging>=21.3\n"
        'Requires-Dist: tomli; python_version < "3.0"\n'
    )
    found = buildsystem.tools_unmet(tools, {"packaging": "25.0"})
    assert found == ["skbuild-core 0.11.6 needs pathspec>=0.10.1 (no pathspec)"]
    said = buildsystem.tools_refusal("v", found)
    assert said.startswith("v: build.build_tools are installed without their dependencies")
    assert "pin each missing dependency in build.build_tools of vendors/v.toml" in said
    assert buildsystem.tools_unmet(tools, {"packaging": "25.0", "pathspec": "0.12.1"}) == []
    old = buildsystem.tools_unmet(tools, {"packaging": "20.0", "pathspec": "0.12.1"})
    assert old == ["skbuild-core 0.11.6 needs packaging>=21.3 (the build has packaging 20.0)"]


def test_what_scikit_build_cores_metadata_provider_needs_is_required(tmp_path: Path) -> None:
    """dfm/extending-jax's shape: its version from setuptools-scm through scikit-build-core's
    metadata provider, which its ``requires`` do not list (the backend's
    get_requires_for_build_wheel adds it; kiln calls no such hook): required all the same,
    so add pins it (the build died with ``No module named 'setuptools_scm'``)."""
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["pybind11>=2.6", "scikit-build-core>=0.5"]\n'
        'build-backend = "scikit_build_core.build"\n\n[tool.scikit-build]\n'
        'metadata.version.provider = "scikit_build_core.metadata.setuptools_scm"\n'
    )
    venv = {"pybind11": "3.0.1", "scikit-build-core": "0.11.6"}
    assert buildsystem.unmet(tmp_path, venv) == ["setuptools-scm"]
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["scikit-build-core", "setuptools_scm>=8"]\n'
        "[tool.scikit-build.metadata.version]\n"
        'provider = "scikit_build_core.metadata.setuptools_scm"\n'
    )
    assert buildsystem.declared(tmp_path) == ["scikit-build-core", "setuptools_scm>=8"]
