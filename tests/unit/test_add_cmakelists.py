"""What ``kiln add`` reads of a CMake project's own files (kiln/verbs/add/cmakelists.py):
the shared objects and their file names, the Python module, a module linking the Python
library, what the configure step imports with the build's Python."""

from __future__ import annotations

from pathlib import Path

from kiln.verbs.add import cmakelists


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_pybind11_cuda_shaped_project(tmp_path: Path) -> None:
    """pkestene/pybind11-cuda's shape: the module a library with PREFIX "", linked with
    Python3::Python, numpy imported by a function of the project's own at configure."""
    tree = _tree(
        tmp_path,
        {
            "CMakeLists.txt": "project(x-cuda-test LANGUAGES CXX C)\nenable_language(CUDA)\n"
            'include(Check)\ncheck_python_libs("numpy")  # the configure step imports it\n'
            "add_subdirectory(src)\n",
            "cmake/Check.cmake": "function(check_python_libs)\n  foreach (pack IN LISTS ARGN)\n"
            '    set(CMD "import ${pack}")\n    execute_process(COMMAND ${Python3_EXECUTABLE}'
            " -c ${CMD})\n  endforeach ()\nendfunction()\n",
            "src/CMakeLists.txt": "add_library(gpu_library SHARED\n  gpu_library.cu)\n"
            "target_link_libraries(gpu_library PUBLIC\n  Python3::Python\n  cudart)\n"
            'set_target_properties(gpu_library PROPERTIES PREFIX "")\n',
            "src/gpu_library.cu": "PYBIND11_MODULE(gpu_library, m) {}\n",
            "third/pybind11/CMakeLists.txt": "add_library(pybind11 SHARED x.cpp)\n",
        },
    )
    p = cmakelists.read(tree, ["third/pybind11"])
    assert p is not None
    assert [(t.name, t.pattern) for t in p.targets] == [("gpu_library", "gpu_library*.so")]
    assert str(p.cuda) == "CMakeLists.txt:2: `enable_language(CUDA)`"  # not x-cuda-test
    assert p.libpython is not None and p.libpython.line == 4
    assert [(m, s.file, s.line) for m, s in p.imports] == [("numpy", "CMakeLists.txt", 4)]
    ((module, seen),) = p.python_modules()
    assert module.name == "gpu_library" and str(seen).startswith("src/gpu_library.cu:1:")


def test_a_plain_library_keeps_its_prefix_and_is_no_python_module(tmp_path: Path) -> None:
    """The reading can fail the other way: no module, no libpython, no import."""
    tree = _tree(
        tmp_path,
        {
            "CMakeLists.txt": "project(k LANGUAGES CXX CUDA)\n"
            "# target_link_libraries(k Python3::Python) in a comment does not count\n"
            "add_library(kern SHARED k.cu)\ntarget_link_libraries(kern Python3::Module)\n",
            "k.cu": "__global__ void f() {}\n",
        },
    )
    p = cmakelists.read(tree, [])
    assert p is not None
    assert [t.pattern for t in p.targets] == ["libkern*.so"]
    assert p.python_modules() == [] and p.libpython is None and p.imports == []
    assert cmakelists.read(tmp_path / "k.cu", []) is None  # no CMakeLists.txt at the top
