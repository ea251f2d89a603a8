"""A CMake project's switch that leaves its CUDA part out (issue 54 (2)): read from the
text, its enabling value, and whether a recipe sets it."""

from __future__ import annotations

from pathlib import Path

from kiln.verify import cmakeswitch

CMAKE = """\
cmake_minimum_required(VERSION 3.18)
project(p LANGUAGES CXX)
option(WITH_GPU "build the GPU part" OFF)
option(WITH_TESTS "tests" ON)
option(USE_FAST "fast kernels" ON)
set(BACKEND "cpu" CACHE STRING "cpu or cuda")
if(WITH_GPU)
  find_package(CUDAToolkit REQUIRED)
endif()
if("${BACKEND}" STREQUAL "cuda")
  add_library(k SHARED k.cu)
elseif(BACKEND STREQUAL "rocm")
  add_library(k SHARED k.hip)
else()
  add_library(k SHARED k.cpp)  # k.cu in a comment does not count
endif()
if(USE_FAST)
  target_sources(k PRIVATE fast.cu)
endif()
if(WITH_TESTS)
  add_executable(t t.cpp)
endif()
"""


def test_the_switches_whose_defaults_leave_cuda_out_are_named(tmp_path: Path) -> None:
    (tmp_path / "CMakeLists.txt").write_text(CMAKE)
    sub = tmp_path / "third_party" / "lib"
    sub.mkdir(parents=True)
    (sub / "CMakeLists.txt").write_text(
        'option(LIB_CUDA "" OFF)\nif(LIB_CUDA)\n  enable_language(CUDA)\nendif()\n'
    )
    found = cmakeswitch.cuda_switches(tmp_path, ["third_party/lib"])
    assert [(s.name, s.default, s.enables, s.declared, s.gates) for s in found] == [
        ("WITH_GPU", "OFF", "ON", "CMakeLists.txt:3", "CMakeLists.txt:7"),
        ("BACKEND", "cpu", "cuda", "CMakeLists.txt:6", "CMakeLists.txt:10"),
    ]  # USE_FAST is on already, WITH_TESTS gates no CUDA, the submodule's is its own
    assert [s.define() for s in found] == ["-DWITH_GPU=ON", "-DBACKEND=cuda"]


def test_a_recipe_sets_a_switch_on_its_command_or_in_cmake_args(tmp_path: Path) -> None:
    (tmp_path / "CMakeLists.txt").write_text(CMAKE)
    gpu, backend = cmakeswitch.cuda_switches(tmp_path)
    command = ["sh", "-c", "cmake -S . -B b -DBACKEND=cuda && cmake --build b"]
    assert cmakeswitch.set_by(backend, command, {})
    assert not cmakeswitch.set_by(gpu, command, {})
    assert cmakeswitch.set_by(gpu, [], {"CMAKE_ARGS": "-DWITH_GPU:BOOL=TRUE -DX=1"})
    assert cmakeswitch.set_by(gpu, [], {"SKBUILD_CMAKE_ARGS": "-DX=1;-DWITH_GPU=1"})
    assert not cmakeswitch.set_by(gpu, [], {"CMAKE_ARGS": "-DWITH_GPU=OFF"})
    assert not cmakeswitch.set_by(backend, [], {"CMAKE_ARGS": "-DBACKEND=rocm"})


def test_a_pep517_cmake_build_gets_the_switch_in_cmake_args(tmp_path: Path) -> None:
    """scikit-build-core (or a setup.py driving cmake) reads CMAKE_ARGS: the draft sets
    the switch there, said with where it is declared."""
    import tomlkit

    from kiln.verbs.add import recipe
    from kiln.verbs.add.scan import Backend, Findings

    (tmp_path / "CMakeLists.txt").write_text(CMAKE)
    f = Findings("u", "c", Backend("pep517", "pyproject.toml"))
    f.cmake_switches = cmakeswitch.cuda_switches(tmp_path)
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    decided["arch_toggles"] = {}
    recipe._env(table, f, decided)
    assert decided["env"] == {"CMAKE_ARGS": "-DWITH_GPU=ON -DBACKEND=cuda"}
    said = " ".join(tomlkit.dumps(table).replace("#", " ").split())
    assert "CMakeLists.txt:3: WITH_GPU defaults to OFF, which leaves the CUDA part out" in said


def test_a_switch_that_sets_a_variable_gating_the_cuda_part_is_named(tmp_path: Path) -> None:
    """bitsandbytes' shape (issue 54 (2)): the backend switch sets a plain variable, and
    that variable's if() gates the CUDA part; the switch is named at its own if()."""
    (tmp_path / "CMakeLists.txt").write_text(
        'set(COMPUTE_BACKEND "cpu" CACHE STRING "cpu, cuda, hip")\n'
        "set(BUILD_CUDA OFF)\n"
        'if(${COMPUTE_BACKEND} STREQUAL "cuda")\n'
        "  set(BUILD_CUDA ON)\n"
        'elseif(${COMPUTE_BACKEND} STREQUAL "hip")\n'
        "  set(BUILD_HIP ON)\n"
        "endif()\n"
        "if(BUILD_CUDA)\n"
        "  enable_language(CUDA)\n"
        "  target_link_libraries(k PUBLIC CUDA::cublas)\n"
        "endif()\n"
    )
    (found,) = cmakeswitch.cuda_switches(tmp_path)
    assert (found.name, found.default, found.enables, found.declared, found.gates) == (
        "COMPUTE_BACKEND", "cpu", "cuda", "CMakeLists.txt:1", "CMakeLists.txt:3",
    )  # fmt: skip
