"""Fixture upstreams: small, real git repositories made at test time.

``hdr``: a header-only library (the submodule). ``plain``: a CUDA extension
built by nvcc alone (no torch headers, so a compile takes a second), whose
history moves from host-only code to ``sm_100a`` to ``sm_100a``+``sm_103a``:

    plain@0  host-only .so               (like DeepGEMM: no device code)
    plain@1  + kernels for sm_100a, hdr as a submodule
    plain@2  kernels for sm_100a and sm_103a
    plain@3  ... compiled with -lineinfo
    plain@4  ... compiled with -rdc=true (device link in the shared-object link)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.sources.gitrepo import CommitSpec, make_repo

BASE_URL = "https://fixtures.invalid/"

SETUP_PY = '''\
import os
import subprocess
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ARCHS = open(os.path.join(HERE, "archs.txt")).read().split()
FLAGS = os.path.join(HERE, "nvccflags.txt")
EXTRA = open(FLAGS).read().split() if os.path.exists(FLAGS) else []


class NvccBuildExt(build_ext):
    """Compile .cu extensions straight to a shared object with nvcc (no torch)."""

    def build_extension(self, ext):
        if not ext.sources[0].endswith(".cu"):
            return super().build_extension(ext)
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        nvcc = os.environ.get("NVCC") or os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        gencode = ["-gencode=arch=compute_%s,code=%s" % (a[3:], a) for a in ARCHS]
        print("plainext: compiling", ext.name, flush=True)
        if os.environ.get("PLAIN_STARTED_MARKER"):  # lets a test interrupt mid-compile
            open(os.environ["PLAIN_STARTED_MARKER"], "w").close()
        time.sleep(float(os.environ.get("PLAIN_BUILD_DELAY", "0")))
        obj = os.path.join(self.build_temp, "kernels.o")
        os.makedirs(self.build_temp, exist_ok=True)
        subprocess.check_call([nvcc, "-c", "-Xcompiler", "-fPIC", "-O2", *EXTRA, *gencode,
                               "-I" + os.path.join(HERE, "third_party/hdr/include"),
                               os.path.join(HERE, ext.sources[0]), "-o", obj])
        subprocess.check_call([nvcc, "-shared", *EXTRA, *gencode, obj, "-o", out])


exts = [Extension("plainext._host", ["csrc/host.c"])]
if ARCHS:
    exts.append(Extension("plainext._kernels", ["csrc/kernels.cu"]))
setup(name=os.environ.get("PLAIN_DIST_NAME", "plainext"), version="1.2.0",
      packages=["plainext"], ext_modules=exts, cmdclass={"build_ext": NvccBuildExt})
'''

HOST_C = """\
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_host", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__host(void) { return PyModule_Create(&mod); }
"""

KERNELS_CU = """\
#include <cuda_runtime.h>
#include <hdr/scale.cuh>
__global__ void scale_kernel(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = hdr::scale(x[i], a);
}
extern "C" void launch_scale(float* x, float a, int n) {
  scale_kernel<<<(n + 255) / 256, 256>>>(x, a, n);
}
"""

INIT_PY = 'VERSION = "1.2.0"\nGREETING = "hello from plainext"\n'

SCALE_CUH = """\
#pragma once
namespace hdr {
__device__ inline float scale(float x, float a) { return x * a; }
}
"""

MIT = "MIT License\n\nCopyright (c) 2026 kiln test fixtures\n"


@dataclass(frozen=True)
class Upstreams:
    root: Path
    hdr: list[str]
    plain: list[str]

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors.toml"


def make(root: Path) -> Upstreams:
    """Create ``hdr.git`` and ``plain.git`` under ``root`` plus a mirrors file for them."""
    hdr = make_repo(
        root / "hdr.git",
        [
            CommitSpec(
                "hdr: scale()",
                {
                    "include/hdr/scale.cuh": SCALE_CUH,
                    "LICENSE": MIT,
                },
            ),
            CommitSpec(
                "hdr: comment",
                {
                    "include/hdr/scale.cuh": SCALE_CUH.replace("namespace", "// x * a\nnamespace"),
                },
            ),
        ],
    )
    plain = make_repo(
        root / "plain.git",
        [
            CommitSpec(
                "plain: host-only skeleton",
                {
                    "setup.py": SETUP_PY,
                    "archs.txt": "",
                    "csrc/host.c": HOST_C,
                    "plainext/__init__.py": INIT_PY,
                    "LICENSE": MIT,
                },
            ),
            CommitSpec(
                "plain: kernels for sm_100a",
                {
                    "archs.txt": "sm_100a\n",
                    "csrc/kernels.cu": KERNELS_CU,
                },
                submodules={"third_party/hdr": (f"{BASE_URL}hdr.git", hdr[0])},
            ),
            CommitSpec(
                "plain: kernels for sm_100a and sm_103a", {"archs.txt": "sm_100a sm_103a\n"}
            ),
            CommitSpec("plain: line info for profilers", {"nvccflags.txt": "-lineinfo\n"}),
            CommitSpec("plain: relocatable device code", {"nvccflags.txt": "-rdc=true\n"}),
        ],
    )
    (root / "mirrors.toml").write_text(f'[mirrors]\n"{BASE_URL}" = "{root}/"\n')
    return Upstreams(root, hdr, plain)
