"""The drafted recipe's first units, compiled before the recipe is written.

``add`` compiles the first unit of each kind the build compiles (one ``.cu`` with nvcc,
one C++ source with the host compiler, in the order setup.py names them) with what the
draft decides: the recipe's archs (one ``-gencode`` each), the upstream's hard-coded
``-std`` first and the drafted append flags after it (as kiln's wrapper orders them), and
the headers the tree, the build venv, torch, Python and CUDA provide. A draft whose unit
does not compile is not written: the first error, and the cause table's reading of it
(an instruction an arch lacks, a C++ standard), stop ``add`` with ``--no-check`` named.

The check rebuilds the unit's command from what add read, not from the upstream's build
(which add does not run): a header it cannot find means its own include folders fell
short of the build's, so that unit is reported unchecked and the draft is written.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import ConfigError, KilnError
from kiln.inside import diagnose, proc
from kiln.inside.causes import table
from kiln.inside.kit import contract
from kiln.inside.kit.archflags import target
from kiln.verbs.add import includes
from kiln.verbs.add.scan import Environment, Findings

log = logging.getLogger(__name__)

CXX_SUFFIXES = (".cpp", ".cc", ".cxx")
# What torch's BuildExtension gives every unit and upstreams rely on (nvcc's relaxed
# constexpr, extended lambdas); torch's __CUDA_NO_HALF* defines are left out: they only
# take operators away, so a unit that compiles without them is not proven by them.
NVCC_COMMON = ("--expt-relaxed-constexpr", "--expt-extended-lambda", "-Xcompiler", "-fPIC")
TORCH_DEFINES = ("-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=kiln_add_check")
NO_CHECK = "--no-check writes it unchecked"


@dataclass(frozen=True)
class Compiled:
    """One unit the check compiled (``missing``: the header its include folders lacked,
    so the unit was not proven either way)."""

    unit: str
    kind: str  # "CUDA" or "C++"
    command: list[str]
    seconds: float
    missing: str | None = None

    def said(self) -> str:
        if self.missing:
            return (
                f"{self.unit} not checked by compiling: {self.missing} is not in the folders "
                f"add knows (the build's own include flags may name it)"
            )
        archs = [a.split("code=")[-1] for a in self.command if a.startswith("-gencode=")]
        what = f" for {', '.join(archs)}" if archs else ""
        return f"checked: {self.unit} compiles{what} with the drafted flags ({self.seconds:.1f} s)"


def first_units(f: Findings) -> list[tuple[str, str]]:
    """(unit, kind) of the first CUDA and the first C++ source the build compiles."""
    out: list[tuple[str, str]] = []
    for kind, suffixes in (("CUDA", (".cu",)), ("C++", CXX_SUFFIXES)):
        unit = next((s for s, _ in f.sources if s.endswith(suffixes)), None)
        if unit is not None:
            out.append((unit, kind))
    return out


def include_dirs(index: includes.TreeIndex, f: Findings, unit: str, env: Environment) -> list[str]:
    """``-I`` flags: the unit's folder, the tree's folders its headers are found under
    (the path minus the header's own, as add resolved it), then the external roots."""
    tree = index.tree
    dirs: list[Path] = [(tree / unit).parent, tree]
    for header in sorted(f.closure.reaches.get(unit, ())):
        if f.closure.provided.get(header) != "tree":
            continue
        found = index.find(header)
        if found is not None and str(found).endswith(header):
            root = Path(str(found)[: -len(header)])
            if root not in dirs:
                dirs.append(root)
    roots = includes.external_roots(env.cuda_home, env.site_packages, env.python_include)
    dirs += [r.path for r in roots if r.path not in dirs]
    return [f"-I{d}" for d in dirs]


def command(
    unit: str,
    kind: str,
    build: Mapping[str, object],
    f: Findings,
    env: Environment,
    index: includes.TreeIndex,
) -> list[str]:
    upstream = sorted({f"-std=c++{n}" for m in f.setup for n, _ in m.std_flags})[:1]
    key = "nvcc_append_flags" if kind == "CUDA" else "cxx_append_flags"
    drafted = build.get(key)
    appended = [str(x) for x in drafted] if isinstance(drafted, list) else []
    if not any(x.startswith("-std=") for x in [*upstream, *appended]) and f.first(
        "torch_extension"
    ):  # (torch's headers unread: the compiler's default, as nothing better is known)
        # torch's BuildExtension adds the standard its headers need where setup.py passes
        # none (torch 2.14: -std=c++20); the compiler's own default would fail its guard
        upstream = [f"-std=c++{f.torch_cxx[0]}"] if f.torch_cxx else []
    defines = list(TORCH_DEFINES) if unit in f.torch_units() else []
    if kind == "CUDA":
        nvcc = env.cuda_home / "bin" / "nvcc" if env.cuda_home is not None else Path("nvcc")
        archs = build.get("archs")
        gencode = [target(str(a)).gencode() for a in archs] if isinstance(archs, list) else []
        torch = f.torch_nvcc_flags if f.first("torch_extension") else ()
        head = [str(nvcc), "-c", "-x", "cu", *NVCC_COMMON, *torch, *gencode]
    else:
        head = [os.environ.get("CXX", "g++"), "-c", "-x", "c++", "-fPIC"]
    return [*head, *upstream, *appended, *defines, *include_dirs(index, f, unit, env), unit]


def check(
    name: str,
    build: Mapping[str, object],
    f: Findings,
    env: Environment,
    tree: Path,
    keep: Path,
) -> list[Compiled]:
    """Compile each first unit; a unit that fails for a reason other than a header add
    could not place stops ``add`` before anything is written (ConfigError). ``keep``:
    where nvcc keeps its intermediates (the PTX a refusal points at), emptied first."""
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    done: list[Compiled] = []
    index = includes.TreeIndex(tree)  # the tree's files by path tail, read once
    archs = build.get("archs")
    built = " ".join(str(a) for a in archs) if isinstance(archs, list) else ""
    for unit, kind in first_units(f):
        if kind == "CUDA" and not built:
            continue  # no device code is built (a JIT upstream): nothing the draft decides
        with tempfile.TemporaryDirectory(prefix="kiln-add-unit-") as tmp:
            kept = ["-keep", f"-keep-dir={keep}"] if kind == "CUDA" else []
            cmd = [*command(unit, kind, build, f, env, index), *kept, "-o", str(Path(tmp) / "u.o")]
            log.info(
                "%s: checking the draft: compiling %s%s (--no-check skips this)",
                name,
                unit,
                f" for {built.replace(' ', ', ')}" if kind == "CUDA" else "",
            )
            start = time.monotonic()
            try:
                res = proc.run(cmd, cwd=tree, check=False, what=f"the {kind} compile of {unit}")
            except KilnError as exc:  # no such compiler here: add goes on, unchecked
                log.warning("%s: %s not checked: %s", name, unit, str(exc).splitlines()[0])
                continue
        seconds = time.monotonic() - start
        if res.returncode == 0:
            done.append(Compiled(unit, kind, cmd, seconds))
            log.info("%s: %s", name, done[-1].said())
            continue
        d = diagnose.first_errors(res.output, tree)
        d.unit = d.unit or unit  # ptxas names only nvcc's own temporary PTX
        told = contract.Archs(built=tuple(built.split())).to_env()  # as a build's step is
        d.cause = table.explain(d, res.output, told, tree, name)
        missing = _missing_header(res.output)
        if missing:
            done.append(Compiled(unit, kind, cmd, seconds, missing))
            log.warning("%s: %s", name, done[-1].said())
            continue
        first = d.errors[0].message if d.errors else f"exit code {res.returncode}"
        why = f"; {d.cause.cause}; fix: {d.cause.fix}" if d.cause else ""
        raise ConfigError(
            f"vendors/{name}.toml (not written): the draft's first {kind} unit {unit} does not "
            f"compile with its archs and flags ({first}){why}; {NO_CHECK}"
        )
    return done


def family_archs(
    name: str,
    build: Mapping[str, object],
    f: Findings,
    env: Environment,
    tree: Path,
    archs: list[str],
) -> dict[str, str | None]:
    """The first CUDA unit compiled for each of ``archs`` alone, with the draft's flags:
    arch -> None where it compiled, else the compiler's first error (file:line). An
    arch guard in the code (``#error`` under ``__CUDA_ARCH__``), an instruction the arch
    lacks: the compiler says so. {} where nothing could be compiled here."""
    unit = next((u for u, kind in first_units(f) if kind == "CUDA"), None)
    if unit is None or not archs:
        return {}
    index = includes.TreeIndex(tree)
    out: dict[str, str | None] = {}
    for arch in archs:
        cmd = command(unit, "CUDA", {**build, "archs": [arch]}, f, env, index)
        log.info("%s: compiling %s for %s alone: does the code build there?", name, unit, arch)
        with tempfile.TemporaryDirectory(prefix="kiln-add-arch-") as tmp:
            try:
                res = proc.run(
                    [*cmd, "-o", str(Path(tmp) / "u.o")],
                    cwd=tree,
                    check=False,
                    what=f"the CUDA compile of {unit} for {arch}",
                )
            except KilnError as exc:  # no nvcc here: not checked
                log.warning("%s: %s not compiled for %s: %s", name, unit, arch, exc)
                return {}
        if res.returncode == 0:
            out[arch] = None
            continue
        if _missing_header(res.output):
            return {}  # add's include folders fell short: the compile proves nothing
        d = diagnose.first_errors(res.output, tree)
        out[arch] = d.errors[0].render() if d.errors else f"exit code {res.returncode}"
    return out


def _missing_header(output: str) -> str | None:
    """The header a compile could not open (gcc's and nvcc's front end's wording)."""
    for line in output.splitlines():
        for mark in ("fatal error: ", "catastrophic error: cannot open source file "):
            if mark in line and ("No such file" in line or "cannot open source" in line):
                text = line.split(mark, 1)[1]
                return text.split(":", 1)[0].strip().strip('"')
    return None
