"""Findings + the workspace's profile -> a vendor TOML, every choice commented.

Each key is decided by one rule (docs/add.md lists them) and written with a comment that
says what kiln found (file:line and what the line says) and why that gives this value.
What kiln cannot decide is written commented out, with what it saw, for a person to
judge. The text is made with tomlkit, so it reads like the hand-written recipes.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import tomlkit
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from tomlkit.items import Table

from kiln.config.fields import ARCH_RE
from kiln.config.models import Profile
from kiln.errors import ConfigError
from kiln.verbs.add import license_text, makefile, pysetup
from kiln.verbs.add.scan import Findings
from kiln.verify import cmakeswitch

# What kiln sets for every build itself (plan/environment.py, the scheduler, the compiler
# wrapper): a recipe never sets these.
KILN_SETS = frozenset(
    {
        "TORCH_CUDA_ARCH_LIST",
        "MAX_JOBS",
        "NVCC_THREADS",
        "CUDA_HOME",
        "CUDA_PATH",
        "SOURCE_DATE_EPOCH",
        "PATH",
        "CC",
        "CXX",
        "NVCC",
        "PYTORCH_NVCC",
    }
)
# Estimated peak memory of one compile at one nvcc thread, GiB (vendor-notes, "Observed
# builds"): a .cu that includes CUTLASS/CuTe peaked at 9.2 GiB in cicc (FMHA kernels,
# --threads 1); every other unit of three torch extensions (g++ or nvcc, torch headers
# included) stayed under 2.5 GiB. The recipe's figure is per compile: times its threads.
MEM_CUTLASS_GIB = 9.5
MEM_OTHER_GIB = 3.0
# The first torch release whose headers refuse C++17 (pytorch/pytorch#178150 raised the
# guard in ATen/ATen.h and torch/all.h to C++20); used only when the build venv's
# headers cannot be read.
TORCH_CXX20_SINCE = (2, 14)
_WIDTH = 90


class DecidedBuild(TypedDict, total=False):
    """The ``[build]`` keys ``add`` decided, as they are written (the TOML's own shapes)."""

    kind: Literal["wheel", "inplace"]
    command: list[str]
    outputs: list[str]
    archs: list[str]
    arch_control: str
    arch_toggles: dict[str, dict[str, str]]
    arch_also: dict[str, list[str]]
    nvcc_threads: int | None
    mem_per_job_gib: float
    nvcc_drop_flags: list[str]
    cxx_append_flags: list[str]
    nvcc_append_flags: list[str]
    env: dict[str, str]
    system: list[dict[str, str]]
    build_tools: list[str]
    import_check: str
    runtime_libraries: list[dict[str, str]]


class DecidedSubmodule(TypedDict):
    path: str
    commit: str
    license_id: str | None


class DecidedSource(TypedDict, total=False):
    url: str
    commit: str
    license: str | None
    license_id: str | None
    submodules: list[DecidedSubmodule]


@dataclass
class Decided:
    """What ``add`` decided: the keys of the recipe it writes."""

    source: DecidedSource = field(default_factory=lambda: DecidedSource())
    build: DecidedBuild = field(default_factory=lambda: DecidedBuild())


@dataclass
class Recipe:
    """The decided keys (what the tests compare) and the TOML text."""

    data: Decided = field(default_factory=Decided)
    text: str = ""


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH - 2, break_long_words=False, break_on_hyphens=False)


def _say(table: Any, text: str) -> None:
    for line in _wrap(text):
        table.add(tomlkit.comment(line))


def _sm(arch: str) -> tuple[int, str]:
    m = ARCH_RE.match(arch)
    assert m, arch
    return int(m.group(1)), m.group(2)


