"""Fixture upstreams that build, verify (SASS for sm_100a and sm_103a, tags, linkage) and
then do not work where they land, one way each: the import proof's bad inputs
(issue 34). Each is a real CUDA extension wheel: a kernel compiled by nvcc with the
upstream's own hard-coded ``-gencode`` list, linked with a C++ Python module by
setuptools (no torch headers, so each builds in seconds).

``<case>.git`` holds one commit each; the vendor of the same name pins it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.sources.gitrepo import CommitSpec, make_repo

BASE_URL = "https://landing.invalid/"

SETUP_PY = """\
import json
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = json.load(open(os.path.join(HERE, "case.json")))
GENCODE = ["-gencode=arch=compute_100a,code=sm_100a", "-gencode=arch=compute_103a,code=sm_103a"]


class KernelFirst(build_ext):
    def build_extension(self, ext):
        nvcc = os.environ.get("NVCC") or os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        os.makedirs(self.build_temp, exist_ok=True)
        obj = os.path.join(self.build_temp, "kernel.o")
        subprocess.check_call([nvcc, "-c", "-Xcompiler", "-fPIC", "-O2", *GENCODE,
                               os.path.join(HERE, "csrc", "kernel.cu"), "-o", obj])
        ext.extra_objects = [obj]
        ext.library_dirs = [os.path.join(os.environ["CUDA_HOME"], "lib64")]
        ext.libraries = SPEC.get("libraries", ["cudart_static", "rt", "pthread", "dl"])
        ext.extra_link_args = SPEC.get("link_args", [])
        super().build_extension(ext)


