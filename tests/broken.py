"""Fixture upstreams that fail to build, one way each: real torch extensions (ninja, nvcc,
g++, ld) whose first error is a row of kiln's cause table (kiln/inside/causes/).

``broken.git`` holds one commit per fault; each vendor of the test workspace pins one.
Every fault fails at its first compile or link, so a build of all of them takes seconds
past torch's import."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.sources.gitrepo import CommitSpec, make_repo

BASE_URL = "https://broken.invalid/"

SETUP_PY = """\
import json
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

spec = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit.json")))
make = CUDAExtension if spec["cuda"] else CppExtension
setup(
    name="broken",
    version="0.1.0",
    packages=["broken"],
    ext_modules=[
        make(
            "broken._C",
            spec["sources"],
            extra_compile_args={"cxx": spec.get("cxx", []), "nvcc": spec.get("nvcc", [])},
            libraries=spec.get("libraries", []),
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
"""

ARCH_TABLE_SETUP = """\
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

# Its own targets for TORCH_CUDA_ARCH_LIST's archs (written before 10.3a existed).
TARGETS = {"9.0a": "90a", "10.0a": "100a"}
listed = os.environ.get("TORCH_CUDA_ARCH_LIST", "").split(";")
gencode = ["-gencode=arch=compute_%s,code=sm_%s" % (TARGETS[a], TARGETS[a])
           for a in listed if a in TARGETS]
setup(
    name="broken",
    version="0.1.0",
    packages=["broken"],
    ext_modules=[CUDAExtension("broken._C", ["csrc/binding.cpp", "csrc/k.cu"],
                               extra_compile_args={"cxx": [], "nvcc": gencode})],
    cmdclass={"build_ext": BuildExtension},
)
"""

DOWNLOAD_SETUP = SETUP_PY.replace(
    "spec = json.load(",
    'if os.getenv("BROKEN_FORCE_BUILD", "FALSE") != "TRUE":\n'
    "    import urllib.request\n\n"
    '    urllib.request.urlopen("https://downloads.invalid/broken/broken-0.1.0-cp311-linux.whl")\n'
    "spec = json.load(",
    1,
)

BINDING = """\
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&mod); }
"""

# fault -> (unit.json, files): each one's first error is the row of the same name (or of
# ROWS[fault]).
FAULTS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    # a header no package here provides (hwloc's; libhwloc-dev is not installed)
    "missing-header": (
        {"cuda": True, "sources": ["csrc/binding.cpp", "csrc/topo.cu"]},
        {
            "csrc/topo.cu": '#include "topo.h"\n__global__ void k() {}\n',
            "csrc/topo.h": "#pragma once\n#include <hwloc.h>\n",
        },
    ),
    # an identifier the NCCL of torch's wheels (nvidia-nccl-cu13) does not declare
    "missing-identifier": (
        {"cuda": True, "sources": ["csrc/binding.cpp", "csrc/comm.cu"]},
        {
            "csrc/comm.cu": (
                "#include <nccl.h>\n"
                "int props(ncclComm_t c) {\n"
                "  ncclKilnFutureProperties p;\n"
                "  return ncclKilnFutureQuery(c, &p);\n"
                "}\n"
            )
        },
    ),
    # torch's headers refuse -std=c++17
    "cxx-standard": (
        {"cuda": False, "sources": ["csrc/binding.cpp", "csrc/ops.cpp"], "cxx": ["-std=c++17"]},
        {"csrc/ops.cpp": "#include <torch/extension.h>\nint ops() { return 1; }\n"},
    ),
    # an arch this CUDA does not know, hard-coded by the upstream beside one it knows
    # (CUDA 13 renamed sm_101a): the recipe builds sm_100a, the upstream's own list
    "unknown-arch": (
        {
            "cuda": True,
            "sources": ["csrc/binding.cpp", "csrc/k.cu"],
            "nvcc": [
                "-gencode=arch=compute_100a,code=sm_100a",
                "-gencode=arch=compute_101a,code=sm_101a",
            ],
        },
        {"csrc/k.cu": "__global__ void k() {}\n"},
    ),
    # a unit written for sm_90a alone, which kiln's arch rewrite will not build for sm_100a
    "arch-refused": (
        {
            "cuda": True,
            "sources": ["csrc/binding.cpp", "csrc/hopper.cu"],
            "nvcc": ["-gencode=arch=compute_90a,code=sm_90a"],
            "arch_control": "rewrite",
        },
        {"csrc/hopper.cu": "__global__ void k() {}\n"},
    ),
    # the upstream's own C++20 code (a concept, std::floating_point) under its -std=c++17
    "cxx20-code": (
        {
            "cuda": True,
            "sources": ["csrc/binding.cpp", "csrc/ops.cu"],
            "nvcc": ["-std=c++17", "-gencode=arch=compute_100a,code=sm_100a"],
        },
        {
            "csrc/ops.cu": (
                "#include <concepts>\n"
                "template <typename T> concept Floaty = std::floating_point<T>;\n"
                "template <Floaty T> __device__ T twice(T x) { return x + x; }\n"
                "__global__ void k(float* x) { x[0] = twice(x[0]); }\n"
            )
        },
    ),
    # setup.py imports a module the build venv lacks (the build never reaches a compiler)
    "setup-import": (
        {"cuda": False, "sources": ["csrc/binding.cpp"]},
        {"setup.py": SETUP_PY.replace("import os\n", "import os\n\nimport pybind11\n", 1)},
    ),
    # an upstream that maps TORCH_CUDA_ARCH_LIST through a table of its own, with no entry
    # for 10.3a: its units ask nvcc for sm_100a only (kiln stops at the first compile)
    "arch-dropped": (
        {
            "cuda": True,
            "sources": ["csrc/binding.cpp", "csrc/k.cu"],
            "archs": ["sm_100a", "sm_103a"],
        },
        {"csrc/k.cu": "__global__ void k() {}\n", "setup.py": ARCH_TABLE_SETUP},
    ),
    # a setup.py that downloads a prebuilt wheel unless its switch is "TRUE" (the recipe
    # sets it to "1"): the build reaches for the network
    "network-download": (
        {"cuda": False, "sources": ["csrc/binding.cpp"], "env": {"BROKEN_FORCE_BUILD": "1"}},
        {"setup.py": DOWNLOAD_SETUP},
    ),
    # Hopper's wgmma compiled for sm_100a: ptxas refuses the instruction
    "ptx-instruction": (
        {
            "cuda": True,
            "sources": ["csrc/binding.cpp", "csrc/hopper.cu"],
            "nvcc": ["-gencode=arch=compute_100a,code=sm_100a"],
        },
        {"csrc/hopper.cu": '__global__ void k() { asm volatile("wgmma.fence.sync.aligned;"); }\n'},
    ),
    # a library that is not installed (its function called, so the link keeps it)
    "missing-library": (
        {
            "cuda": False,
            "sources": ["csrc/binding.cpp", "csrc/use.cpp"],
            "libraries": ["kilnabsent"],
        },
        {
            "csrc/use.cpp": (
                'extern "C" int kiln_absent(void);\nint use() { return kiln_absent(); }\n'
            )
        },
    ),
}


ROWS = {"cxx20-code": "cxx-standard"}

# fault -> files of an earlier revision that does not fail (the missing-identifier row's
# fix names pinning one): the fault's commit sits on top of it.
EARLIER: dict[str, dict[str, str]] = {
    "missing-identifier": {
        "csrc/comm.cu": "#include <nccl.h>\nint props(ncclComm_t c) { return c != nullptr; }\n"
    },
}


def row(fault: str) -> str:
    """The cause-table row that explains ``fault``."""
    return ROWS.get(fault, fault)


@dataclass(frozen=True)
class Broken:
    root: Path
    commits: dict[str, str]  # fault -> commit
    earlier: dict[str, str]  # fault -> the revision before it that builds (EARLIER)

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors.toml"


def make(root: Path) -> Broken:
    """``broken.git`` (one commit per fault, each on top of a common skeleton) and a
    mirrors file mapping ``https://broken.invalid/`` to it."""
    base = {
        "setup.py": SETUP_PY,
        "broken/__init__.py": "",
        "csrc/binding.cpp": BINDING,
        "LICENSE": "MIT License\n\nCopyright (c) 2026 kiln test fixtures\n",
    }
    commits: dict[str, str] = {}
    earlier: dict[str, str] = {}
    for fault, (unit, files) in FAULTS.items():
        content = {**base, **files, "unit.json": json.dumps(unit)}
        history = [CommitSpec(f"broken: {fault}", content)]
        if fault in EARLIER:
            before = {**content, **EARLIER[fault]}
            history.insert(0, CommitSpec(f"before {fault}", before))
        shas = make_repo(root / f"{fault}.git", history)
        commits[fault] = shas[-1]
        if fault in EARLIER:
            earlier[fault] = shas[0]
    (root / "mirrors.toml").write_text(f'[mirrors]\n"{BASE_URL}" = "{root}/"\n')
    return Broken(root, commits, earlier)


def vendor(fault: str, commit: str) -> dict[str, Any]:
    unit = FAULTS[fault][0]
    cuda = unit["cuda"] and not unit.get("nvcc")
    return {
        "source": {"url": f"{BASE_URL}{fault}.git", "commit": commit},
        "build": {
            "kind": "wheel",
            "archs": unit.get("archs", ["sm_100a"]) if unit["cuda"] else [],
            "env": unit.get("env", {}),
            "arch_control": unit.get("arch_control")
            or ("torch-arch-list" if cuda else ("hardcoded" if unit["cuda"] else "none")),
        },
    }
