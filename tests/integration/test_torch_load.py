"""imports-before-torch's printed fix, applied (issue 41 (2)), with the real torch of the
tests' build Python: an extension that links torch's libc10.so (as every torch extension
does, with no RUNPATH to torch/lib) is imported by its package before torch is. The
loader cannot open libc10.so; the import proof's reading of that failure gives the row,
and its fix ("import torch first in the package's __init__.py"), applied as printed,
makes the package import."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kiln.inside import causes
from kiln.verify import imports, loadfacts

MODULE = """\
#include <Python.h>
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""


def _facts(python: Path) -> tuple[Path, str, str]:
    """torch's lib folder, the Python's include folder and extension suffix (torch is
    found, not imported)."""
    code = (
        "import importlib.util, os, sysconfig;"
        "print(os.path.join(os.path.dirname(importlib.util.find_spec('torch').origin), 'lib'));"
        "print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX'))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    lib, include, suffix = out.stdout.split()
    return Path(lib), include, suffix


def _import(python: Path, site: Path, module: str) -> subprocess.CompletedProcess[str]:
    """As the proof imports: a Python of its own, -I, LD_BIND_NOW=1."""
    code = f"import sys; sys.path.insert(0, {str(site)!r}); import {module}"
    env = {"LD_BIND_NOW": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [str(python), "-I", "-c", code], capture_output=True, text=True, env=env, check=False
    )


def test_a_package_loading_its_torch_extension_first_imports_with_torch_imported_first(
    tmp_path: Path, build_python: Path
) -> None:
    torch_lib, include, suffix = _facts(build_python)
    assert (torch_lib / "libc10.so").is_file()
    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (tmp_path / "module.c").write_text(MODULE)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            f"-I{include}",
            str(tmp_path / "module.c"),
            "-o",
            str(site / "pkg" / f"_C{suffix}"),
            f"-L{torch_lib}",
            "-Wl,--no-as-needed",
            "-lc10",
        ],
        check=True,
        capture_output=True,
    )
    init = site / "pkg" / "__init__.py"
    init.write_text("from . import _C\n")
    res = _import(build_python, site, "pkg")
    assert res.returncode != 0 and "libc10.so: cannot open shared object" in res.stderr
    read = imports.read_failure("pkg", res.stderr, False, [site])
    assert read.library == "libc10.so"
    facts = loadfacts.gather("v", read, f"pkg/_C{suffix}", [], {}, {}, {}, None, set(), None)
    cause = causes.explain_load(facts)
    assert cause.row == "imports-before-torch"
    assert cause.fix.startswith("import torch first in the package's __init__.py"), cause.fix
    # applied as printed: torch imported first in the package's __init__.py
    init.write_text("import torch\n" + init.read_text())
    fixed = _import(build_python, site, "pkg")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
