"""In-place builds from ``kiln add`` to a proven release with no edit between (issue 40):
a Python module of a ``.cu`` kernel and a C++ file (the C API), its hard-coded arch
rewritten to sm_100a and sm_103a, imported where the release lands. Built by the
machine's real cmake through kiln's wrapper (CMake's CUDA compiler): the shape of the
corpus's pkestene/pybind11-cuda; and by make from a Makefile naming nvcc by its path,
whose default goal is a test program that cannot link: the shape of the corpus's
mikboy018/pybindtests (benchmarks/onboarding.py). Small enough for CI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kiln.sources.gitrepo import CommitSpec, make_repo
from tests.conftest import run_kiln, shared_cache
from tests.integration.test_import_proof import PROFILE_NO_TORCH, _build
from tests.workspace import write

BASE_URL = "https://cmake.invalid/"
FILES = {
    "LICENSE": "MIT License\n\nCopyright (c) 2026 kiln test fixtures\n",
    "CMakeLists.txt": """\
cmake_minimum_required(VERSION 3.19)
project(kilncm LANGUAGES CXX CUDA)
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
# the configure step imports with the build's Python what the build venv has: no build tool
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import sysconfig" COMMAND_ERROR_IS_FATAL ANY)
add_subdirectory(src)
""",
    "src/CMakeLists.txt": """\
add_library(kilncm MODULE kernel.cu module.cpp)
target_link_libraries(kilncm PRIVATE Python3::Module)
# the upstream's own arch: a generic one, rewritten by kiln to the recipe's
set_target_properties(kilncm PROPERTIES PREFIX "" CUDA_ARCHITECTURES 90)
""",
    "src/kernel.cu": """\
__global__ void kiln_scale(float *x, float a) { x[threadIdx.x] *= a; }
extern "C" int kiln_launch(float *x, float a) {
  kiln_scale<<<1, 32>>>(x, a);
  return 0;
}
""",
    "src/module.cpp": """\
#include <Python.h>
extern "C" int kiln_launch(float *x, float a);
static PyObject *launch_ptr(PyObject *, PyObject *) {
  return PyLong_FromVoidPtr((void *)&kiln_launch);
}
static PyMethodDef methods[] = {{"launch_ptr", launch_ptr, METH_NOARGS, NULL},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "kilncm", NULL, -1, methods};
extern "C" PyMODINIT_FUNC PyInit_kilncm(void) { return PyModule_Create(&mod); }
""",
}


def _add_then_build(
    tmp_path: Path, name: str, files: dict[str, str], build_python: Path
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str], dict[str, Any]]:
    """``kiln add`` of a repository of ``files``, then ``kiln build`` with no edit: (the
    recipe's [build], the build, the release's output entry of ``name``)."""
    repos = tmp_path / "repos"
    (commit,) = make_repo(repos / f"{name}.git", [CommitSpec(name, files)])
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(f'[mirrors]\n"{BASE_URL}" = "{repos}/"\n')
    ws = write(tmp_path / "ws", {}, profile=PROFILE_NO_TORCH)
    cache = shared_cache(tmp_path / "cache")
    added = run_kiln(
        "add", f"{BASE_URL}{name}.git@{commit[:7]}", "--workspace", ws, "--cache", cache,
        "--mirrors", mirrors, "--offline", "--python", build_python, "--toolchain", "system",
        "--cuda-home", "/usr/local/cuda", "--no-dry-run",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr[-3000:]
    recipe = tomllib.loads((ws / "vendors" / f"{name}.toml").read_text())["build"]
    res = _build(tmp_path, ws, mirrors, build_python)
    output: dict[str, Any] = {}
    if res.returncode == 0:
        manifest = json.loads((tmp_path / "artifacts/test-release/manifest.json").read_text())
        (output,) = [o for o in manifest["vendors"][name]["outputs"] if o["kind"] == "tarball"]
    return recipe, res, output


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_kiln_add_then_build_releases_a_cmake_project_with_no_edit(
    tmp_path: Path, build_python: Path
) -> None:
    recipe, res, tarball = _add_then_build(tmp_path, "kilncm", FILES, build_python)
    assert recipe["kind"] == "inplace" and recipe["command"][:2] == ["sh", "-c"]
    assert recipe["outputs"] == ["kilncm*.so"] and recipe["import_check"] == "kilncm"
    assert (recipe["archs"], recipe["arch_control"]) == (["sm_100a", "sm_103a"], "rewrite")
    assert "runtime_libraries" not in recipe  # Python3::Module: no libpython needed
    assert "build_tools" not in recipe  # `import sysconfig`: the standard library's
    assert res.returncode == 0, res.stderr[-3000:]
    assert "kilncm: import proof: kilncm imported" in res.stderr, res.stderr[-3000:]
    assert [(so["path"], so["sass"]) for so in tarball["shared_objects"]] == [
        ("kilncm.so", ["sm_100a", "sm_103a"])
    ]


MAKE_FILES = {
    "LICENSE": FILES["LICENSE"],
    "src/kernel.cu": FILES["src/kernel.cu"],
    "src/module.cpp": FILES["src/module.cpp"].replace("kilncm", "kilnmk"),
    "src/selftest.cu": "int main() { return 0; }\n",
    # nvcc by its path under ?= (the machine's CUDA 13.0 past the wrapper, unless set on
    # make's command line), one arch of its own, a default goal linking a library nobody
    # has, and the module its own rule under lib/ (a folder without __init__.py)
    "Makefile": """\
