"""The bypass check (kiln/verify/wrapped.py) on real object files: an object no wrapped
compile wrote is named; CMake's compiler identification, whose intermediates nvcc leaves
with ``--keep``, is not (found with a real CMake project: pkestene/pybind11-cuda)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kiln.verify import wrapped


def _object(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text("int kiln_probe(void) { return 1; }\n")
    subprocess.run(["gcc", "-c", str(src), "-o", str(path)], check=True)
    src.unlink()


def test_only_objects_no_wrapped_compile_wrote_are_named(tmp_path: Path) -> None:
    probe = Path("build/cmake/CMakeFiles/3.25.1/CompilerIdCUDA/tmp/CMakeCUDACompilerId.o")
    for rel in (probe, Path("build/a.o"), Path("build/b.o"), Path(".kiln/x.o")):
        _object(tmp_path / rel)
    recorded = [str(tmp_path / "build/a.o")]
    assert wrapped.unrecorded_objects(tmp_path, recorded, 0.0) == ["build/b.o"]


def test_the_cmake_exemption_is_only_cmakes_compiler_identification(tmp_path: Path) -> None:
    """A target's own object under CMakeFiles/ is still named (the check can fail)."""
    own = Path("build/cmake/src/CMakeFiles/gpu_library.dir/gpu_library.cu.o")
    _object(tmp_path / own)
    assert wrapped.unrecorded_objects(tmp_path, [], 0.0) == [str(own)]
    assert not wrapped.cmake_compiler_id(own)
    assert wrapped.cmake_compiler_id(Path("b/CMakeFiles/3.31.0/CompilerIdCXX/a.o"))
    assert shutil.which("gcc")


def test_the_line_named_is_a_compiler_path_that_runs_not_a_default(tmp_path: Path) -> None:
    """``NVCC ?= /usr/local/cuda/bin/nvcc`` and ``${NVCC:-...}`` are defaults kiln's
    environment overrides: the line named is the recipe's own ``/usr/bin/g++``; with none
    such, nothing is named."""
    (tmp_path / "Makefile").write_text(
        "NVCC ?= /usr/local/cuda/bin/nvcc\n"
        "x.o: x.cu\n\t$(NVCC) -c x.cu\n"
        "y.o: y.cpp\n\t/usr/bin/g++ -fPIC -c y.cpp\n"
    )
    (tmp_path / "build.sh").write_text('"${NVCC:-/usr/local/cuda/bin/nvcc}" -c z.cu\n')
    assert wrapped.compiler_by_path(tmp_path) == "Makefile:5: /usr/bin/g++ -fPIC -c y.cpp"
    (tmp_path / "Makefile").write_text("NVCC ?= /usr/local/cuda/bin/nvcc\ny.o:\n\tg++ -c y.cpp\n")
    assert wrapped.compiler_by_path(tmp_path) is None
    (tmp_path / "build.sh").write_text("$CUDA_HOME/bin/nvcc -c z.cu\n")
    assert wrapped.compiler_by_path(tmp_path) == "build.sh:1: $CUDA_HOME/bin/nvcc -c z.cu"
