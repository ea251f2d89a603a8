"""A CMake project's switch that leaves its CUDA part out (issue 54 (2)), read from the
text of its ``CMakeLists.txt`` and ``*.cmake`` files (submodules' left out), never run.

A project that builds for several backends chooses with a cached variable: an
``option(WITH_CUDA "..." OFF)`` or a ``set(BACKEND "cpu" CACHE STRING "...")``, and an
``if()`` around what makes the CUDA part (``enable_language(CUDA)``,
``find_package(CUDAToolkit)``, a ``.cu`` source, a ``CUDA::`` target). Left at a default
that does not enable it, the build compiles its C++ for minutes and makes a library with
no device code. Here: each such variable, its default, where it is declared and where it
gates the CUDA part, and the value that builds it; ``kiln add`` drafts that value
(``-DNAME=VALUE``), a build whose recipe does not set it is refused before its first
compile, the switch named.

What is read: ``if(NAME)``, ``if(${NAME})`` (ON), ``if(NOT NAME)`` (OFF), ``if(NAME
STREQUAL "v")`` and ``if("${NAME}" STREQUAL v)`` (v), on the ``if``/``elseif`` lines
enclosing a CUDA statement; an ``else()`` branch says nothing (its value is not one).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_OPTION = re.compile(r"^\s*option\s*\(\s*(\w+)\s+(\"[^\"]*\"|\S+)\s*(\w+)?\s*\)", re.I)
_CACHED = re.compile(r"^\s*set\s*\(\s*(\w+)\s+(\"[^\"]*\"|[^\s)]+)\s+CACHE\s+(\w+)", re.I)
_IF = re.compile(r"^\s*(if|elseif)\s*\((.*)\)\s*$", re.I)
_ELSE = re.compile(r"^\s*else\s*\(", re.I)
# a plain variable set to a boolean: ``set(BUILD_CUDA ON)``
_SET_BOOL = re.compile(r"^\s*set\s*\(\s*(\w+)\s+\"?(\w+)\"?\s*\)", re.I)
_ENDIF = re.compile(r"^\s*endif\s*\(", re.I)
_CUDA = re.compile(
    r"enable_language\s*\(\s*CUDA\b|find_package\s*\(\s*CUDA(?:Toolkit)?\b|\bCUDA::\w"
    r"|[\w/${}.-]+\.cu\b|project\s*\([^)]*\bCUDA\b",
    re.I,
)
_TRUE = {"ON", "TRUE", "1", "YES", "Y"}
_FALSE = {"OFF", "FALSE", "0", "NO", "N", ""}


@dataclass(frozen=True)
class Switch:
    """A cached variable whose default leaves the CUDA part out."""

    name: str
    default: str  # as declared ("OFF", "cpu")
    enables: str  # the value that builds the CUDA part ("ON", "cuda")
    declared: str  # file:line of its option()/set(... CACHE)
    gates: str  # file:line of the if() around the CUDA part

    def define(self) -> str:
        return f"-D{self.name}={self.enables}"


def _files(tree: Path, skip: Sequence[str]) -> list[Path]:
    found = sorted({*tree.rglob("CMakeLists.txt"), *tree.rglob("*.cmake")})
    out = []
    for path in found:
        rel = path.relative_to(tree).as_posix()
        if any(rel == s or rel.startswith(s.rstrip("/") + "/") for s in skip):
            continue
        if rel.startswith(("build/", ".kiln/")) or "/build/" in rel:
            continue
        out.append(path)
    return out


def _value(text: str) -> str:
    return text.strip().strip('"')


def _same(a: str, b: str) -> bool:
    """Whether two CMake values say the same (booleans by meaning, strings by case)."""
    ua, ub = a.upper(), b.upper()
    if ua in _TRUE | _FALSE and ub in _TRUE | _FALSE:
        return (ua in _TRUE) == (ub in _TRUE)
    return ua == ub


def _enabling(condition: str, name: str) -> str | None:
    """The value of ``name`` that makes ``condition`` (an if's, as written) true, where
    it can be read; None where the condition does not say."""
    ref = rf"(?:\"?\$\{{{name}\}}\"?|\b{name}\b)"
    m = re.search(rf"{ref}\s+STREQUAL\s+(\"[^\"]*\"|\S+)", condition)
    if m:
        return _value(m.group(1))
    if re.search(rf"\bNOT\s+{ref}", condition):
        return "OFF"
    if re.search(
        rf"{ref}\s+(?:MATCHES|STRLESS|STRGREATER|VERSION_\w+|EQUAL|LESS|GREATER)", condition
    ):
        return None
    return "ON" if re.search(ref, condition) else None


def cuda_switches(tree: Path, submodules: Sequence[str] = ()) -> list[Switch]:
    """Each cached variable whose default leaves the project's CUDA part out."""
    files = _files(tree, submodules)
    declared: dict[str, tuple[str, str]] = {}  # name -> (default, file:line)
    lines_of: dict[Path, list[str]] = {}
    for path in files:
        lines = [ln.split("#", 1)[0] for ln in path.read_text(errors="replace").splitlines()]
        lines_of[path] = lines
        rel = path.relative_to(tree).as_posix()
        for i, line in enumerate(lines, 1):
            if m := _OPTION.match(line):
                declared.setdefault(m.group(1), (_value(m.group(3) or "OFF"), f"{rel}:{i}"))
            elif m := _CACHED.match(line):
                declared.setdefault(m.group(1), (_value(m.group(2)), f"{rel}:{i}"))
    # a plain variable a switch's value sets (bitsandbytes: ``if(${COMPUTE_BACKEND} STREQUAL
    # "cuda")`` sets ``BUILD_CUDA ON``, and ``if(BUILD_CUDA)`` gates the CUDA part): it
    # stands for that switch at that value
    derived: dict[str, tuple[str, str, str]] = {}  # name -> (switch, its value, if's file:line)
    for line, stack in _walk(tree, lines_of):
        m = _SET_BOOL.match(line)
        if not m or m.group(2).upper() not in _TRUE or m.group(1) in declared:
            continue
        for condition, where in (e for e in stack if e is not None):
            for name in declared:
                value = _enabling(condition, name)
                if value is not None and m.group(1) not in derived:
                    derived[m.group(1)] = (name, value, where)
    found: dict[str, Switch] = {}
    for line, stack in _walk(tree, lines_of):
        if not _CUDA.search(line):
            continue
        for condition, where in (e for e in stack if e is not None):
            for name, (default, at) in declared.items():
                value = _enabling(condition, name)
                if value is None or _same(default, value) or name in found:
                    continue
                found[name] = Switch(name, default, value, at, where)
            for var, (name, value, gate) in derived.items():
                default, at = declared[name]
                if _enabling(condition, var) == "ON" and not _same(default, value):
                    found.setdefault(name, Switch(name, default, value, at, gate))
    return list(found.values())


def _walk(
    tree: Path, lines_of: Mapping[Path, list[str]]
) -> Iterator[tuple[str, list[tuple[str, str] | None]]]:
    """Each line of each file that is not an if/else/endif, with the if()s around it
    (condition, file:line; None for an else branch)."""
    for path, lines in lines_of.items():
        rel = path.relative_to(tree).as_posix()
        stack: list[tuple[str, str] | None] = []
        for i, line in enumerate(lines, 1):
            if m := _IF.match(line):
                if m.group(1).lower() == "if":
                    stack.append((m.group(2), f"{rel}:{i}"))
                elif stack:
                    stack[-1] = (m.group(2), f"{rel}:{i}")
                continue
            if _ELSE.match(line) and stack:
                stack[-1] = None
                continue
            if _ENDIF.match(line) and stack:
                stack.pop()
                continue
            yield line, stack


def set_by(switch: Switch, command: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether a recipe sets ``switch`` to its enabling value: ``-DNAME=VALUE`` (or
    ``-DNAME:TYPE=VALUE``) in its command or in ``CMAKE_ARGS``/``SKBUILD_CMAKE_ARGS``."""
    words: list[str] = []
    for text in [*command, env.get("CMAKE_ARGS", "")]:
        try:
            words += shlex.split(text)
        except ValueError:
            words += text.split()
    words += env.get("SKBUILD_CMAKE_ARGS", "").split(";")
    pattern = re.compile(rf"-D{switch.name}(?::\w+)?=(.*)")
    values = [m.group(1) for w in words if (m := pattern.fullmatch(w.strip()))]
    return bool(values) and _same(values[-1], switch.enables)