NVCC ?= /usr/local/cuda/bin/nvcc
ARCH ?= -gencode arch=compute_80,code=sm_80
PYINC := $(shell python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")

all: bin/selftest

bin/selftest: bin/selftest.o lib/kilnmk.so
\t$(NVCC) -o $@ $^ -lkiln_no_such_library

lib/kilnmk.so: bin/kernel.o bin/module.o
\t@mkdir -p lib
\t$(NVCC) -shared -o $@ $^

bin/%.o: src/%.cu
\t@mkdir -p bin
\t$(NVCC) $(ARCH) -Xcompiler -fPIC -c $< -o $@

bin/module.o: src/module.cpp
\t@mkdir -p bin
\t$(CXX) -fPIC -I$(PYINC) -c $< -o $@
""",
}


def test_kiln_add_then_build_releases_a_makefile_module_with_no_edit(
    tmp_path: Path, build_python: Path
) -> None:
    recipe, res, tarball = _add_then_build(tmp_path, "kilnmk", MAKE_FILES, build_python)
    assert recipe["command"] == [
        "sh",
        "-c",
        'make -f Makefile -j "${MAX_JOBS:-1}" NVCC="$NVCC" lib/kilnmk.so',
    ]
    assert recipe["outputs"] == ["lib/kilnmk.so"] and recipe["import_check"] == "lib.kilnmk"
    assert (recipe["archs"], recipe["arch_control"]) == (["sm_100a", "sm_103a"], "rewrite")
    assert "build_tools" not in recipe  # `import sysconfig`: the standard library's
    assert res.returncode == 0, res.stderr[-3000:]
    assert "kilnmk: import proof: lib.kilnmk imported" in res.stderr, res.stderr[-3000:]
    assert [(so["path"], so["sass"]) for so in tarball["shared_objects"]] == [
        ("lib/kilnmk.so", ["sm_100a", "sm_103a"])
    ]


SWITCH_FILES = {
    "LICENSE": FILES["LICENSE"],
    # a backend chosen by a cached variable whose default builds no CUDA (the shape of the
    # corpus's scikit-build-core project): its CUDA part only for "cuda"
    "CMakeLists.txt": """\
cmake_minimum_required(VERSION 3.19)
project(kilnsw LANGUAGES CXX)
set(KILNSW_BACKEND "cpu" CACHE STRING "cpu or cuda")
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
if(KILNSW_BACKEND STREQUAL "cuda")
  enable_language(CUDA)
  add_library(kilnsw MODULE src/kernel.cu src/module.cpp)
  set_target_properties(kilnsw PROPERTIES CUDA_ARCHITECTURES 90)
else()
  add_library(kilnsw MODULE src/cpu.cpp src/module.cpp)
endif()
target_link_libraries(kilnsw PRIVATE Python3::Module)
set_target_properties(kilnsw PROPERTIES PREFIX "")
""",
    "src/kernel.cu": FILES["src/kernel.cu"],
    "src/cpu.cpp": 'extern "C" int kiln_launch(float *x, float a) { x[0] *= a; return 0; }\n',
    "src/module.cpp": FILES["src/module.cpp"].replace("kilncm", "kilnsw"),
}


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_a_cmake_backend_switch_is_drafted_and_a_recipe_without_it_is_refused_before_compiling(
    tmp_path: Path, build_python: Path
) -> None:
    """Issue 54 (2): the CUDA part behind ``set(KILNSW_BACKEND "cpu" CACHE STRING)`` and
    ``if(KILNSW_BACKEND STREQUAL "cuda")``. add drafts ``-DKILNSW_BACKEND=cuda`` (before:
    9 compiles, then "no shared object holds device code"), the build proves sm_100a +
    sm_103a with no edit; the same recipe without it is refused before any compile,
    the switch named with where it is declared and the line that sets it."""
    recipe, res, tarball = _add_then_build(tmp_path, "kilnsw", SWITCH_FILES, build_python)
    assert "-DKILNSW_BACKEND=cuda" in recipe["command"][2]
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(so["path"], so["sass"]) for so in tarball["shared_objects"]] == [
        ("kilnsw.so", ["sm_100a", "sm_103a"])
    ]
    path = tmp_path / "ws" / "vendors" / "kilnsw.toml"
    path.write_text(path.read_text().replace("-DKILNSW_BACKEND=cuda ", ""))
    again = tmp_path / "again"
    refused = _build(again, tmp_path / "ws", tmp_path / "mirrors.toml", build_python)
    assert refused.returncode == 2, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert (
        "CMakeLists.txt:3: KILNSW_BACKEND defaults to cpu, which leaves the CUDA part out" in last
    )
    assert "(CMakeLists.txt:5 compiles it only for cuda)" in last
    assert "fix: add -DKILNSW_BACKEND=cuda to build.command's cmake configure line" in last
    assert not list(again.glob("artifacts/logs/*/kilnsw.jobs")) or not (
        next(again.glob("artifacts/logs/*/kilnsw.jobs")).read_text().strip()
    )  # nothing compiled
