"""The torch rows' printed fixes, applied (issue 41 (2)), with real torches: the tests'
build Python's (the profile's 2.14.1) and a second one from PyPI (2.13.0+cpu, no CUDA
libraries), in consumer environments made as the import proof makes them.

- imports-before-torch: an extension that links torch's libc10.so (as every torch
  extension does, with no RUNPATH to torch/lib) is imported by its package before torch
  is. The loader cannot open libc10.so; the import proof's reading of that failure gives
  the row, and its fix ("import torch first in the package's __init__.py"), applied as
  printed, makes the package import.
- abi-mismatch: compiled against one torch, loaded with the other.
- another-torch: the import loads a torch of another version than the profile's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kiln import fsutil
from kiln.inside import import_child as importproof
from kiln.inside.causes import table
from kiln.inside.causes.cause import Cause
from kiln.orchestrate import importproof as landing_layout
from kiln.release import files
from kiln.toolchain import consumerenv, pipconfig, uvtool
from kiln.verify import imports, loadfacts
from tests.conftest import CACHE
from tests.workspace import PROFILE

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
    cause = table.explain_load(facts)
    assert cause.row == "imports-before-torch"
    assert cause.fix.startswith("import torch first in the package's __init__.py"), cause.fix
    # applied as printed: torch imported first in the package's __init__.py
    init.write_text("import torch\n" + init.read_text())
    fixed = _import(build_python, site, "pkg")
    assert fixed.returncode == 0, fixed.stderr[-2000:]


# An extension that calls c10::utils::unset_env where its torch has it (2.14 on), as
# upstreams guard a newer torch's API by its version macros.
ABI_MODULE = """\
#include <Python.h>
#include <c10/util/env.h>
#include <torch/version.h>
static PyObject* clear(PyObject*, PyObject*) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
  c10::utils::unset_env("KILN_FIXTURE");
#else
  c10::utils::set_env("KILN_FIXTURE", "", true);
#endif
  Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"clear", clear, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""
OTHER_TORCH = "torch==2.13.0+cpu"  # a second torch of PyPI, 190 MB (no CUDA libraries)


def _environment(requirements: str, python: Path) -> consumerenv.ConsumerEnv:
    """A consumer environment made from ``requirements`` as the import proof makes one
    (kiln/toolchain/consumerenv.py), in the tests' shared cache: made once."""
    uv = uvtool.binary()
    env = consumerenv.plan(CACHE, "3.11", str(python), requirements, None, "local:", uv)

    def make() -> None:
        if env.root.exists():
            shutil.rmtree(env.root)
        listing = subprocess.run(
            [str(python), "-m", "pip", "config", "list"], capture_output=True, text=True
        ).stdout
        settings = pipconfig.uv_settings(pipconfig.parse(listing))
        for i, (argv, _what) in enumerate(env.commands(settings)):
            if i == 1:
                (env.root / consumerenv.REQUIREMENTS_FILE).write_text(requirements)
            run_env = {**os.environ, **settings.env}
            subprocess.run(argv, check=True, capture_output=True, text=True, env=run_env)
        consumerenv.mark_made(env)

    fsutil.made_once(env.root, env.made, make, "a test's consumer environment")
    return env