setup(
    name="landing",
    version="0.1.0",
    packages=["landing"],
    ext_modules=[Extension("landing._C", SPEC["sources"], language="c++")],
    cmdclass={"build_ext": KernelFirst},
)
"""

KERNEL_CU = """\
#include <cuda_runtime.h>
__global__ void twice(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
}
extern "C" int landing_launch(float* x, int n) {
  twice<<<(n + 255) / 256, 256>>>(x, n);
  return (int)cudaGetLastError();
}
"""

# The module: calls kiln_scale (declared in ops.h) at import.
MODULE_CPP = """\
#include <Python.h>
#include "ops.h"
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};
extern "C" PyMODINIT_FUNC PyInit__C(void) {
  if (kiln_scale(2) != 4) return NULL;
  return PyModule_Create(&mod);
}
"""
OPS_H = "#pragma once\nint kiln_scale(int x);\n"
OPS_CPP = '#include "ops.h"\nint kiln_scale(int x) { return 2 * x; }\n'

# A module whose import initializes the GPU (cuInit through the driver).
GPU_CPP = """\
#include <Python.h>
#include <dlfcn.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_gpu", NULL, -1, NULL};
extern "C" PyMODINIT_FUNC PyInit__gpu(void) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  int (*init)(unsigned) = driver ? (int (*)(unsigned))dlsym(driver, "cuInit") : nullptr;
  int rc = init ? init(0) : -1;
  if (rc != 0) {
    PyErr_Format(PyExc_RuntimeError, "CUDA initialization failed (cuInit returned %d): "
                 "no CUDA-capable device is detected", rc);
    return NULL;
  }
  return PyModule_Create(&mod);
}
"""

BASE: dict[str, str] = {
    "setup.py": SETUP_PY,
    "landing/__init__.py": "from landing import _C\n",
    "csrc/kernel.cu": KERNEL_CU,
    "csrc/module.cpp": MODULE_CPP,
    "csrc/ops.h": OPS_H,
    "csrc/ops.cpp": OPS_CPP,
    "LICENSE": "MIT License\n\nCopyright (c) 2026 kiln test fixtures\n",
}

# case -> (case.json, files beside BASE)
CASES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    # lands and imports
    "good": ({"sources": ["csrc/module.cpp", "csrc/ops.cpp"]}, {}),
    # linked to a library an NVIDIA-style wheel of the consumer environment ships
    # (nvidia/cu13/lib/libcublas_kilnfake.so.1), found through RUNPATH $ORIGIN/../nvidia/cu13/lib
    # as torch's own extensions find cuBLAS: loads only where the wheel and that wheel
    # share one site-packages (tests/integration/test_import_proof.py builds the library)
    "nvidia-runpath": (
        {
            "sources": ["csrc/module.cpp", "csrc/ops.cpp"],
            "libraries": ["cublas_kilnfake", "cudart_static", "rt", "pthread", "dl"],
            "link_args": ["-Wl,-rpath,$ORIGIN/../nvidia/cu13/lib"],
        },
        {
            "csrc/ops.cpp": (
                '#include "ops.h"\nextern "C" int kiln_fake(void);\n'
                "int kiln_scale(int x) { return kiln_fake() == 7 ? 2 * x : 0; }\n"
            )
        },
    ),
    # kiln_scale calls cuBLAS (cublasGetProperty: the library's version, no GPU needed),
    # declared by hand (no cuBLAS headers here), and the link names no -lcublas: setuptools
    # links it (undefined symbols are allowed in a shared object), the import does not
    # (tests/faults/test_fixes_applied.py: the real libcublas.so.13 of torch's nvidia-cublas)
    "cublas-unlinked": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {
            "csrc/ops.cpp": (
                '#include "ops.h"\nextern "C" int cublasGetProperty(int type, int* value);\n'
                "int kiln_scale(int x) {\n  int major = 0;  // MAJOR_VERSION\n"
                "  return cublasGetProperty(0, &major) == 0 && major >= 13 ? 2 * x : 0;\n}\n"
            )
        },
    ),
    # kiln_scale is declared, called, defined in csrc/ops.cpp: which the source list forgot
    "undefined-symbol": ({"sources": ["csrc/module.cpp"]}, {}),
    # linked against the CUDA runtime's shared library, which nothing where it lands ships
    "nobody-ships": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"], "libraries": ["cudart"]},
        {},
    ),
    # a second extension whose import needs a GPU
    "needs-gpu": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {
            "csrc/gpu.cpp": GPU_CPP,
            "setup.py": SETUP_PY.replace(
                'ext_modules=[Extension("landing._C", SPEC["sources"], language="c++")],',
                'ext_modules=[Extension("landing._C", SPEC["sources"], language="c++"),\n'
                '                 Extension("landing._gpu", ["csrc/gpu.cpp"], language="c++")],',
            ),
        },
    ),
    # requires a distribution (a local fixture wheel: tests/integration/test_inplace.py's
    # make_wheel) that the consumer environment lacks: setup.py says so in its first lines
    "requires-dep": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {
            "setup.py": SETUP_PY.replace(
                '    packages=["landing"],\n',
                '    packages=["landing"],\n    install_requires=["kiln_fixture_dep>=1.0"],\n',
            )
        },
    ),
    # its pyproject.toml pins a setuptools the build venv's is not (kiln builds without
    # isolation, so it would build with what the upstream excludes)
    "build-system-pin": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {
            "pyproject.toml": '[build-system]\nrequires = ["setuptools<75", "wheel"]\n'
            'build-backend = "setuptools.build_meta"\n'
        },
    ),
    # two extension modules built side by side by a parallel build_ext, each with its own
    # kernel compiled for a generic arch (kiln's rewrite makes both SM100 archs of each)
    "parallel-two": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {
            "csrc/module2.cpp": MODULE_CPP.replace('"_C"', '"_C2"').replace(
                "PyInit__C", "PyInit__C2"
            ),
            # its own copy: two extensions built at once that share a source write the
            # same object file at once (setuptools' temp folder), a race of the upstream
            # (CI saw one module's compile find ops.o gone under the other's)
            "csrc/ops2.cpp": OPS_CPP,
            "setup.py": SETUP_PY.replace(
                'GENCODE = ["-gencode=arch=compute_100a,code=sm_100a", '
                '"-gencode=arch=compute_103a,code=sm_103a"]',
                'GENCODE = ["-arch=sm_90"]',
            )
            .replace(
                'obj = os.path.join(self.build_temp, "kernel.o")',
                'obj = os.path.join(self.build_temp, ext.name + ".kernel.o")',
            )
            .replace(
                "class KernelFirst(build_ext):\n",
                "class KernelFirst(build_ext):\n"
                "    def finalize_options(self):\n"
                "        super().finalize_options()\n"
                "        self.parallel = 2  # the extensions at once, in threads\n\n",
            )
            .replace(
                'ext_modules=[Extension("landing._C", SPEC["sources"], language="c++")],',
                'ext_modules=[Extension("landing._C", SPEC["sources"], language="c++"),\n'
                '                 Extension("landing._C2", ["csrc/module2.cpp", "csrc/ops2.cpp"],'
                ' language="c++")],',
            ),
        },
    ),
    # the package's import takes 3 s (a slow first import, not a hang)
    "slow": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {"landing/__init__.py": "import time\n\ntime.sleep(3)\nfrom landing import _C\n"},
    ),
    # the package imports a distribution (tests/integration/test_inplace.py's make_wheel)
    # that neither setup.py's install_requires nor the runtime requirements name
    "undeclared-dep": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {"landing/__init__.py": "import kiln_fixture_dep\nfrom landing import _C\n"},
    ),
    # setup.py imports a build helper (a distribution) the build venv lacks
    "setup-helper": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {
            "setup.py": SETUP_PY.replace(
                "import json\n", "import json\n\nimport kiln_setup_helper\n", 1
            )
        },
    ),
    # the package raises at import
    "raises": (
        {"sources": ["csrc/module.cpp", "csrc/ops.cpp"]},
        {
            "landing/__init__.py": 'from landing import _C\n\nraise RuntimeError("landing: '
            'configured for another cluster")\n'
        },
    ),
}


@dataclass(frozen=True)
class Landing:
    root: Path
    commits: dict[str, str]  # case -> commit

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors.toml"


def make(root: Path) -> Landing:
    commits = {}
    for case, (spec, files) in CASES.items():
        content = {**BASE, **files, "case.json": json.dumps(spec)}
        commits[case] = make_repo(root / f"{case}.git", [CommitSpec(f"landing: {case}", content)])[
            0
        ]
    (root / "mirrors.toml").write_text(f'[mirrors]\n"{BASE_URL}" = "{root}/"\n')
    return Landing(root, commits)


def vendor(case: str, commit: str, **build: Any) -> dict[str, Any]:
    return {
        "source": {"url": f"{BASE_URL}{case}.git", "commit": commit, "license": "LICENSE"},
        "build": {
            "kind": "wheel",
            "archs": ["sm_100a", "sm_103a"],
            "arch_control": "hardcoded",
            "mem_per_job_gib": 1.0,
            **build,
        },
    }


def setup_helper_workspace(tmp: Path, profile: dict[str, Any]) -> tuple[Landing, Path, Path]:
    """The ``setup-helper`` case alone in a workspace of ``profile``, and a wheelhouse
    with the distribution its setup.py imports (kiln_setup_helper 1.0): (the cases, the
    workspace, the wheelhouse)."""
    from tests.integration.test_inplace import make_wheel
    from tests.workspace import write

    cases = make(tmp / "landing")
    wheelhouse = tmp / "wheelhouse"
    make_wheel(wheelhouse, "kiln_setup_helper", "1.0")
    ws = write(
        tmp / "ws",
        {"setup-helper": vendor("setup-helper", cases.commits["setup-helper"])},
        profile=profile,
    )
    return cases, ws, wheelhouse


def printed_link(fix: str) -> tuple[str, str]:
    """The library name and the link argument a printed "link it and let the loader find
    it" fix names: ``add 'NAME' to the extension's libraries ... and 'ARG' to its
    extra_link_args``."""
    name = fix.split("add '", 1)[1].split("'", 1)[0]
    link_arg = fix.split("and '", 1)[1].split("' to its extra_link_args", 1)[0]
    return name, link_arg
