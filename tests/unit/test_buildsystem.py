"""An upstream's ``[build-system] requires`` against the build venv (issue 40): a pin the
non-isolated build would break, or a requirement it lacks, is named before any compile."""

from __future__ import annotations

from pathlib import Path

from kiln.verify import buildsystem

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
