"""The fixture upstream of README's "Build your own upstream" (no other test uses it):
``normext``, a CUDA extension as teams write them, with what kiln's own recipes never
had to meet at once:

- its ``setup.py`` hard-codes its ``-gencode`` list, from sm_75 to sm_120 plus PTX, most
  of which the profile does not want (``arch_control = "rewrite"`` builds exactly the
  profile's archs without a patch);
- a header-only library as a git submodule (``third_party/mathlib``);
- a BSD-2-Clause license (outside the three ids kiln once knew).

It compiles with nvcc alone (no torch headers): a build takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.sources.git import git
from kiln.sources.gitrepo import CommitSpec, make_repo

# The URL README's commands use; the test's mirrors file points it at a local bare repo.
URL = "https://git.example.com/acme/normext"
HOST = "https://git.example.com/acme/"

SETUP_PY = """\
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

# Every GPU we have ever shipped to, plus PTX for the newest.
NVCC_ARCH_FLAGS = [
    "-gencode=arch=compute_75,code=sm_75",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_86,code=sm_86",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_100,code=sm_100",
    "-gencode=arch=compute_120,code=sm_120",
    "-gencode=arch=compute_120,code=compute_120",
]


class NvccBuildExt(build_ext):
    def build_extension(self, ext):
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        nvcc = os.environ.get("NVCC") or os.path.join(
            os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"
        )
        os.makedirs(self.build_temp, exist_ok=True)
        obj = os.path.join(self.build_temp, "rmsnorm.o")
        subprocess.check_call([nvcc, "-c", "-Xcompiler", "-fPIC", "-O3", *NVCC_ARCH_FLAGS,
                               "-I" + os.path.join(HERE, "third_party/mathlib/include"),
                               os.path.join(HERE, "csrc/rmsnorm.cu"), "-o", obj])
        subprocess.check_call([nvcc, "-shared", *NVCC_ARCH_FLAGS, obj, "-o", out])


setup(name="normext", version="0.4.0", packages=["normext"],
      ext_modules=[Extension("normext._kernels", ["csrc/rmsnorm.cu"])],
      cmdclass={"build_ext": NvccBuildExt})
"""

RMSNORM_CU = """\
#include <cuda_runtime.h>
#include <mathlib/rsqrt.cuh>
__global__ void rmsnorm_kernel(float* x, int n, float eps) {
  __shared__ float sum;
  if (threadIdx.x == 0) sum = 0.f;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&sum, x[i] * x[i]);
  __syncthreads();
  float r = mathlib::rsqrt_eps(sum / n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= r;
}
extern "C" void normext_rmsnorm(float* x, int n, float eps) {
  rmsnorm_kernel<<<1, 256>>>(x, n, eps);
}
"""

RSQRT_CUH = """\
#pragma once
namespace mathlib {
__device__ inline float rsqrt_eps(float v, float eps) { return rsqrtf(v + eps); }
}
"""

BSD_2_CLAUSE = """\
BSD 2-Clause License

Copyright (c) 2026, Acme Inference

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""

MIT = """\
MIT License

Copyright (c) 2026 mathlib authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


@dataclass(frozen=True)
class OwnExt:
    root: Path
    commits: list[str]  # normext's history; the last is tagged v0.4.0

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors.toml"


def make(root: Path) -> OwnExt:
    """``mathlib`` and ``normext`` (tag ``v0.4.0``) under ``root``, and a mirrors
    file that points ``https://git.example.com/acme/`` at them."""
    mathlib = make_repo(
        root / "mathlib",
        [
            CommitSpec(
                "mathlib: rsqrt_eps", {"include/mathlib/rsqrt.cuh": RSQRT_CUH, "LICENSE": MIT}
            )
        ],
    )
    normext = make_repo(
        root / "normext",
        [
            CommitSpec(
                "normext: RMSNorm for every GPU we ship to",
                {
                    "setup.py": SETUP_PY,
                    "csrc/rmsnorm.cu": RMSNORM_CU,
                    "normext/__init__.py": '__version__ = "0.4.0"\n',
                    "LICENSE": BSD_2_CLAUSE,
                },
                submodules={"third_party/mathlib": (f"{HOST}mathlib", mathlib[0])},
            )
        ],
    )
    git("tag", "v0.4.0", normext[-1], cwd=root / "normext")
    (root / "mirrors.toml").write_text(f'[mirrors]\n"{HOST}" = "{root}/"\n')
    return OwnExt(root, normext)
