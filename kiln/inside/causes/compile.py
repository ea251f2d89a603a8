"""The rows of a compile that failed on the upstream's code or its headers: a missing
header, a missing identifier (an older dependency), a C++ standard the code needs, an
object another compile of the build removed."""

from __future__ import annotations

import re
from pathlib import Path

from kiln.errors import FixEdit
from kiln.inside.causes.cause import Cause, Failure, toml_edit
from kiln.inside.causes.places import (
    DEPENDENCIES,
    HEADER_PACKAGES,
    Dependency,
    header_version,
    include_dirs,
    owner,
    packages_for,
    resolve,
    system_entry,
)

# --------------------------------------------------------------------------- the rows

_MISSING_HEADER = re.compile(
    r"(?:fatal error: (?P<a>[^\s:]+): No such file or directory)"
    r"|(?:cannot open source file \"(?P<b>[^\"]+)\")"
)


def missing_header(f: Failure) -> Cause | None:
    for err in f.d.errors:
        m = _MISSING_HEADER.search(err.message)
        if not m:
            continue
        header = m["a"] or m["b"]
        deb, pip = packages_for(header, HEADER_PACKAGES)
        where = f" (included from {err.file}:{err.line})" if err.file and err.line else ""
        cause = f"the header {header} is not installed where the build ran{where}"
        if header.startswith(("cutlass/", "cute/")):
            return Cause(
                "missing-header",
                cause,
                "it comes from the upstream's CUTLASS submodule: list it in "
                f"vendors/{f.vendor}.toml source.submodules",
            )
        if header.startswith(("torch/", "ATen/", "c10/")):
            return Cause(
                "missing-header",
                cause,
                "torch's headers: set the profile's torch (the build Python must have it)",
            )
        fixes = []
        if deb:
            fixes.append(f"apt-get install {deb} (Debian/Ubuntu, or in the builder image)")
        if pip:
            fixes.append(f"pip install {pip} (add it to the profile's build_tools)")
        if not fixes:
            fixes.append(
                f"install the package that provides {header} (Debian/Ubuntu: "
                f"apt-file search {header})"
            )
            deb = "PACKAGE"
        fix = "; or ".join(fixes)
        if deb:
            fix += "; " + system_entry(f.vendor, "header", header, deb)
        return Cause("missing-header", cause, fix)
    return None


_IDENTIFIER = (
    re.compile(r'identifier "(?P<id>[\w:]+)" is undefined'),
    re.compile(r"[‘'`](?P<id>[\w:]+)[’'] (?:was not declared in this scope|does not name a type)"),
    re.compile(r"use of undeclared identifier [‘'](?P<id>[\w:]+)[’']"),
    re.compile(r'namespace "(?P<id>[\w:]+)" has no member "(?P<member>\w+)"'),
    re.compile(r"[‘'](?P<member>\w+)[’'] is not a member of [‘'](?P<id>[\w:]+)[’']"),
    re.compile(r"no member named [‘'](?P<member>\w+)[’'] in namespace [‘'](?P<id>[\w:]+)[’']"),
)


