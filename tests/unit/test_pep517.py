"""Which backend a wheel step calls, and the call itself on a real setuptools project."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
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
    assert argv is not None and argv[-4:] == ["backend:hooks", str(tmp_path / "out"), "", "b"]


def test_an_unreadable_pyproject_falls_back_to_pip(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[build-system\n")
    assert pep517.backend_of(tmp_path) is None
    assert pep517.command("python3", tmp_path, tmp_path / "out") is None


COUNTING = (
    "import os, zipfile\n"
    "def _log(name):\n"
    "    with open('calls.log', 'a') as fh: fh.write(name + '\\n')\n"
    "def prepare_metadata_for_build_wheel(d, config_settings=None):\n"
    "    _log('metadata')\n"
    "    os.makedirs(os.path.join(d, 'demo-1.0.dist-info'))\n"
    "    with open(os.path.join(d, 'demo-1.0.dist-info', 'METADATA'), 'w') as fh:\n"
    "        fh.write('Name: demo\\nVersion: 1.0\\n')\n"
    "    return 'demo-1.0.dist-info'\n"
    "def build_wheel(d, config_settings=None, metadata_directory=None):\n"
    "    _log('build_wheel')\n"
    "    name = 'demo-1.0-py3-none-any.whl'\n"
    "    with zipfile.ZipFile(os.path.join(d, name), 'w') as z: z.writestr('demo.py', '')\n"
    "    return name\n"
)


def _counting_tree(tmp_path: Path, backend: str = COUNTING) -> Path:
    """A tree whose in-tree backend (``backend-path``) logs each hook it is called for."""
    tree = tmp_path / "tree"
    (tree / "b").mkdir(parents=True)
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "counting"\nbackend-path = ["b"]\n'
    )
    (tree / "b" / "counting.py").write_text(backend)
    return tree


def test_the_hook_builds_an_in_tree_backends_wheel_once(tmp_path: Path) -> None:
    """No metadata asked for: one build_wheel and no metadata hook, where pip would call
    prepare_metadata_for_build_wheel first."""
    tree = _counting_tree(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    argv = pep517.command(sys.executable, tree, out)
    assert argv is not None
    res = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "kiln: built demo-1.0-py3-none-any.whl" in res.stdout
    assert (tree / "calls.log").read_text() == "build_wheel\n"
    assert zipfile.ZipFile(out / "demo-1.0-py3-none-any.whl").namelist() == ["demo.py"]


def _verdict_after_ready(meta: Path, verdict: str) -> threading.Thread:
    """kiln's side: once the hook names its metadata, the verdict."""

    def answer() -> None:
        for _ in range(600):
            if (meta / pep517.READY).is_file():
                (meta / pep517.VERDICT).write_text(verdict)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=answer)
    thread.start()
    return thread


def _hook_with_verdict(
    tmp_path: Path, verdict: str, backend: str = COUNTING
) -> tuple[subprocess.CompletedProcess[str], Path, Path, Path]:
    """The hook run with a metadata folder, kiln's ``verdict`` given once it is ready:
    (its result, the tree, the wheel folder, the metadata folder)."""
    tree, out, meta = _counting_tree(tmp_path, backend), tmp_path / "out", tmp_path / "meta"
    out.mkdir()
    meta.mkdir()
    answer = _verdict_after_ready(meta, verdict)
    argv = pep517.command(sys.executable, tree, out, meta)
    assert argv is not None
    res = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False, timeout=60)
    answer.join()
    return res, tree, out, meta


def test_with_a_metadata_folder_the_same_interpreter_writes_metadata_then_waits_to_build(
    tmp_path: Path,
) -> None:
    """The metadata first, named in ``ready``; the wheel only once kiln said go: both
    hooks in one interpreter (one setup.py start, one torch import)."""
    res, tree, out, meta = _hook_with_verdict(tmp_path, "go")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (meta / pep517.READY).read_text() == "demo-1.0.dist-info"
    assert (meta / "demo-1.0.dist-info" / "METADATA").is_file()
    assert (tree / "calls.log").read_text() == "metadata\nbuild_wheel\n"
    assert (out / "demo-1.0-py3-none-any.whl").is_file()


def test_a_refusing_verdict_stops_the_hook_before_build_wheel(tmp_path: Path) -> None:
    res, tree, out, _ = _hook_with_verdict(tmp_path, "the wheel requires what is not there")
    assert res.returncode == pep517.STOPPED, res.stdout + res.stderr
    assert "kiln: stopped before the compile: the wheel requires what is not there" in res.stdout
    assert (tree / "calls.log").read_text() == "metadata\n"
    assert list(out.iterdir()) == []


def test_a_backend_without_the_metadata_hook_says_ready_with_no_metadata(tmp_path: Path) -> None:
    backend = COUNTING.replace("def prepare_metadata_for_build_wheel", "def _no_metadata_hook")
    res, tree, _, meta = _hook_with_verdict(tmp_path, "go", backend)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (meta / pep517.READY).read_text() == ""
    assert "kiln: the backend has no prepare_metadata_for_build_wheel hook" in res.stdout
    assert (tree / "calls.log").read_text() == "build_wheel\n"
