import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

here = os.path.dirname(os.path.abspath(__file__))
setup(
    name="vecadd",
    version="0.3.0",
    packages=["vecadd"],
    ext_modules=[
        CUDAExtension(
            "vecadd._C",
            ["csrc/binding.cpp", "csrc/kernel.cu"],
            include_dirs=[os.path.join(here, "third_party", "mathlib", "include")],
            extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O3"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