def missing_identifier(f: Failure) -> Cause | None:
    found: dict[str, tuple[Dependency, list[str]]] = {}
    for message in f.messages:
        for rx in _IDENTIFIER:
            m = rx.search(message)
            if not m:
                continue
            ident = m["id"]
            member = m.groupdict().get("member")
            shown = f"{ident}::{member}" if member else ident
            for dep in DEPENDENCIES:
                if dep.matches(ident):
                    found.setdefault(dep.name, (dep, []))[1].append(shown)
                    break
            break
    if not found:
        return None
    dep, idents = next(iter(found.values()))
    idents = list(dict.fromkeys(idents))
    dirs = include_dirs(f)
    header = resolve(dep.header, dirs)
    names = ", ".join(idents[:4]) + (" ..." if len(idents) > 4 else "")
    if header is None:
        return Cause(
            "missing-identifier",
            f"{names} should come from {dep.name}'s {dep.header}, which is not on the "
            f"include path ({len(dirs)} folders searched)",
            f"install {dep.name}'s headers where the build runs (a pip wheel: the profile's "
            f"build_tools; else the builder image)",
        )
    include_dir = Path(str(header)[: -len(dep.header)])
    version = header_version(include_dir, dep) or "an unknown version"
    who = owner(header)
    dist = who[0] if who else dep.name
    came = f", from {who[0]} {who[1]}" if who else ""
    cause = (
        f"{dep.name}'s headers here do not declare {names}: {dep.header} resolved to "
        f"{header} ({dep.name} {version}{came}); this revision likely needs a newer {dep.name}"
    )
    pinned = pinned_by(dist) if who else None
    if pinned is not None:
        # the fix that changes the build environment, checked against the profile's pins
        # before it is printed: a newer wheel beside a torch that pins this one is
        # ResolutionImpossible
        pinner, spec = pinned
        return Cause(
            "missing-identifier",
            cause,
            f"{pinner} pins {spec}, so no newer {dist} can be installed beside it (a newer "
            f"pin in build_tools ends in ResolutionImpossible): build with a torch that pins "
            f"a newer {dist} (the profile's torch in kiln.toml, with its builder image), or "
            f"pin the upstream at a revision that does not use {names} "
            f"(vendors/{f.vendor}.toml source.commit)",
            resolve={
                "pinner": pinner.split()[0],
                "pinner_version": pinner.split()[1],
                "dist": dist,
                "above": spec.split("==", 1)[1],
            },
        )
    return Cause("missing-identifier", cause, dep.pin.format(dist=dist, version=version))


_PIN = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(?P<version>[^\s;,]+)")


def pinned_by(dist: str) -> tuple[str, str] | None:
    """Which installed distribution of the build Python pins ``dist`` exactly
    (``torch 2.14.1``, ``nvidia-nccl-cu13==2.30.7``), from the distributions' own
    ``Requires-Dist``: what a dry resolve of a newer ``dist`` would stop at."""
    from importlib import metadata

    want = re.sub(r"[-_.]+", "-", dist).lower()
    for d in metadata.distributions():
        for req in d.requires or []:
            m = _PIN.match(req)
            if m and re.sub(r"[-_.]+", "-", m["name"]).lower() == want and "extra ==" not in req:
                return f"{d.metadata['Name']} {d.version}", f"{m['name']}=={m['version']}"
    return None


_CXX_STD = re.compile(r"C\+\+\s?(?P<std>\d\d)\b")


# What C++20 code compiled as C++17 says (nvcc's EDG front end, then g++): a C++20
# keyword read as an identifier, or a C++20 name of std that the header left out.
_CXX20_KEYWORD = re.compile(
    r'identifier "(?P<a>concept|requires|consteval|constinit|co_await|co_return|co_yield|'
    r'char8_t)" is undefined'
    r"|[‘'](?P<b>concept|requires|consteval|constinit|co_await|co_return|co_yield)[’'] "
    r"(?:does not name a type|was not declared in this scope|only available with)"
)
_CXX20_STD = re.compile(
    r'namespace "std" has no member "(?P<a>\w+)"'
    r"|[‘'](?P<b>\w+)[’'] is not a member of [‘']std[’']"
)
CXX20_NAMES = frozenset(
    {
        "floating_point",
        "integral",
        "signed_integral",
        "unsigned_integral",
        "same_as",
        "derived_from",
        "convertible_to",
        "invocable",
        "regular_invocable",
        "predicate",
        "totally_ordered",
        "equality_comparable",
        "three_way_comparable",
        "span",
        "bit_cast",
        "remove_cvref_t",
        "type_identity",
        "is_constant_evaluated",
        "source_location",
        "ranges",
        "format",
        "endian",
        "countl_zero",
        "popcount",
        "bit_width",
        "to_address",
    }
)


