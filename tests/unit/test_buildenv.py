"""The venvs kiln provisions (the build venv, the PyPI CUDA): their files' mtimes are
pinned, because GCC's `#pragma once` compares mtimes, and the tests show why that matters."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from kiln.toolchain import buildenv

STUB = "#pragma once\nstruct _object;\nusing PyObject = _object;\n"


def _twins(root: Path, mtimes: tuple[int, int]) -> Path:
    """Two headers of equal content in two folders (as torch ships c10/util/python_stub.h
    and torch/csrc/utils/python_stub.h), both included by one source."""
    for folder, mtime in zip(("c10/util", "torch/utils"), mtimes, strict=True):
        header = root / folder / "python_stub.h"
        header.parent.mkdir(parents=True)
        header.write_text(STUB)
        os.utime(header, (mtime, mtime))
    source = root / "a.cpp"
    source.write_text('#include "c10/util/python_stub.h"\n#include "torch/utils/python_stub.h"\n')
    return source


def _preprocessed(source: Path) -> str:
    res = subprocess.run(
        ["g++", "-E", "-P", str(source)], capture_output=True, text=True, check=True
    )
    return res.stdout


def test_pragma_once_merges_equal_headers_only_when_their_mtimes_match(tmp_path: Path) -> None:
    """The hazard itself: the same two files preprocess differently depending on whether
    they were written within the same second."""
    apart = _preprocessed(_twins(tmp_path / "apart", (1_000_000_000, 1_000_000_001)))
    together = _preprocessed(_twins(tmp_path / "together", (1_000_000_000, 1_000_000_000)))
    assert apart.count("using PyObject") == 2
    assert together.count("using PyObject") == 1


def _wheel(dest: Path) -> Path:
    """A minimal wheel with a package and a header, to install without a network."""
    wheel = dest / "stubpkg-1.0-py3-none-any.whl"
    files = {
        "stubpkg/__init__.py": "",
        "stubpkg/include/python_stub.h": STUB,
        "stubpkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: stubpkg\nVersion: 1.0\n",
        "stubpkg-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + "stubpkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in {**files, "stubpkg-1.0.dist-info/RECORD": record}.items():
            zf.writestr(name, text)
    return wheel


def test_provisioned_venvs_have_pinned_mtimes(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    python = buildenv.make_venv(
        Path(sys.executable),
        tmp_path / "venv",
        ["--no-index", "--no-deps", str(wheel)],
        tmp_path / "venv.log",
        "a stub",
    )
    assert python.exists()
    files = [p for p in (tmp_path / "venv").rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "python_stub.h" for p in files)
    assert {p.stat().st_mtime for p in files} == {buildenv.PINNED_MTIME}


def test_a_relative_python_is_made_absolute_not_resolved(tmp_path: Path, monkeypatch) -> None:
    """Steps run in other folders: ``--python .venv/bin/python`` must still name it there,
    and stay the venv's link (resolving it would leave the venv)."""
    venv = tmp_path / "v" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    got = buildenv.build_python(None, tmp_path, "v/bin/python", tmp_path)  # type: ignore[arg-type]
    assert got == tmp_path / "v" / "bin" / "python" and got.is_symlink()
