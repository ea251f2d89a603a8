"""tinyinfer: a package with a `_C` extension of twelve CUDA translation units and one
C++ module, shaped like DeepInfer's (kiln's bundled example of an in-place build).

The .cu files go through $NVCC (default $CUDA_HOME/bin/nvcc), MAX_JOBS at a time; the
archs come from TORCH_CUDA_ARCH_LIST ("10.0a;10.3a"); TINYINFER_VARIANTS sets how many
template instantiations each kernel file compiles (compile weight, default 1).
"""

import glob
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def gencodes():
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(" ", ";").split(";")
    out = []
    for arch in filter(None, archs):
        major, minor = arch.rstrip("af").split(".")
        num = major + minor + arch[len(arch.rstrip("af")):]
        out.append("-gencode=arch=compute_%s,code=sm_%s" % (num, num))
    if not out:
        raise SystemExit("setup.py: set TORCH_CUDA_ARCH_LIST, e.g. '10.0a;10.3a'")
    return out


class CudaBuildExt(build_ext):
    def build_extension(self, ext):
        nvcc = os.environ.get("NVCC") or os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        tmp = os.path.join(HERE, "build", "cuda-objects")
        os.makedirs(tmp, exist_ok=True)
        flags = ["-O2", "-Xcompiler", "-fPIC", "-I" + os.path.join(HERE, "csrc"),
                 "-DTINYINFER_VARIANTS=%s" % os.environ.get("TINYINFER_VARIANTS", "1"),
                 *gencodes()]
        sources = sorted(glob.glob(os.path.join(HERE, "csrc", "kernels", "*.cu")))

        def compile_one(src):
            obj = os.path.join(tmp, os.path.basename(src) + ".o")
            subprocess.check_call([nvcc, *flags, "-c", src, "-o", obj])
            return obj

        jobs = int(os.environ.get("MAX_JOBS", "1"))
        with ThreadPoolExecutor(jobs) as pool:
            cuda_objects = list(pool.map(compile_one, sources))
        ext.extra_objects = cuda_objects
        ext.libraries = ["cudart_static", "rt", "pthread", "dl"]
        ext.library_dirs = [os.path.join(os.environ["CUDA_HOME"], "lib64"),
                            os.path.join(os.environ["CUDA_HOME"], "lib")]
        super().build_extension(ext)


setup(
    name="tinyinfer",
    version="0.1.0",
    packages=["tinyinfer"],
    ext_modules=[Extension("tinyinfer._C", ["csrc/module.cpp"], language="c++")],
    cmdclass={"build_ext": CudaBuildExt},
)