def _cxx_edit(f: Failure, std: str, unit: str | None) -> FixEdit:
    """:func:`_cxx_fix` as an edit (the C++ units' key too where the unit is not CUDA)."""
    key = "nvcc_append_flags" if unit and unit.endswith(".cu") else "cxx_append_flags"
    return toml_edit(f.vendor, ["build", key], append=[f"-std={std}"])


def _cxx_fix(f: Failure, std: str, unit: str | None) -> str:
    """The flag that sets the standard, for the compiler that compiles ``unit``."""
    if unit and unit.endswith(".cu"):
        return (
            f'add build.nvcc_append_flags = ["-std={std}"] to vendors/{f.vendor}.toml '
            f"({unit} is compiled by nvcc): kiln's compiler wrapper appends it, so it wins "
            "over the upstream's -std"
        )
    return (
        f'add build.cxx_append_flags = ["-std={std}"] (C++ units) and, for CUDA units, '
        f'build.nvcc_append_flags = ["-std={std}"] to vendors/{f.vendor}.toml: kiln\'s '
        f"compiler wrapper appends them, so they win over the upstream's -std"
    )


def cxx20_code(f: Failure) -> Cause | None:
    """The upstream's own C++20 code (a concept, std::floating_point) compiled as C++17:
    the same cause and fix as a header that refuses C++17."""
    for err in f.d.errors:
        keyword = _CXX20_KEYWORD.search(err.message)
        member = _CXX20_STD.search(err.message)
        if keyword:
            name = keyword["a"] or keyword["b"]
        elif member and (member["a"] or member["b"]) in CXX20_NAMES:
            name = f"std::{member['a'] or member['b']}"
        else:
            continue
        where = f"{err.file}:{err.line}" if err.file and err.line else f.d.unit or "its code"
        return Cause(
            "cxx-standard",
            f"the upstream's own code is C++20 ({name} at {where}) and this unit was compiled "
            "with an older -std (the upstream hard-codes it)",
            _cxx_fix(f, "c++20", err.file or f.d.unit),
            edit=_cxx_edit(f, "c++20", err.file or f.d.unit),
        )
    return None


def cxx_standard(f: Failure) -> Cause | None:
    for err in f.d.errors:
        text = err.message
        if "#error" not in text and "requires compiler and library support" not in text:
            continue
        if "C++" not in text or not re.search(r"or later|or newer|too old|requires|support", text):
            continue
        m = _CXX_STD.search(text)
        std = f"c++{m['std']}" if m else "c++20"
        where = f" ({err.file}:{err.line})" if err.file else ""
        return Cause(
            "cxx-standard",
            f"a header refuses the C++ standard this unit was compiled with{where}: it needs "
            f"C++{std[3:]} or later (the upstream hard-codes an older -std)",
            _cxx_fix(f, std, f.d.unit),
            edit=_cxx_edit(f, std, f.d.unit),
        )
    return cxx20_code(f)


_OUTPUT_GONE = re.compile(
    r"the compile of (?P<source>\S+) succeeded and its output is gone: another compile"
)


def output_gone(f: Failure) -> Cause | None:
    """Two compiles of one build wrote one object file at once (kiln's compiler wrapper
    found a successful compile's output gone): the upstream's build races with itself."""
    for err in f.d.errors:
        m = _OUTPUT_GONE.search(err.message) if err.tool == "kiln" else None
        if not m:
            continue
        obj = err.file or "the object"
        return Cause(
            "object-written-twice",
            f"two compiles of this build wrote {obj} at once (one of them from "
            f"{m['source']}): the upstream compiles one source into one object path for "
            f"two targets (two extensions of a parallel build_ext, two CMake targets), and "
            f"one removed or rewrote it under the other",
            f"give each target its own copy or object path for {m['source']} (a patch of the "
            f"build file in patches/), or build them one after the other",
        )
    return None
