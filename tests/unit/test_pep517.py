"""Which backend a wheel step calls, and the call itself on a real setuptools project."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from kiln.inside import pep517


def test_a_tree_without_pyproject_gets_setuptools_legacy_backend(tmp_path: Path) -> None:
    assert pep517.backend_of(tmp_path) == (pep517.LEGACY_BACKEND, [])


def test_pyproject_without_build_system_gets_the_legacy_backend_too(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 140\n")
    assert pep517.backend_of(tmp_path) == (pep517.LEGACY_BACKEND, [])


def test_the_named_backend_and_its_path_are_used(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend:hooks"\nbackend-path = ["b"]\n'
    )
    assert pep517.backend_of(tmp_path) == ("backend:hooks", ["b"])
    argv = pep517.command("python3", tmp_path, tmp_path / "out")
    assert argv is not None and argv[-3:] == ["backend:hooks", str(tmp_path / "out"), "b"]


def test_an_unreadable_pyproject_falls_back_to_pip(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[build-system\n")
    assert pep517.backend_of(tmp_path) is None
    assert pep517.command("python3", tmp_path, tmp_path / "out") is None


def test_the_hook_builds_an_in_tree_backends_wheel_once(tmp_path: Path) -> None:
    """An in-tree backend (``backend-path``) that counts its calls: one build_wheel and
    no metadata hook, where pip would call prepare_metadata_for_build_wheel first."""
    tree = tmp_path / "tree"
    (tree / "b").mkdir(parents=True)
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "counting"\nbackend-path = ["b"]\n'
    )
    (tree / "b" / "counting.py").write_text(
        "import os, zipfile\n"
        "def _log(name):\n"
        "    with open('calls.log', 'a') as fh: fh.write(name + '\\n')\n"
        "def prepare_metadata_for_build_wheel(d, config_settings=None):\n"
        "    _log('metadata'); raise SystemExit('not to be called')\n"
        "def build_wheel(d, config_settings=None, metadata_directory=None):\n"
        "    _log('build_wheel')\n"
        "    name = 'demo-1.0-py3-none-any.whl'\n"
        "    with zipfile.ZipFile(os.path.join(d, name), 'w') as z: z.writestr('demo.py', '')\n"
        "    return name\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    argv = pep517.command(sys.executable, tree, out)
    assert argv is not None
    res = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "kiln: built demo-1.0-py3-none-any.whl" in res.stdout
    assert (tree / "calls.log").read_text() == "build_wheel\n"
    assert zipfile.ZipFile(out / "demo-1.0-py3-none-any.whl").namelist() == ["demo.py"]
