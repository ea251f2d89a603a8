"""The facts behind a failed import, for the cause table (:func:`kiln.inside.causes.
explain_load`): the undefined symbol demangled, which library of the consumer
environment defines it (or something of the same name with another signature), whether
the extension links that library, and where the upstream's tree declares and defines it
(and whether the build compiled that source). Read with binutils' ``nm`` and
``c++filt`` (where g++ is, they are), only when an import failed.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from kiln.inside import proc
from kiln.inside.causes.cause import LoadFailure
from kiln.inside.libraries import defined_symbols, runpath_to
from kiln.verify.imports import TORCH_LIBRARY, ImportFailure

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu")
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".cuh", ".inl")
SKIPPED_DIRS = {".git", ".kiln", "build", "dist", "__pycache__"}
MAX_SOURCE_BYTES = 2 * 2**20
# Namespaces of dependencies whose version the wheel was compiled against.
DEPENDENCY_NAMESPACES = (("torch", ("c10::", "at::", "torch::", "caffe2::", "pybind11::")),)


def demangle(symbols: list[str]) -> dict[str, str]:
    """symbol -> its C++ name (itself where it is not mangled, or c++filt is absent)."""
    if not symbols:
        return {}
    tool = shutil.which("c++filt")
    if tool is None:
        return {s: s for s in symbols}
    out = proc.run([tool, "--", *symbols], check=False).output.splitlines()
    if len(out) != len(symbols):
        return {s: s for s in symbols}
    return dict(zip(symbols, out, strict=True))


def qualified_name(cxx: str) -> str:
    """``ns::f<int>(int) const`` -> ``ns::f<int>``: the name without its parameters."""
    depth = 0
    for i, ch in enumerate(cxx):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            return cxx[:i]
    return cxx


def base_identifier(qualified: str) -> str:
    """``c10::detail::torchCheckFail`` -> ``torchCheckFail`` (template arguments dropped)."""
    text = re.sub(r"<.*>", "", qualified)
    return text.rsplit("::", 1)[-1].strip()


def _sources(tree: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES + HEADER_SUFFIXES):
                path = Path(dirpath) / name
                try:
                    if path.stat().st_size <= MAX_SOURCE_BYTES:
                        yield path
                except OSError:
                    continue


def find_in_tree(tree: Path, ident: str) -> tuple[list[str], list[str]]:
    """(declarations in headers, definitions) of function ``ident`` in the tree's
    sources, each as ``path:line`` relative to the tree."""
    head = rf"\b{re.escape(ident)}\s*\([^;{{}}]*\)\s*(?:const\s*)?(?:noexcept\s*)?"
    definition = re.compile(head + r"\{")
    declaration = re.compile(head + ";")
    declared: list[str] = []
    defined: list[str] = []
    for path in _sources(tree):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if ident not in text:
            continue
        rel = str(path.relative_to(tree))
        for m in definition.finditer(text):
            defined.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
        if path.name.endswith(HEADER_SUFFIXES):
            for m in declaration.finditer(text):
                declared.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
    return declared, defined


def gather(
    vendor: str,
    failure: ImportFailure,
    shared_object: str | None,
    needed: list[str],
    libraries: Mapping[str, list[tuple[str, str]]],
    versions: Mapping[str, str],
    own: Mapping[str, Path],
    tree: Path | None,
    compiled: set[str],
    torch_pin: str | None,
) -> LoadFailure:
    """The facts of one failed import. ``libraries``: the consumer environment's (file
    name -> [(path, distribution)]); ``own``: the output's shared objects on disk;
    ``compiled``: the sources the build compiled (tree-relative)."""
    demangled = None
    definers: list[str] = []
    runpath: str | None = None
    linked = False
    same_name: list[str] = []
    dependency = None
    declared: list[str] = []
    uncompiled: list[str] = []
    if failure.symbol:
        sym = failure.symbol
        demangled = demangle([sym])[sym]
        qualified = qualified_name(demangled)
        ident = base_identifier(qualified)
        dependency = next(
            (dep for dep, prefixes in DEPENDENCY_NAMESPACES if qualified.startswith(prefixes)),
            None,
        )
        candidates = [
            (name, path, f"{dist} {versions.get(dist, '?')}")
            for name, found in libraries.items()
            for path, dist in found
        ] + [(Path(rel).name, str(path), "the output itself") for rel, path in own.items()]
        mangled_ident = f"{len(ident)}{ident}"
        for name, path, owner in candidates:
            symbols = defined_symbols(path)
            if sym in symbols:
                definers.append(f"{name} ({owner})")
                if len(definers) == 1 and not owner.startswith(("torch ", "the output")):
                    runpath = runpath_to(shared_object, path)
                linked = linked or name in needed
                continue
            alike = [s for s in symbols if mangled_ident in s or s == ident]
            for other, cxx in demangle(alike[:50]).items():
                if other != sym and qualified_name(cxx) == qualified:
                    same_name.append(f"{name} ({owner}): {cxx}")
        if tree is not None and ident:
            declared, defined = find_in_tree(tree, ident)
            uncompiled = [d for d in defined if d.rsplit(":", 1)[0] not in compiled]
    library_owner = None
    library_runpath = None
    if failure.library:
        found = libraries.get(failure.library)
        if found:
            library_owner = ", ".join(sorted({f"{d} {versions.get(d, '?')}" for _p, d in found}))
            library_runpath = runpath_to(shared_object, found[0][0])
    return LoadFailure(
        vendor=vendor,
        module=failure.module,
        shared_object=shared_object,
        message=failure.last_line,
        symbol=failure.symbol,
        demangled=demangled,
        definers=tuple(definers),
        definer_runpath=runpath if definers else None,
        linked=linked,
        same_name=tuple(same_name[:3]),
        dependency=dependency,
        torch_pin=torch_pin,
        torch_environment=versions.get("torch"),
        declared_at=tuple(declared[:3]),
        defined_uncompiled=tuple(uncompiled[:3]),
        library=failure.library,
        library_owner=library_owner,
        library_runpath=library_runpath,
        library_is_torch=bool(failure.library and TORCH_LIBRARY.match(failure.library)),
        python_error=failure.python_error,
        frame=failure.frame,
        timed_out=failure.timed_out,
        gpu=failure.gpu,
    )
