"""What ``kiln add`` reads of a CMake project's own files (kiln/verbs/add/cmakelists.py):
the shared objects and their file names, the Python module, a module linking the Python
library, what the configure step imports with the build's Python."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tomlkit

from kiln.verbs import add as kiln_add
from kiln.verbs.add import cmakelists, recipe, scan
from kiln.verbs.add.pysetup import Seen
from tests.unit.test_fixcheck import PROFILE, _wheel


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


def test_a_build_tool_the_configure_step_imports_is_pinned_from_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """add pins what the build imports and the build venv lacks to the newest version on
    the profile's index (a dry resolve), instead of a comment asking for it by hand;
    --offline keeps the comment."""
    folder = tmp_path / "index"
    folder.mkdir()
    _wheel(folder, "numpy", "2.4.6", [])
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    seen = Seen("CMakeLists.txt", 58, 'check_python_libs("numpy")')
    found = scan.Findings(
        "https://x.invalid/x.git", "0" * 40, scan.Backend("cmake", "CMakeLists.txt")
    )
    found.cmake = cmakelists.Project(imports=[("numpy", seen)])
    assert kiln_add._pins(found, PROFILE, offline=True) == {}
    found.pins = kiln_add._pins(found, PROFILE, offline=False)
    assert found.pins == {"numpy": "2.4.6"}
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._build_tools(table, found, decided)
    assert decided["build_tools"] == ["numpy==2.4.6"]
    assert "the CMake configure step imports numpy" in tomlkit.dumps(table)
    found.pins = {}  # not resolved: the comment, no key
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._build_tools(table, found, decided)
    assert "build_tools" not in decided
    said = " ".join(tomlkit.dumps(table).replace("#", " ").split())  # the comment, unwrapped
    assert 'set by hand: build_tools = ["numpy==VERSION"]' in said


def test_a_module_linking_libpython_is_drafted_its_runtime_library(tmp_path: Path) -> None:
    """The draft declares libpythonX.Y (the profile's Python) where a target links
    Python3::Python, and nothing where it links Python3::Module (the check can fail)."""
    seen = Seen("src/CMakeLists.txt", 8, "Python3::Python")
    module = cmakelists.Target("gpu_library", False, "", seen)
    found = scan.Findings(
        "https://x.invalid/x.git", "0" * 40, scan.Backend("cmake", "CMakeLists.txt")
    )
    found.cmake = cmakelists.Project(
        targets=[module], libpython=seen, modules={"gpu_library": seen}
    )
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._cmake_module(table, found, {None: PROFILE}, decided)
    assert decided["import_check"] == "gpu_library"
    assert decided["runtime_libraries"] == [
        {"soname": "libpython3.12.so.1.0", "package": "libpython3.12"}
    ]
    found.cmake.libpython = None
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._cmake_module(table, found, {None: PROFILE}, decided)
    assert "runtime_libraries" not in decided and "runtime_libraries" not in table
