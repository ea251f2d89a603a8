"""What ``kiln add`` reads of a Makefile at the top of a tree (kiln/verbs/add/makefile.py)
and the command it drafts: the shared objects make is asked for (not the default goal),
nvcc by a path set to kiln's wrapper on make's command line, a recipe's own nvcc path
named, what ``$(shell python -m X)`` imports, and the Python module's import path."""

from __future__ import annotations

from pathlib import Path

import tomlkit

from kiln.config.models import Profile
from kiln.orchestrate import beforecompile
from kiln.verbs.add import makefile, recipe, scan
from kiln.verbs.add.pysetup import Seen

# mikboy018/pybindtests' shape (the corpus of benchmarks/onboarding.py): nvcc by a path
# under `?=`, one arch by a variable, the default goal a test program linking a Python
# the machine may not have, the module a rule of its own.
PYBINDTESTS = """\
NVCC?=/usr/local/cuda/bin/nvcc
COMPUTE_CAPABILITY?=80
OPTS = -gencode arch=compute_${COMPUTE_CAPABILITY},code=sm_${COMPUTE_CAPABILITY} \\
  -O3 $(shell python3 -m pybind11 --includes)

bin/test: bin/test.o lib/example.so
\t$(NVCC) $(OPTS) -lpython3.10 -o bin/test bin/test.o lib/example.so

lib/example.so: bin/example.o
\t$(NVCC) $(OPTS) -shared -o lib/example.so bin/example.o

bin/example.o: src/example.cu
\t$(NVCC) $(OPTS) -c src/example.cu -o $@
"""


def _read(tmp_path: Path, text: str, name: str = "makefile") -> makefile.Makefile:
    (tmp_path / name).write_text(text)
    found = makefile.read(tmp_path)
    assert found is not None
    return found


def test_the_shared_objects_are_asked_for_with_nvcc_set_to_the_wrapper(tmp_path: Path) -> None:
    mk = _read(tmp_path, PYBINDTESTS)
    assert [(s.target, s.pattern, s.seen.line) for s in mk.shared] == [
        ("lib/example.so", "lib/example.so", 9)
    ]
    assert [(v, s.line) for v, s in mk.nvcc_vars] == [("NVCC", 1)]
    assert [(m, s.line) for m, s in mk.imports] == [("pybind11", 3)]  # the joined line's first
    assert [s.line for s in mk.arch_lines] == [2, 3]
    assert mk.literal_nvcc == []
    assert recipe.make_command(mk) == [
        "sh",
        "-c",
        'make -f makefile -j "${MAX_JOBS:-1}" NVCC="$NVCC" lib/example.so',
    ]
    assert scan.backend(tmp_path).kind == "make"


def test_nvcc_by_name_is_left_alone_and_a_path_with_flags_is_named(tmp_path: Path) -> None:
    """The reading fails the other way: nvcc by name (the wrapper is first on PATH) is not
    set, a path followed by flags is named as bypassing (setting it would drop the flags),
    and a module named through the extension-suffix variable leaves make its default goal."""
    mk = _read(
        tmp_path,
        "NVCC = nvcc -std=c++17 -O3\nSUFFIX := $(shell python3-config --extension-suffix)\n"
        "CUDA_NVCC := /opt/cuda/bin/nvcc -O3\n"
        "all: mod$(SUFFIX)\n%$(SUFFIX): %.cu\n\t$(NVCC) -shared $< -o $@\n"
        "other.o: other.cu\n\t/usr/local/cuda/bin/nvcc -c other.cu  # by its own path\n",
        "Makefile",
    )
    assert mk.nvcc_vars == []
    assert [s.line for s in mk.literal_nvcc] == [3, 8]
    assert [(s.target, s.pattern) for s in mk.shared] == [(None, "mod*.so")]
    assert recipe.make_command(mk) == ["sh", "-c", 'make -f Makefile -j "${MAX_JOBS:-1}"']
    assert mk.imports == []  # python3-config is no module


def test_the_module_is_imported_by_its_path_from_the_top(tmp_path: Path) -> None:
    mk = _read(tmp_path, PYBINDTESTS)
    mk.modules = {"example": Seen("src/example.cu", 3, "PYBIND11_MODULE(example, m) {")}
    found = scan.Findings("https://x.invalid/x.git", "0" * 40, scan.Backend("make", "makefile"))
    found.make = mk
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._make(table, found, decided)
    recipe._make_module(table, found, decided)
    assert decided["outputs"] == ["lib/example.so"]
    assert decided["import_check"] == "lib.example"  # lib/ has no __init__.py: a namespace
    said = " ".join(tomlkit.dumps(table).replace("#", " ").split())
    assert "not its default goal" in said and "set to kiln's wrapper" in said
    mk.modules = {}  # no source declares it a module: no import_check
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._make_module(table, found, decided)
    assert "import_check" not in decided


def test_no_makefile_no_reading(tmp_path: Path) -> None:
    assert makefile.read(tmp_path) is None
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    assert scan.backend(tmp_path).kind == "cmake"
    (tmp_path / "Makefile").write_text("all:\n\tcmake -S . -B b\n")
    assert scan.backend(tmp_path).kind == "make"  # a Makefile at the top drives the build


def test_the_programs_an_in_place_command_runs_are_those_looked_up() -> None:
    """What the before-compile check looks up (kiln/orchestrate/beforecompile.py): the
    drafted CMake and make commands' programs; an assignment, a shell word, a path or a
    ``$`` is not a program to look up."""
    assert beforecompile.command_programs(recipe.CMAKE_COMMAND) == ["cmake"]
    mk = makefile.Makefile("Makefile")
    assert beforecompile.command_programs(recipe.make_command(mk)) == ["make"]
    assert beforecompile.command_programs(["./build.sh"]) == []
    assert beforecompile.command_programs(["bash", "build.sh"]) == ["bash"]
    script = 'CC=gcc cd x && ninja -C b; "$CMAKE" --build b | tee log || ./run.sh\nmeson'
    assert beforecompile.command_programs(["sh", "-c", script]) == ["ninja", "tee", "meson"]


def test_the_makefiles_own_arch_lines_are_cited_where_the_archs_are_decided(
    tmp_path: Path,
) -> None:
    mk = _read(tmp_path, PYBINDTESTS)
    found = scan.Findings("https://x.invalid/x.git", "0" * 40, scan.Backend("make", "makefile"))
    found.make, found.sources = mk, [("src/example.cu", None)]
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    profile = Profile(cuda="13.2", python="3.12", archs=["sm_100a", "sm_103a"])
    recipe._archs(table, found, {None: profile}, decided)
    said = " ".join(tomlkit.dumps(table).replace("#", " ").split())
    assert decided["arch_control"] == "rewrite"
    assert "makefile:2: `COMPUTE_CAPABILITY?=80`" in said
    assert "makefile spells its own arch flags" in said
    mk.arch_lines = []  # none spelt: the generic reading, no line cited
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    recipe._archs(table, found, {None: profile}, decided)
    assert "no arch flag kiln can see" in " ".join(tomlkit.dumps(table).replace("#", " ").split())
