"""The build Python's facts are kept between runs until its install changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kiln.inside import facts


def test_facts_are_reused_until_a_package_is_installed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python, cache = venv / "bin" / "python", tmp_path / "facts"
    first = facts.python_facts(python, cache)
    assert first["torch"] is None
    (saved,) = cache.glob("python-*.json")
    saved.write_text(saved.read_text().replace('"torch": null', '"torch": "from-cache"'))
    assert facts.python_facts(python, cache)["torch"] == "from-cache"  # not probed again
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "newpkg").mkdir()  # an install changes the stamp: probed afresh
    assert facts.python_facts(python, cache)["torch"] is None


def test_torchs_facts_read_from_its_files_are_what_importing_it_says(build_python: Path) -> None:
    """The probe reads torch's version, CUDA and C++11 ABI from its files (version.py,
    libc10.so's symbols) instead of importing it (3 CPU-s before a build's first fetch
    on 2 cores): the same answers as ``import torch`` gives, in a tenth of a second."""
    imported = subprocess.run(
        [
            str(build_python),
            "-c",
            "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda, "
            "bool(torch._C._GLIBCXX_USE_CXX11_ABI)]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[-1]
    found = facts._probe_python(build_python)
    assert [found["torch"], found["torch_cuda"], found["cxx11_abi"]] == json.loads(imported)


def test_a_torch_laid_out_otherwise_is_imported_as_before(tmp_path: Path) -> None:
    """No version.py or libc10.so where the probe looks (another layout, a stub
    package): it imports torch, and what the import says is what it records."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    fake = site / "torch"
    (fake / "version").mkdir(parents=True)
    (fake / "_C").mkdir()
    (fake / "__init__.py").write_text(
        "from torch import version\n__version__ = '9.9.9'\nfrom torch import _C\n"
    )
    (fake / "version" / "__init__.py").write_text("cuda = '13.9'\n")
    (fake / "_C" / "__init__.py").write_text("_GLIBCXX_USE_CXX11_ABI = 0\n")
    found = facts._probe_python(venv / "bin" / "python")
    assert [found["torch"], found["torch_cuda"], found["cxx11_abi"]] == ["9.9.9", "13.9", False]