def family_candidates(common: list[str], hard: list[str], keep: list[str]) -> list[str]:
    """The archs of ``common`` not kept whose family a hard-coded 'a' target of ``hard``
    is of (sm_103a beside a hard-coded sm_100a): whether its code builds there is for the
    compiler to say (add compiles the first CUDA unit for each)."""
    return [
        a
        for a in common
        if a not in keep
        and any(_sm(h)[1] == "a" and _sm(h)[0] // 10 == _sm(a)[0] // 10 for h in hard)
    ]


def table_targets(f: Findings) -> list[str]:
    """The targets an upstream's own arch tables ask nvcc for: their keys, as
    TORCH_CUDA_ARCH_LIST spells them (``10.0a`` -> ``sm_100a``)."""
    found = []
    for m in f.setup:
        for keys, _seen in m.arch_tables:
            for key in keys:
                spelt = re.fullmatch(r"(\d+)\.(\d)([af]?)", key.removesuffix("+PTX"))
                if spelt:
                    found.append(f"sm_{spelt[1]}{spelt[2]}{spelt[3]}")
    return list(dict.fromkeys(found))


def family_to_check(f: Findings, profiles: dict[str | None, Profile]) -> list[str]:
    """The archs :func:`_archs` would leave out as of a hard-coded 'a' target's family
    (setup.py hard-codes sm_100a, or its own arch table knows 10.0a, and the profile has
    sm_103a), for add to compile the first CUDA unit for each before drafting; [] where
    the draft is decided otherwise."""
    flags, common = f.arch_flags, common_archs(profiles) or list(profiles[None].archs)
    literal = [fl for fl in flags if fl.archs]
    sms = list(dict.fromkeys(a for fl in literal for a in fl.archs if a.startswith("sm_")))
    toggled = all(fl.toggle for fl in flags) and len({fl.toggle for fl in flags}) == len(flags)
    if not f.device_sources or not flags or (literal and toggled):
        return []
    hard = sms or table_targets(f)
    keep = [a for a in common if any(_allows(h, a) for h in hard)]
    return family_candidates(common, hard, keep) if keep else []


def _also(hard: list[str], proven: list[str]) -> dict[str, list[str]]:
    """``build.arch_also``: each hard-coded 'a' target -> the proven archs of its family."""
    return {
        h: [a for a in proven if _sm(a)[0] // 10 == _sm(h)[0] // 10] for h in _kin(hard, proven)
    }


def _family_said(
    f: Findings, hard: list[str], family: list[str], why: str
) -> tuple[str, list[str], dict[str, list[str]]]:
    """``why`` told what add's check compiles said of ``family`` (archs of the family of
    a hard-coded 'a' target of ``hard``); the proven ones and their ``arch_also``."""
    checked = f.family_checked or {}
    proven = [a for a in family if a in checked and checked[a] is None]
    refused = [a for a in family if checked.get(a)]
    unit = f.device_sources[0] if f.device_sources else "its first CUDA unit"
    if proven:
        kin = ", ".join(_kin(hard, proven))
        them = "it" if len(proven) == 1 else "each"
        why += (
            f" {', '.join(proven)} too: of the family of the hard-coded {kin}, and add "
            f"compiled {unit} for {them} alone (the compiler proves the code builds there; "
            f"an arch guard in it would have refused): build.arch_also has the rewrite "
            f"build a unit asking for {kin} for {'it' if len(proven) == 1 else 'them'} too."
        )
    for arch in refused:
        why += f" Not {arch}: the compiler refuses {unit} for it at add ({checked[arch]})."
    unchecked = [a for a in family if a not in checked]
    if unchecked:
        kins = _kin(hard, unchecked)
        why += (
            f" Not {', '.join(unchecked)}: of the family of the hard-coded "
            f"{', '.join(kins)}, but an 'a' target's code may use features of that arch "
            f"alone, and add did not compile {unit} to check; where it is valid on the "
            f"family, a patch asking for the family target (sm_{_sm(kins[0])[0]}f) builds "
            f"{', '.join(unchecked)} too (add them to archs then)."
        )
    return why, proven, _also(hard, proven)


def _kin(hard: list[str], family: list[str]) -> list[str]:
    """The hard-coded 'a' targets of whose family ``family``'s archs are."""
    return [
        h
        for h in hard
        if _sm(h)[1] == "a" and any(_sm(h)[0] // 10 == _sm(a)[0] // 10 for a in family)
    ]


def _allows(hard: str, wanted: str) -> bool:
    """Whether code written for the hard-coded arch ``hard`` can be compiled for
    ``wanted``: an arch-specific target (``a``) only for itself, a family target
    (``f``) for its family (the same major), a plain one for itself and anything newer."""
    (hn, hs), (wn, _ws) = _sm(hard), _sm(wanted)
    if hs == "a":
        return hard == wanted
    if hs == "f":
        return hn // 10 == wn // 10
    return wn >= hn


def common_archs(profiles: dict[str | None, Profile]) -> list[str]:
    """The archs every profile of the workspace has, in ``[profile]``'s order: a recipe's
    archs must be in the profile it is built with, whichever ``--profile`` that is."""
    first = profiles[None].archs
    return [a for a in first if all(a in p.archs for p in profiles.values())]


def build(
    f: Findings, profiles: dict[str | None, Profile], name: str, rev: str | None, rev_how: str
) -> Recipe:
    r = Recipe()
    doc = tomlkit.document()
    asked = f"{f.url}@{rev}" if rev else f.url
    _say(doc, f"{name} at {f.commit[:12]}, written by `kiln add {asked}` ({rev_how}).")
    _say(
        doc,
        "Each key says what kiln found in the tree (file:line: what the line says) and "
        "why it chose so; lines kiln could not decide are commented out. docs/add.md has "
        "the rules.",
    )
    ext = f" ({', '.join(f.extensions)})" if f.extensions else ""
    doc.add("description", f"{f.title}{ext}")
    doc.add(tomlkit.nl())
    doc.add("source", _source(f, r))
    build_table = _build(f, profiles, r)
    doc.add(tomlkit.nl())
    doc.add("build", build_table)
    r.text = tomlkit.dumps(doc)
    return r


# --------------------------------------------------------------------------- source


def _license_id(table: Any, lic: license_text.LicenseFile | None, what: str) -> str | None:
    if lic is None or lic.spdx is None:
        how = lic.how if lic is not None else "no license file"
        _say(table, f'{how}: no license id; set by hand: license_id = "<SPDX id>" ({what})')
        return None
    _say(table, f"{lic.how}.")
    table.add("license_id", lic.spdx)
    return lic.spdx


def _source(f: Findings, r: Recipe) -> Table:
    t = tomlkit.table()
    t.add("url", f.url)
    t.add("commit", f.commit)
    src = DecidedSource(url=f.url, commit=f.commit, submodules=[])
    if f.license is None:
        _say(t, "No license file at the top of the tree (LICENSE, COPYING, ...): a release")
        _say(t, "cannot ship it without one; name it here once found.")
        t.add(tomlkit.comment('license = "LICENSE"'))
        src["license"], src["license_id"] = None, None
    else:
        t.add("license", f.license.path)
        src["license"] = f.license.path
        src["license_id"] = _license_id(t, f.license, "the upstream")
    aot = tomlkit.aot()
    for sub in f.submodules:
        s = tomlkit.table()
        _say(
            s,
            f".gitmodules: {sub.path} from {sub.url}; the tree's gitlink pins "
            f"{sub.commit[:12]} (what a checkout initialises).",
        )
        s.add("path", sub.path)
        s.add("commit", sub.commit)
        entry: DecidedSubmodule = {"path": sub.path, "commit": sub.commit, "license_id": None}
        if sub.license is None:
            _say(s, "No license file in the submodule: name it (license = ...) or the build")
            _say(s, "stops before compiling (a release cannot ship its code without one).")
        else:
            if sub.license_named:  # kiln's license collection would not pick it by itself
                s.add("license", sub.license.path)
            entry["license_id"] = _license_id(s, sub.license, f"submodule {sub.path}")
        src["submodules"].append(entry)
        aot.append(s)
    if f.submodules:
        t.add("submodules", aot)
    r.data.source = src
    return t


# --------------------------------------------------------------------------- build


def _build(f: Findings, profiles: dict[str | None, Profile], r: Recipe) -> Table:
    t = tomlkit.table()
    b = DecidedBuild()
    _kind(t, f, b)
    _archs(t, f, profiles, b)
    _parallelism(t, f, b)
    _memory(t, f, b)
    _flags(t, f, b)
    _build_tools(t, f, b)
    _cmake_module(t, f, profiles, b)
    _make_module(t, f, b)
    _build_system(t, f)
    _arch_table_note(t, f, b)
    _env(t, f, b)
    _system(t, f, b)
    _say(
        t,
        f"No [build.gpu_test]: kiln add does not guess which of the upstream's tests "
        f"proves a wheel on a GPU ({len(f.tests)} test file(s) under tests/); add one by "
        f"hand for `kiln gpu-test`.",
    )
    r.data.build = b
    return t


def _kind(t: Table, f: Findings, b: DecidedBuild) -> None:
    be = f.backend
    torch_ext = f.first("torch_extension")
    if be.kind in ("setuptools", "pep517"):
        why = f"{be.detail}"
        if torch_ext:
            why += f"; {torch_ext}"
        _say(t, f"{why}: a wheel (kiln builds it with isolation off, in the build venv).")
        t.add("kind", "wheel")
        b["kind"] = "wheel"
        return
    if be.kind == "script":
        _say(
            t,
            f"No setup.py or pyproject.toml [build-system]; {be.detail} at the top: built in "
            f"place by that script. kiln cannot tell which files it leaves: check outputs "
            f"and add import_check.",
        )
        run = ["bash", be.detail] if be.detail.endswith(".sh") else ["python", be.detail]
        t.add("kind", "inplace")
        t.add("command", run)
        t.add("outputs", ["**/*.so"])
        b.update({"kind": "inplace", "command": run, "outputs": ["**/*.so"]})
        return
    if be.kind == "make" and f.make is not None:
        _make(t, f, b)
        return
    if be.kind == "cmake" and f.cmake is not None:
        _cmake(t, f, b)
        return
    raise ConfigError(
        f"{f.url} at {f.commit[:12]}: {be.detail}: kiln add cannot tell how it is built; "
        f"write vendors/NAME.toml by hand (docs/add.md)"
    )


# CMake configured into build/ (which the release leaves out), every library written to
# the top of the tree (what the release ships and its import root), the build venv's
# Python for FindPython3 and FindPythonInterp alike, as many jobs as kiln's scheduler
# gives (kiln's wrapper is CMake's CUDA compiler already: CUDACXX).
CMAKE_BUILD_DIR = "build/kiln-cmake"


def cmake_command(defines: Sequence[str] = ()) -> list[str]:
    """The in-place CMake build, with ``defines`` (``-DNAME=VALUE``: the switches that
    build the CUDA part) on its configure line."""
    extra = "".join(f"{shlex.quote(d)} " for d in defines)
    return [
        "sh",
        "-c",
        f"cmake -S . -B {CMAKE_BUILD_DIR} -DCMAKE_BUILD_TYPE=Release {extra}"
        '"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=$PWD" "-DPython3_EXECUTABLE=$(command -v python)" '
        '"-DPYTHON_EXECUTABLE=$(command -v python)" '
        f'&& cmake --build {CMAKE_BUILD_DIR} -j "${{MAX_JOBS:-1}}"',
    ]


CMAKE_COMMAND = cmake_command()


def _cmake(t: Table, f: Findings, b: DecidedBuild) -> None:
    """A CMake project built in place: configured and built by the machine's cmake, its
    shared libraries at the top of the tree."""
    cm = f.cmake
    assert cm is not None
    cuda = f"{cm.cuda}: CUDA as a language" if cm.cuda else "CUDA not enabled in CMake's files"
    _say(
        t,
        f"No setup.py, pyproject.toml [build-system] or build script; a CMakeLists.txt at the "
        f"top ({cuda}): built in place by the machine's cmake (where builds run: install it "
        f"there), configured into {CMAKE_BUILD_DIR} (build/ stays out of the release), each "
        f"library written to the top of the tree (CMAKE_LIBRARY_OUTPUT_DIRECTORY), the build "
        f"venv's Python for FindPython. CMake's CUDA compiler is kiln's wrapper (CUDACXX).",
    )
    t.add("kind", "inplace")
    switches = _cuda_switches(t, f)
    command = cmake_command([sw.define() for sw in switches])
    t.add("command", command)
    outputs = list(dict.fromkeys(target.pattern for target in cm.targets))
    for target in cm.targets:
        _say(t, f"{target.seen}: a shared library, {target.pattern} at the top of the tree.")
    if not outputs:
        _say(t, "No add_library(... SHARED|MODULE) or Python module target: every .so.")
        outputs = ["*.so"]
    t.add("outputs", outputs)
    b.update({"kind": "inplace", "command": command, "outputs": outputs})


def _cuda_switches(t: Table, f: Findings) -> list[cmakeswitch.Switch]:
    """The CMake switches whose defaults leave the CUDA part out, each said where it is
    declared and where it gates that part; the draft sets each (the build refuses a
    recipe that does not, before its first compile)."""
    for sw in f.cmake_switches:
        _say(
            t,
            f"{sw.declared}: {sw.name} defaults to {sw.default or '(empty)'}, which leaves the "
            f"CUDA part out ({sw.gates} compiles it only for {sw.enables}): set to "
            f"{sw.enables} ({sw.define()}).",
        )
    return list(f.cmake_switches)


def make_command(mk: makefile.Makefile) -> list[str]:
    """make with kiln's jobs, each variable naming nvcc set to kiln's wrapper ($NVCC) on its
    command line (where a ``?=``, ``=`` or ``:=`` in the file cannot override it), asked
    for the shared objects alone where the file names them all literally."""
    asked = [s.target for s in mk.shared]
    goals = [a for a in asked if a] if asked and all(asked) else []
    sets = [f'{var}="$NVCC"' for var in dict.fromkeys(v for v, _ in mk.nvcc_vars)]
    line = " ".join(["make -f", mk.name, '-j "${MAX_JOBS:-1}"', *sets, *goals])
    return ["sh", "-c", line]


def _make(t: Table, f: Findings, b: DecidedBuild) -> None:
    """A Makefile built in place: make asked for the shared objects, nvcc through kiln's
    wrapper."""
    mk = f.make
    assert mk is not None
    command = make_command(mk)
    said = [
        f"No setup.py, pyproject.toml [build-system] or build script; {mk.name} at the top: "
        f"built in place by make."
    ]
    if mk.shared and all(s.target for s in mk.shared):
        rules = ", ".join(str(s.seen) for s in mk.shared)
        said.append(
            f"Asked for the shared objects its rules make ({rules}), not its default goal "
            f"(often a test program the release does not ship)."
        )
    elif mk.shared:
        said.append(f"Its default goal ({mk.shared[0].seen}: a name make expands).")
    for _, seen in mk.nvcc_vars:
        said.append(f"{seen}: names nvcc; set to kiln's wrapper on make's command line.")
    for seen in mk.literal_nvcc:
        said.append(
            f"{seen}: runs nvcc by its path, past kiln's wrapper: the build names that compile "
            f"as bypassing it; a patch using $(NVCC) there fixes it."
        )
    _say(t, " ".join(said))
    outputs = [s.pattern for s in mk.shared] or ["**/*.so"]
    if not mk.shared:
        _say(t, "No rule names a shared object: every .so of the tree.")
    t.add("kind", "inplace")
    t.add("command", command)
    t.add("outputs", outputs)
    b.update({"kind": "inplace", "command": command, "outputs": outputs})


def _make_module(t: Table, f: Findings, b: DecidedBuild) -> None:
    """A Makefile's Python module: an output whose file a source declares a module of its
    name, imported by its path from the top of the tree (a folder without __init__.py is
    a namespace package: ``lib/example.so`` is ``import lib.example``)."""
    if f.make is None:
        return
    for shared in f.make.shared:
        module = shared.pattern.removesuffix(".so").rstrip("*").replace("/", ".")
        stem = module.rsplit(".", 1)[-1]
        if stem in f.make.modules:
            _say(
                t,
                f"{f.make.modules[stem]}: the Python module {stem}, made at {shared.pattern}: "
                f"imported where the release lands as {module}.",
            )
            t.add("import_check", module)
            b["import_check"] = module
            return


def _cmake_module(
    t: Table, f: Findings, profiles: dict[str | None, Profile], b: DecidedBuild
) -> None:
    """A CMake project's Python module: the import the proof runs, and the Python library
    a module links (its DT_NEEDED, a system package where the release lands)."""
    cm = f.cmake
    if cm is None:
        return
    modules = cm.python_modules()
    if modules:
        target, seen = modules[0]
        _say(t, f"{seen}: the Python module {target.name}: imported where the release lands.")
        t.add("import_check", target.name)
        b["import_check"] = target.name
    if cm.libpython:
        py = profiles[None].python
        soname, package = f"libpython{py}.so.1.0", f"libpython{py}"
        _say(
            t,
            f"{cm.libpython}: links the Python library into the module (an extension needs "
            f"the interpreter's symbols only: Python3::Module does that), so it needs "
            f"{soname} where it lands: declared as the system's (Debian's {package}); a "
            f"patch linking Python3::Module drops the need.",
        )
        libs = tomlkit.aot()
        entry = tomlkit.table()
        entry.add("soname", soname)
        entry.add("package", package)
        libs.append(entry)
        t.add("runtime_libraries", libs)
        b["runtime_libraries"] = [{"soname": soname, "package": package}]


def _torch_arch(arch: str) -> str:
    """``sm_103a`` -> ``10.3a``: how TORCH_CUDA_ARCH_LIST (and upstream tables) spell it."""
    m = re.match(r"sm_(\d+)(\d)([af]?)$", arch)
    return f"{m[1]}.{m[2]}{m[3]}" if m else arch


def _arch_table_note(t: Table, f: Findings, b: DecidedBuild) -> None:
    """An arch table of the upstream's own (keys spelled as TORCH_CUDA_ARCH_LIST spells
    them) without an entry for an arch the recipe builds: that arch would be dropped; kiln
    stops at the first compile then, and the draft says so now. (Under the rewrite the
    archs are decided by what the table's targets cover and the compiler builds.)"""
    if b.get("arch_control") == "rewrite":
        return
    archs = list(b.get("archs") or [])
    for m in f.setup:
        for keys, seen in m.arch_tables:
            have = {k.removesuffix("+PTX") for k in keys}
            dropped = [a for a in archs if _torch_arch(a) not in have]
            if dropped:
                _say(
                    t,
                    f"{seen}: setup.py maps archs through a table of its own ({', '.join(keys)}), "
                    f"with no entry for {', '.join(_torch_arch(a) for a in dropped)}: the "
                    f"upstream will drop {', '.join(dropped)} of this recipe (kiln stops at its "
                    f"first compile); give the table an entry (a patch in patches/) or leave "
                    f"{', '.join(dropped)} out of archs.",
                )


def _archs(t: Table, f: Findings, profiles: dict[str | None, Profile], b: DecidedBuild) -> None:
    flags = f.arch_flags
    common = common_archs(profiles)
    if len(profiles) > 1:
        named = ", ".join(f"[profiles.{p}]" for p in profiles if p)
        where = f"the archs every profile has ([profile], {named}: {', '.join(common)})"
    else:
        where = f"the profile's archs ({', '.join(common)})"
    if not common:
        common = list(profiles[None].archs)
        where = (
            f"[profile]'s archs ({', '.join(common)}): no arch is in every profile, so "
            f"a profile without one of these refuses this recipe"
        )
    device = f.device_sources
    b["arch_toggles"] = {}
    if not device:
        named = ", ".join(s for s, _ in f.sources[:3]) or "none"
        _say(
            t,
            f"No CUDA source among the units the build compiles ({named}"
            f"{', ...' if len(f.sources) > 3 else ''}): no device code at build time (a JIT, "
            f"if any, compiles kernels where they run); the wheel must hold none.",
        )
        t.add("archs", tomlkit.array())
        t.add("arch_control", "none")
        b.update({"archs": [], "arch_control": "none"})
        return
    literal = [fl for fl in flags if fl.archs]
    sms = list(dict.fromkeys(a for fl in literal for a in fl.archs if a.startswith("sm_")))
    if (
        literal
        and all(fl.toggle for fl in flags)
        and len({fl.toggle for fl in flags}) == len(flags)
    ):
        toggles = {a: {fl.toggle[0]: fl.toggle[1]} for fl in literal for a in fl.archs}  # type: ignore[index]
        for fl in literal:
            _say(t, f"{fl.seen} (under an if on {fl.toggle[0]}).")  # type: ignore[index]
        _say(
            t,
            f"setup.py builds {', '.join(sms)} unless told to leave one out; the profile's "
            f"archs choose (an arch not in the profile is left out through its variable).",
        )
        t.add("archs", sms)
        t.add("arch_control", "toggles")
        inline = tomlkit.inline_table()
        for arch, env in toggles.items():
            inner = tomlkit.inline_table()
            inner.update(env)
            inline.append(arch, inner)
        t.add("arch_toggles", inline)
        b.update({"archs": sms, "arch_control": "toggles", "arch_toggles": toggles})
        return
    if flags:
        for fl in flags[:4]:
            _say(t, f"{fl.seen}")
        also: dict[str, list[str]] = {}
        if sms:
            keep = [a for a in common if any(_allows(h, a) for h in sms)]
            why = (
                f"setup.py hard-codes {', '.join(sms)} and no variable leaves one out: kiln's "
                f"compiler wrapper rewrites every compile's arch flags to the recipe's archs. "
                f"Kept from {where}: those the hard-coded code can be compiled for (an "
                f"'a' arch only for itself, an 'f' arch for its family, a plain one for newer)."
            )
            if not keep:
                keep = list(common)
                why += f" None of {where} fits them: all of them; check each compiles."
            family = family_candidates(common, sms, keep)
            why, proven, also = _family_said(f, sms, family, why)
            keep = [a for a in common if a in keep or a in proven]
        else:
            keep = list(common)
            tables = [(keys, seen) for m in f.setup for keys, seen in m.arch_tables]
            how = (
                f"through a table of its own ({tables[0][1]}: {', '.join(tables[0][0])})"
                if tables
                else "(no arch is spelt in its text)"
            )
            why = (
                f"setup.py computes its arch flags {how}: kiln's compiler wrapper rewrites "
                f"every compile's arch flags to the recipe's archs"
            )
            table = table_targets(f)
            covered = [a for a in common if any(_allows(h, a) for h in table)]
            if covered:
                # the table asks nvcc for its own targets: an arch it has no entry for is
                # built only where one of them covers it, or where the compiler proves the
                # code of its family's target builds there (build.arch_also)
                why += f", those its table's targets cover: {', '.join(covered)} of {where}."
                family = family_candidates(common, table, covered)
                why, proven, also = _family_said(f, table, family, why)
                keep = [a for a in common if a in covered or a in proven]
                left = [a for a in common if a not in keep and a not in family]
                if left:
                    them = "it" if len(left) == 1 else "them"
                    why += (
                        f" Not {', '.join(left)}: no target of its table covers {them}; give "
                        f"the table an entry (a patch in patches/) to build {them}."
                    )
            else:
                why += f", all of {where}; check that the code compiles for each."
        _choose(t, b, why, keep, "rewrite")
        if also:
            inline = tomlkit.inline_table()
            for asked, archs in also.items():
                inline.append(asked, archs)
            t.add("arch_also", inline)
            b["arch_also"] = also
        return
    torch_ext = f.first("torch_extension")
    reads = [r for r in f.env_reads if r.name == "TORCH_CUDA_ARCH_LIST"]
    if torch_ext:
        keep = [a for a in common if not a.endswith("f")]
        left = [a for a in common if a.endswith("f")]
        why = (
            f"{torch_ext}, no arch flag of its own: torch turns TORCH_CUDA_ARCH_LIST into "
            f"-gencode flags, and kiln sets it to the recipe's archs: {where}."
        )
        defaults = sorted({r.default for r in reads if r.default})
        if reads:
            lines = ", ".join(str(r.seen.line) for r in reads)
            why += f" setup.py reads it itself ({reads[0].seen.file}:{lines})"
            if defaults:
                why += f" and falls back to {' or '.join(defaults)} when it is unset"
            why += ": kiln always sets it."
        if left:
            why += (
                f" {', '.join(left)} left out: torch refuses family targets in "
                f"TORCH_CUDA_ARCH_LIST (ValueError on 10.0f)."
            )
        _choose(t, b, why, keep, "torch-arch-list")
        return
    if f.make is not None and f.make.arch_lines:
        for seen in f.make.arch_lines[:4]:
            _say(t, f"{seen}")
        how = f"{f.make.name} spells its own arch flags (above)"
    else:
        how = "no arch flag kiln can see (not torch's extension build): nvcc's own default "
        how += "or the build system's list decides"
    _say(
        t,
        f"{len(device)} CUDA source(s) and {how}, so kiln's wrapper rewrites every "
        f"compile's arch flags to {where}.",
    )
    t.add("archs", list(common))
    t.add("arch_control", "rewrite")
    b.update({"archs": list(common), "arch_control": "rewrite"})


def _choose(t: Table, b: DecidedBuild, why: str, archs: list[str], mode: str) -> None:
    """Write the decided ``archs`` and ``arch_control`` under the comment saying why."""
    _say(t, why)
    t.add("archs", archs)
    t.add("arch_control", mode)
    b.update({"archs": archs, "arch_control": mode})


def _parallelism(t: Table, f: Findings, b: DecidedBuild) -> None:
    threads = f.first("threads_flag")
    reads = [r for r in f.env_reads if r.name == "NVCC_THREADS"]
    b["nvcc_threads"] = None
    if threads and reads:
        cap = max(1, len(b["archs"]))
        _say(
            t,
            f"{reads[0].seen} and {threads}: setup.py turns NVCC_THREADS into nvcc "
            f"--threads N. nvcc's threads compile a file's -gencode targets side by side, so "
            f"more threads than archs only cost memory: capped at {cap} (the archs above).",
        )
        t.add("nvcc_threads", cap)
        b["nvcc_threads"] = cap
    elif f.device_sources and f.make is not None:
        _say(t, "NVCC_THREADS: the Makefile does not read it; MAX_JOBS: make -j takes it.")
    elif f.device_sources and f.cmake is not None:
        _say(
            t,
            "NVCC_THREADS: the CMake build does not read it (nothing to cap); MAX_JOBS: "
            "cmake --build -j takes kiln's scheduler's.",
        )
    elif f.device_sources:
        _say(t, "NVCC_THREADS: setup.py does not read it (nothing to cap).")
    build_ext = f.first("build_extension")
    if build_ext:
        _say(
            t,
            f"MAX_JOBS: {build_ext}: torch's BuildExtension runs ninja with MAX_JOBS jobs; "
            f"kiln's scheduler sets it from the memory budget (no cap).",
        )
    elif "scikit_build_core" in f.backend.detail:
        _say(
            t,
            f"MAX_JOBS: {f.backend.detail}: CMake builds the units with its generator's own "
            f"parallelism (ninja), not setuptools (no cap).",
        )
    elif f.setup:
        _say(
            t,
            f"MAX_JOBS: setup.py does not use torch's BuildExtension: setuptools compiles "
            f"its {len(f.sources)} unit(s) one after another (no cap).",
        )


def _memory(t: Table, f: Findings, b: DecidedBuild) -> None:
    """Per compile, its nvcc threads included (each thread runs a ``cicc`` of its own)."""
    threads = b.get("nvcc_threads") or 1
    heavy = f.cutlass_units()
    times = f" x {threads} nvcc threads" if threads > 1 else ""
    if heavy:
        src, header = next(iter(heavy.items()))
        value = MEM_CUTLASS_GIB * threads
        _say(
            t,
            f"{len(heavy)} CUDA source(s) include CUTLASS/CuTe ({src} reaches {header}): "
            f"{value:g} GiB per compile ({MEM_CUTLASS_GIB:g}{times}: such units peaked at "
            f"9.2 GiB in one cicc, vendor-notes); until kiln has seen or learned what "
            f"a kind of unit takes, a compile reserves this much.",
        )
    else:
        value = max(MEM_OTHER_GIB * (threads if f.device_sources else 1), MEM_OTHER_GIB)
        _say(
            t,
            f"No CUDA source includes CUTLASS/CuTe: {value:g} GiB per compile "
            f"({MEM_OTHER_GIB:g}{times if f.device_sources else ''}: other torch-extension "
            f"units peaked under 2.5 GiB, vendor-notes); until kiln has seen or learned "
            f"what a kind of unit takes, a compile reserves this much.",
        )
    t.add("mem_per_job_gib", value)
    b["mem_per_job_gib"] = value


def _build_tools(t: Table, f: Findings, b: DecidedBuild) -> None:
    """A module the build imports that the build venv lacks (setup.py's, a CMake configure
    step's, a Makefile's): the build would stop there. Its distribution, pinned to the
    newest version on the profile's index, is this vendor's build tool (installed for its
    build alone); where add could not resolve it (--offline), the line says what to set."""
    for module, dist, seen in f.build_tool_needs():
        if seen.file.endswith(".py"):
            who = "setup.py"
        elif seen.file in makefile.NAMES:
            who = f"the {seen.file}"
        else:
            who = "the CMake configure step"
        said = (
            f"{seen}: {who} imports {module}, which the build venv does not have (the build "
            f"runs without isolation)"
        )
        if canonicalize_name(dist) in f.pins:
            _say(t, f"{said}: the newest {dist} on the profile's index, for this vendor's build.")
        else:
            _say(
                t,
                f'{said}: set by hand: build_tools = ["{dist}==VERSION"] in this table '
                f"(installed for this vendor's build alone), or add it to the profile's "
                f"build_tools in kiln.toml.",
            )
    if f.pins:
        pins = [f"{dist}=={version}" for dist, version in sorted(f.pins.items())]
        t.add("build_tools", pins)
        b["build_tools"] = pins


def _build_system(t: Table, f: Findings) -> None:
    """pyproject.toml's [build-system] requires the build venv does not meet: resolved
    into this vendor's build tools (``_build_tools``, with their dependencies), else the
    build refuses the step before its compile (kiln/orchestrate/beforecompile.py)."""
    asked = [Requirement(r) for r in f.build_system_unmet]
    if asked and all(canonicalize_name(r.name) in f.pins for r in asked):
        _say(
            t,
            f"pyproject.toml [build-system] requires {'; '.join(f.build_requires)}: kiln "
            f"builds without isolation, so they are this vendor's build_tools, resolved on "
            f"the profile's index with their dependencies (installed for its build alone).",
        )
    elif f.build_requires:
        _say(
            t,
            f"pyproject.toml [build-system] requires {'; '.join(f.build_requires)}: kiln "
            f"builds without isolation in the build venv, and refuses this before the "
            f"compile; set by hand: pin versions that satisfy it in the profile's "
            f"build_tools (kiln.toml), or patch the pin out where the code does not need it.",
        )


def _flags(t: Table, f: Findings, b: DecidedBuild) -> None:
    drop = list(dict.fromkeys(flag for s in f.setup for flag, _ in s.unreproducible))
    b["nvcc_drop_flags"], b["cxx_append_flags"] = drop, []
    if drop:
        seen = [str(x) for s in f.setup for _, x in s.unreproducible][:2]
        _say(
            t,
            f"{'; '.join(seen)}: they record the build directory and source mtimes in "
            f"device code (docs/reproducibility.md): kiln's wrapper drops them. Remove this "
            f"line to keep line info for profilers.",
        )
        t.add("nvcc_drop_flags", drop)
    stds = [(n, s) for m in f.setup for n, s in m.std_flags]
    if not stds:
        return
    need, evidence = _torch_cxx(f)
    low = [(n, s) for n, s in stds if need and n < need]
    torch_inc = f.torch_header()
    if low and torch_inc and need:
        flag = f"-std=c++{need}"
        # per compiler: the units that reach torch's headers say which one needs it (a
        # tree of .cu units alone needs nvcc's flag; the C++ one would change nothing)
        units = f.torch_units()
        cuda = [u for u in units if u.endswith(".cu")]
        host = [u for u in units if not u.endswith(".cu")]
        if not units:  # the closure could not say which: both
            cuda, host = ["(unknown)"], ["(unknown)"]
        keys = (["cxx_append_flags"] if host else []) + (["nvcc_append_flags"] if cuda else [])
        which = " and ".join(
            f"{k} for {len(u)} {'CUDA' if k.startswith('nvcc') else 'C++'} unit(s) "
            f"({', '.join(u[:2])}{', ...' if len(u) > 2 else ''})"
            for k, u in (("cxx_append_flags", host), ("nvcc_append_flags", cuda))
            if u
        )
        _say(
            t,
            f"{low[0][1]}: a hard-coded C++{low[0][0]}; {torch_inc.seen} reaches torch's "
            f"headers, and {evidence}: kiln's wrapper appends {flag} after the upstream's "
            f"flags (torch adds its own -std only when setup.py passes none): {which}.",
        )
        for key in keys:
            t.add(key, [flag])
        if "cxx_append_flags" in keys:
            b["cxx_append_flags"] = [flag]
        if "nvcc_append_flags" in keys:
            b["nvcc_append_flags"] = [flag]


def _torch_cxx(f: Findings) -> tuple[int | None, str]:
    if f.torch_cxx:
        std, seen = f.torch_cxx
        return std, f"the build venv's torch needs C++{std} ({seen})"
    return None, "the build venv's torch headers could not be read"


# setup.py's own switch that builds CUDA code where no GPU answers (torchvision's,
# PyTorch Geometric's, detectron2's, mmcv's spelling)
FORCE_CUDA = ("FORCE_CUDA",)


def _env(t: Table, f: Findings, b: DecidedBuild) -> None:
    toggles = {v for env in b["arch_toggles"].values() for v in env}
    chosen: dict[str, tuple[str, str]] = {}
    for module in f.setup:
        for pin in module.asserted:
            if pin.name in KILN_SETS or pin.name in toggles:
                continue
            why = f"{pin.seen}: {_why(pin.why)}: set to the value it asserts."
            chosen.setdefault(pin.name, (pin.value, why))
        for pin in module.download_guards:
            if pin.name not in chosen and pin.name not in KILN_SETS:
                chosen[pin.name] = (pin.value, f"{pin.seen}: {pin.why}.")
    probe = f.first("gpu_probe")
    force = next((r for r in f.env_reads if r.name in FORCE_CUDA), None)
    if probe and force and force.name not in chosen:
        chosen[force.name] = (
            "1",
            f"{probe}: setup.py asks whether a GPU answers to decide on its CUDA code; none "
            f"does where kiln builds, so its own switch ({force.seen.file}:{force.seen.line}) "
            f"forces the CUDA build.",
        )
    if f.cmake_switches and f.backend.kind != "cmake" and "CMAKE_ARGS" not in chosen:
        defines = " ".join(sw.define() for sw in f.cmake_switches)
        said = "; ".join(
            f"{sw.declared}: {sw.name} defaults to {sw.default or '(empty)'}, which leaves "
            f"the CUDA part out ({sw.gates} compiles it only for {sw.enables})"
            for sw in f.cmake_switches
        )
        chosen["CMAKE_ARGS"] = (
            defines,
            f"{said}: CMAKE_ARGS (scikit-build-core and most setup.py CMake builds read it) "
            f"sets {'it' if len(f.cmake_switches) == 1 else 'them'}.",
        )
    b["env"] = {k: v for k, (v, _) in chosen.items()}
    env = tomlkit.table()
    if chosen:
        _say(
            env,
            "Set: what setup.py asserts (the build fails otherwise), what keeps it off the "
            "network without changing anything else, and what makes it build its CUDA code "
            "where no GPU answers.",
        )
    for name, (value, why) in chosen.items():
        _say(env, why)
        env.add(name, value)
    others: dict[str, pysetup.EnvRead] = {}
    for read in f.env_reads:
        if read.name not in chosen and read.name not in toggles:
            others.setdefault(read.name, read)
    kiln_read = [n for n in others if n in KILN_SETS]
    left = {n: r for n, r in others.items() if n not in KILN_SETS}
    if left:
        _say(env, "Also read by setup.py, left at its defaults (uncomment one to set it):")
        for name, read in left.items():
            default = f'"{read.default}"' if read.default is not None else "unset"
            where = f"{read.seen.file}:{read.seen.line}"
            env.add(tomlkit.comment(f'{name} = ""  # {where}, default {default}'))
    if kiln_read:
        _say(env, f"Read by setup.py, set by kiln for every build: {', '.join(kiln_read)}.")
    if probe and not force and f.device_sources:
        _say(
            env,
            f"{probe}: setup.py asks whether a GPU answers to decide on its CUDA code, and "
            f"no variable of its own forces it: where kiln builds none answers, so it builds "
            f"no CUDA code and the wheel is refused for want of the archs. The fix is a "
            f"patch that builds CUDA whatever the machine (patches/series.toml).",
        )
    for seen in [s for m in f.setup for s in m.network]:
        _say(
            env,
            f"{seen}: setup.py reaches the network here and no variable stops it; kiln "
            f"checks the submodules out before the build, so a submodule update finds them "
            f"in place (check anything else).",
        )
    t.add(tomlkit.nl())
    t.add("env", env)


def _why(why: str) -> str:
    return re.sub(r" and __name__ == '__main__'|__name__ == '__main__' and ", "", why).replace(
        " when __name__ == '__main__'", ""
    )


def _system(t: Table, f: Findings, b: DecidedBuild) -> None:
    b["system"] = [{"header": s.header, "package": s.package} for s in f.system_headers]
    if not f.headers_scanned:
        _say(t, "The build venv was not at hand: system headers were not looked for.")
        return
    if f.system_headers:
        aot = tomlkit.aot()
        for s in f.system_headers:
            e = tomlkit.table()
            _say(
                e,
                f"{s.include.seen} (reached from {s.include.source}): neither the tree, CUDA, "
                f"torch nor the build venv provides it; Debian/Ubuntu {s.package}. Checked "
                f"where builds run before anything is fetched or compiled.",
            )
            e.add("header", s.header)
            e.add("package", s.package)
            aot.append(e)
        t.add("system", aot)
    for p in f.pip_headers:
        _say(
            t,
            f"{p.include.seen}: not in the build venv; it comes from the pip wheel {p.wheel}: "
            f"add it to the profile's build_tools.",
        )
