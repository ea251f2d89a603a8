"""What a CMake project's own files say about its build (``kiln add``, issue 40): the
shared libraries and Python modules it makes, whether a module links the Python library,
and what of Python its configure step imports. Read from the text of every
``CMakeLists.txt`` and ``*.cmake`` of the tree (submodules' left out: their targets are
the project's dependencies, not its outputs); nothing is run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from kiln.verbs.add.pysetup import Seen

# A target that is a shared object: add_library(NAME SHARED|MODULE ...) or a Python
# module made by pybind11, nanobind or CMake's FindPython.
_LIBRARY = re.compile(r"\badd_library\s*\(\s*([\w.+-]+)\s+(SHARED|MODULE)\b", re.IGNORECASE)
_MODULE = re.compile(
    r"\b(pybind11_add_module|nanobind_add_module|python3?_add_library)\s*\(\s*([\w.+-]+)",
    re.IGNORECASE,
)
_NO_PREFIX = re.compile(
    r"set_target_properties\s*\(\s*([\w.+-]+)[^)]*\bPREFIX\s+\"\"", re.IGNORECASE | re.DOTALL
)
# The Python library linked into a target (an extension needs the interpreter's
# symbols, not libpython: Python3::Module is CMake's target for that).
_LIBPYTHON = re.compile(
    r"target_link_libraries\s*\([^)]*(Python3?::Python\b|\$\{PYTHON3?_LIBRAR(?:Y|IES)\}"
    r"|\$\{Python3?_LIBRAR(?:Y|IES)\})",
    re.IGNORECASE | re.DOTALL,
)
# What the configure step imports with the build's Python: `-c "import X"` (or a
# function's `set(CMD "import ${pack}")` called with X), and FindPython's NumPy.
_CALL = re.compile(r"\b(\w+)\s*\(\s*\"?([A-Za-z_][\w.]*)\"?\s*\)")
_NUMPY_COMPONENT = re.compile(r"find_package\s*\(\s*Python3?\b[^)]*\bNumPy\b", re.IGNORECASE)
_FUNCTION = re.compile(r"function\s*\(\s*(\w+)(.*?)endfunction", re.IGNORECASE | re.DOTALL)
_PROJECT_CUDA = re.compile(
    r"\b(?:(?i:project)\s*\([^)]*\bCUDA\b|(?i:enable_language)\s*\(\s*CUDA\b)"
)


@dataclass(frozen=True)
class Target:
    """A shared object the project makes, as CMake names its file."""

    name: str
    python_module: bool  # made by a Python-module command: the interpreter's suffix
    prefix: str  # "lib", or "" where the project drops it (PREFIX "")
    seen: Seen

    @property
    def pattern(self) -> str:
        """Its file name, as a glob of the release's outputs."""
        return f"{self.prefix}{self.name}*.so"


@dataclass
class Project:
    targets: list[Target] = field(default_factory=list)
    cuda: Seen | None = None  # where CUDA is enabled as a language
    libpython: Seen | None = None  # where a target links the Python library
    imports: list[tuple[str, Seen]] = field(default_factory=list)  # configure's imports
    modules: dict[str, Seen] = field(default_factory=dict)  # Python modules sources declare

    def python_modules(self) -> list[tuple[Target, Seen]]:
        """The targets that are Python modules: made by a module command, or a library
        without the ``lib`` prefix whose name a source declares as a module."""
        out = []
        for t in self.targets:
            if t.name in self.modules and (t.python_module or not t.prefix):
                out.append((t, self.modules[t.name]))
            elif t.python_module:
                out.append((t, t.seen))
        return out


def _files(tree: Path, skip: list[str]) -> list[Path]:
    found = [*tree.rglob("CMakeLists.txt"), *tree.rglob("*.cmake")]
    out = []
    for p in sorted(found):
        rel = p.relative_to(tree).as_posix()
        parts = rel.split("/")
        if parts[0] in (".git", ".kiln", "build") or any(
            rel == s or rel.startswith(s + "/") for s in skip
        ):
            continue
        out.append(p)
    return out


def _seen(tree: Path, path: Path, text: str, at: int) -> Seen:
    line = text.count("\n", 0, at) + 1
    return Seen(path.relative_to(tree).as_posix(), line, text.splitlines()[line - 1].strip())


def _strip_comments(text: str) -> str:
    """CMake comments blanked, the text's length and lines kept (so offsets still point)."""
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group(0)), text)


def read(tree: Path, submodules: list[str]) -> Project | None:
    """The project, where a ``CMakeLists.txt`` is at the top of ``tree``; else None."""
    if not (tree / "CMakeLists.txt").is_file():
        return None
    project = Project()
    texts = {p: _strip_comments(p.read_text(errors="replace")) for p in _files(tree, submodules)}
    importing: dict[str, str] = {}  # a function whose body imports its argument
    for text in texts.values():
        for fn in _FUNCTION.finditer(text):
            if re.search(r"import\s+\$\{\w+\}", fn.group(2)):
                importing[fn.group(1).lower()] = fn.group(1)
    no_prefix = {m.group(1) for text in texts.values() for m in _NO_PREFIX.finditer(text)}
    for path, text in texts.items():
        for m in _LIBRARY.finditer(text):
            name = m.group(1)
            prefix = "" if name in no_prefix else "lib"
            project.targets.append(Target(name, False, prefix, _seen(tree, path, text, m.start())))
        for m in _MODULE.finditer(text):
            project.targets.append(Target(m.group(2), True, "", _seen(tree, path, text, m.start())))
        if project.cuda is None and (cuda := _PROJECT_CUDA.search(text)):
            project.cuda = _seen(tree, path, text, cuda.start())
        if project.libpython is None and (link := _LIBPYTHON.search(text)):
            project.libpython = _seen(tree, path, text, link.start(1))
        for m in re.finditer(r"-c\s+\"?\s*import\s+([A-Za-z_][\w.]*)", text):
            project.imports.append((m.group(1), _seen(tree, path, text, m.start())))
        for m in _CALL.finditer(text):
            if m.group(1).lower() in importing:
                project.imports.append((m.group(2), _seen(tree, path, text, m.start())))
        if m2 := _NUMPY_COMPONENT.search(text):
            project.imports.append(("numpy", _seen(tree, path, text, m2.start())))
    first: dict[str, tuple[str, Seen]] = {}  # each module once, where first seen
    for name, seen in project.imports:
        first.setdefault(name, (name, seen))
    project.imports = list(first.values())
    project.modules = declared_modules(tree, submodules)
    return project


# A Python module's own name, as its source declares it (pybind11, nanobind, the C API).
_MODULE_DECL = re.compile(r"\b(?:PYBIND11_MODULE|NB_MODULE)\s*\(\s*(\w+)|\bPyInit_(\w+)\s*\(")
_SOURCES = (".cu", ".cpp", ".cc", ".cxx", ".c")


def declared_modules(tree: Path, submodules: list[str]) -> dict[str, Seen]:
    """Each Python module a source of the project declares (its name: the file a target
    must make for ``import NAME``), with where."""
    found: dict[str, Seen] = {}
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if path.suffix not in _SOURCES or not path.is_file():
            continue
        if rel.split("/")[0] in (".git", ".kiln", "build") or any(
            rel.startswith(s + "/") for s in submodules
        ):
            continue
        text = path.read_text(errors="replace")
        for m in _MODULE_DECL.finditer(text):
            name = m.group(1) or m.group(2)
            found.setdefault(name, _seen(tree, path, text, m.start()))
    return found
