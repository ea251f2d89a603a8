"""Every compile of a step went through kiln's compiler wrapper (issue 40).

The wrapper (``kiln/inside/kit/objcache.py``) records each compiler run with the file it
wrote (``out`` in ``KILN_JOB_STATS``). An object file the step wrote into its tree that
no record names was made by a compiler kiln did not set: a build script that spells out
``$CUDA_HOME/bin/nvcc`` or a Makefile's own compiler path. kiln's arch flags (the
rewrite, the check of each unit's targets), its deterministic flags, the object cache
and the compile gate never reached that compile, so the step is refused, naming the
objects and the line of the build's own files that calls the compiler by path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

KIT = ".kiln"
ELF_MAGIC = b"\x7fELF"
ET_REL = 1  # e_type of a relocatable object: what a compile writes
# A compiler spelt out by path in a build file (nvcc, a g++/gcc/clang of the toolkit's or
# the system's): what bypasses the wrapper that CC, CXX, NVCC and PATH's nvcc name.
BY_PATH = re.compile(
    r"(?:\$\{?CUDA_HOME\}?|\$\{?CUDA_PATH\}?|/[\w./-]*)/bin/nvcc\b|CUDA_HOME[^\n]*\"nvcc\""
    r"|/[\w./-]*/bin/(?:g\+\+|gcc|c\+\+|cc|clang\+\+|clang)(?![\w+-])"
)
# A default the environment kiln sets overrides, so never the compile's: make's
# ``NVCC ?= /usr/local/cuda/bin/nvcc``, the shell's ``${NVCC:-/usr/local/cuda/bin/nvcc}``.
DEFAULT_ONLY = re.compile(
    r"^\s*(?:export\s+)?(?:NVCC|CC|CXX|CUDACXX)\s*\?=|\$\{(?:NVCC|CC|CXX|CUDACXX):?-"
)
BUILD_FILES = ("*.sh", "Makefile", "makefile", "*.mk", "setup.py", "CMakeLists.txt")


def _relocatable(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(18)
    except OSError:
        return False
    return (
        head[:4] == ELF_MAGIC
        and len(head) == 18
        and head[5] in (1, 2)
        and (int.from_bytes(head[16:18], "little" if head[5] == 1 else "big") == ET_REL)
    )


def cmake_compiler_id(rel: Path) -> bool:
    """A file of CMake's compiler identification (``CMakeFiles/<version>/CompilerId<LANG>/``):
    CMake runs the compiler (kiln's wrapper, as ``CUDACXX`` names it) with ``--keep`` on a
    probe of its own to read which compiler it is, and nvcc leaves its intermediate
    objects there. They are the probe's, never part of an output."""
    parts = rel.parts
    return any(
        p == "CMakeFiles" and i + 2 < len(parts) and parts[i + 2].startswith("CompilerId")
        for i, p in enumerate(parts)
    )


def unrecorded_objects(tree: Path, written: Iterable[str | None], since: float) -> list[str]:
    """The object files (ELF relocatables, ``*.o``) under ``tree`` written since
    ``since`` (epoch seconds) that no compiler run of the wrapper wrote (``written``:
    the records' ``out``), relative to the tree; kiln's own ``.kiln/`` and CMake's
    compiler identification left out."""
    recorded = {str(Path(w).resolve()) for w in written if w}
    found = []
    for path in tree.rglob("*.o"):
        rel = path.relative_to(tree)
        if rel.parts[0] == KIT or not path.is_file() or cmake_compiler_id(rel):
            continue
        try:
            if path.stat().st_mtime < since:
                continue
        except OSError:
            continue
        if str(path.resolve()) not in recorded and _relocatable(path):
            found.append(str(rel))
    return sorted(found)


def compiler_by_path(tree: Path) -> str | None:
    """``FILE:LINE: the line`` of the first of the build's own files (its scripts,
    Makefiles, setup.py, CMakeLists.txt, at the top or one folder down) that spells a
    compiler out by path, or None. A default the environment overrides (``NVCC ?=``,
    ``${NVCC:-...}``) is not such a line: under kiln it never runs."""
    candidates: list[Path] = []
    for pattern in BUILD_FILES:
        candidates += sorted(tree.glob(pattern)) + sorted(tree.glob(f"*/{pattern}"))
    for path in candidates:
        if KIT in path.relative_to(tree).parts or not path.is_file():
            continue
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            if (
                BY_PATH.search(line)
                and not line.lstrip().startswith("#")
                and not DEFAULT_ONLY.search(line)
            ):
                return f"{path.relative_to(tree)}:{number}: {line.strip()}"
    return None


def bypass_message(vendor: str, objects: list[str], tree: Path) -> str:
    """The first screen of a step whose compiles bypassed the wrapper."""
    caller = compiler_by_path(tree)
    shown = ", ".join(objects[:5]) + (f" and {len(objects) - 5} more" if len(objects) > 5 else "")
    where = caller.split(":", 2) if caller else None
    fix_where = f"{where[0]}:{where[1]}" if where else "the build's own scripts"
    return "\n".join(
        [
            f"building {vendor}: {len(objects)} object{'s' if len(objects) != 1 else ''} "
            f"compiled without kiln's compiler wrapper: {shown}",
            *([f"    {caller}"] if caller else []),
            "  cause: the build runs a compiler by a path of its own"
            + (f" ({where[2].strip()})" if where else "")
            + ", not the one its environment names ($NVCC, $CXX, $CC, or nvcc by name, "
            "which find kiln's wrapper first): kiln's arch flags, "
            "deterministic flags, object cache and compile gate never reached those "
            "compiles, so kiln cannot vouch for the archs or the bytes they made",
            f"  fix: call the compiler as the environment names it in {fix_where} (e.g. "
            '"${NVCC:-nvcc}" for "$CUDA_HOME/bin/nvcc"): a patch in patches/ with its '
            "series.toml entry",
        ]
    )