def _torch_of(python: Path) -> Path:
    code = (
        "import importlib.util, os;print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _compile_against(torch: Path, include: str, suffix: str, out: Path, source: Path) -> None:
    subprocess.run(
        [
            "g++",
            "-shared",
            "-fPIC",
            "-std=c++17",
            f"-I{include}",
            f"-I{torch / 'include'}",
            f"-I{torch / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            str(source),
            "-o",
            str(out),
            f"-L{torch / 'lib'}",
            "-Wl,--no-as-needed",
            "-lc10",
        ],
        check=True,
        capture_output=True,
    )


def test_abi_mismatch_is_fixed_by_building_against_the_torch_the_release_installs(
    tmp_path: Path, build_python: Path
) -> None:
    """abi-mismatch, applied (issue 41 (2)): compiled against the profile's torch (2.14.1,
    the tests' build Python) and imported where a runtime list installs another torch
    (2.13.0, a second real torch from PyPI), the extension needs c10::utils::unset_env,
    which 2.13's libc10.so does not define. The row names the mismatch; its fix (build
    against the torch the release installs) applied, compiled against 2.13.0, it loads."""
    other = _environment(f"{OTHER_TORCH}\n", build_python)
    _lib, include, suffix = _facts(build_python)
    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("import torch\nfrom . import _C\n")
    source = tmp_path / "module.cpp"
    source.write_text(ABI_MODULE)
    so = site / "pkg" / f"_C{suffix}"
    _compile_against(_torch_of(build_python), include, suffix, so, source)
    res = _import(other.python, site, "pkg")
    assert res.returncode != 0 and "undefined symbol: _ZN3c105utils9unset_envEPKc" in res.stderr
    read = imports.read_failure("pkg", res.stderr, False, [site])
    env_site = other.site_packages()
    facts = loadfacts.gather(
        "v",
        read,
        f"pkg/_C{suffix}",
        ["libc10.so"],
        consumerenv.libraries(env_site),
        consumerenv.distributions(env_site),
        {},
        None,
        set(),
        "torch==2.14.1",
    )
    cause = table.explain_load(facts)
    assert cause.row == "abi-mismatch", cause
    assert "c10::utils::unset_env(char const*)" in cause.cause
    assert "the environment holds torch 2.13.0+cpu" in cause.cause, cause.cause
    assert cause.fix.startswith("build against the torch the release installs"), cause.fix
    # applied: built against the torch the environment holds, the extension loads there
    _compile_against(_torch_of(other.python), include, suffix, so, source)
    fixed = _import(other.python, site, "pkg")
    assert fixed.returncode == 0, fixed.stderr[-2000:]


def test_another_torch_is_fixed_by_pinning_the_profiles_torch(
    tmp_path: Path, build_python: Path
) -> None:
    """another-torch, applied (issue 41 (2)): a package that imports torch, imported by the
    proof's own child (kiln.inside.import_child) in a consumer environment holding torch
    2.13.0, while the wheels are compiled against the profile's 2.14.1+cu130: the row.
    Its fix applied as printed: torch==2.14.1 in runtime-requirements.txt, the
    environment made from it as the proof makes it, the same import passes the check."""
    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("import torch\n")
    profile_torch = PROFILE["torch"]

    def judge(env: consumerenv.ConsumerEnv, name: str) -> Cause | None:
        # where the proof imports: a venv of its own holding the package and the
        # environment's distributions linked in (importproof._overlay's layout)
        root = tmp_path / name
        subprocess.run([str(env.python), "-m", "venv", "--without-pip", str(root)], check=True)
        overlay = sorted((root / "lib").glob("python3*/site-packages"))[0]
        landing_layout.link_environment(overlay, env.site_packages())
        shutil.copytree(site / "pkg", overlay / "pkg")
        res = importproof.import_one(
            str(root / "bin" / "python"), {"name": "pkg"}, importproof._environment(None), 300, root
        )
        assert res["returncode"] == 0, res["output"][-2000:]
        torch = (res["facts"] or {}).get("torch") or {}
        return imports.another_torch(
            str(torch.get("version")),
            str(torch.get("file")),
            profile_torch,
            [str(site) for site in env.site_dirs()],
        )

    cause = judge(_environment(f"{OTHER_TORCH}\n", build_python), "before")
    assert cause is not None and cause.row == "another-torch"
    assert cause.cause.startswith("it loaded torch 2.13.0+cpu from ")
    assert cause.fix.startswith("pin torch==2.14.1 in runtime-requirements.txt"), cause.fix
    # applied as printed: the pin in runtime-requirements.txt, read as the build reads it
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "runtime-requirements.txt").write_text("torch==2.14.1\n")
    fixed = _environment(files.requirements(ws, profile_torch), build_python)
    assert judge(fixed, "after") is None
    # --proof-env build-python (issue 53): the environment sees the build Python's own
    # torch, of the profile's version, through its .pth: that torch is the environment's
    # (the GPU machine's FlashMLA proof was refused as another torch before)
    own = consumerenv.plan(
        tmp_path / "cache",
        "3.11",
        str(build_python),
        "",
        None,
        "local:",
        source=consumerenv.BUILD_PYTHON,
    )
    for argv, _what in own.commands():
        subprocess.run(argv, check=True, capture_output=True, text=True)
    assert len(own.site_dirs()) == 2, own.site_dirs()
    assert judge(own, "build-python") is None
