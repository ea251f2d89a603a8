"""Read a checked-out upstream and say what it is, each finding with its evidence.

Nothing here decides a recipe key (:mod:`kiln.verbs.add.recipe` does); everything here is
a fact with the file and line it was seen at: the build backend, what setup.py (and the
tree's modules it imports) reads and passes, the sources it compiles, the headers they
reach and who provides them, the licenses of the tree and of each submodule, and the C++
standard the build venv's torch requires.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from kiln.inside.causes.buildsetup import MODULE_DISTRIBUTIONS
from kiln.inside.causes.places import header_packages
from kiln.sources.checkout import Checkout
from kiln.sources.licenses import SUBMODULE_CANDIDATES
from kiln.toolchain.consumerenv import distributions
from kiln.verbs.add import cmakelists, includes, license_text, makefile, pysetup
from kiln.verbs.add.pysetup import Seen
from kiln.verify import buildsystem, cmakeswitch

# Folders whose sources a build does not compile (used only when setup.py names none).
_NOT_BUILT = ("test", "tests", "benchmark", "benchmarks", "example", "examples", "docs")
BUILD_SCRIPTS = ("build.sh", "build.py", "install.sh")
# torch's own guard: `#if !defined(_MSC_VER) && __cplusplus < 202002L` + `#error`.
_CPLUSPLUS_GUARD = re.compile(r"__cplusplus\s*<\s*(\d{6})L?[^\n]*\n\s*#\s*error")
_CPLUSPLUS_STD = {201103: 11, 201402: 14, 201703: 17, 202002: 20, 202302: 23}
# Where torch states the C++ standard it needs, tried in order.
TORCH_GUARD_HEADERS = ("ATen/ATen.h", "torch/csrc/api/include/torch/all.h")


@dataclass(frozen=True)
class Backend:
    """``setuptools`` (a setup.py), ``pep517`` (pyproject's [build-system] only),
    ``script`` (an in-place build script), ``make`` (a Makefile at the top, no script),
    ``cmake`` (a CMakeLists.txt at the top, neither of those), or ``none``."""

    kind: str
    detail: str
    seen: tuple[Seen, ...] = ()


@dataclass(frozen=True)
class SubmoduleFinding:
    path: str
    url: str
    commit: str
    license: license_text.LicenseFile | None
    # Whether kiln's license collection would pick another file by default (then the
    # recipe names this one: sources/licenses.py SUBMODULE_CANDIDATES).
    license_named: bool = False


@dataclass(frozen=True)
class SystemHeader:
    header: str
    package: str  # Debian/Ubuntu
    include: includes.Include


@dataclass(frozen=True)
class PipHeader:
    header: str
    wheel: str
    include: includes.Include


@dataclass(frozen=True)
class Environment:
    """Where the build's headers come from besides the tree (None: not at hand)."""

    site_packages: Path | None
    cuda_home: Path | None
    python_include: Path | None


@dataclass
class Findings:
    url: str
    commit: str
    backend: Backend
    setup: list[pysetup.SetupPy] = field(default_factory=list)
    build_script: str | None = None
    sources: list[tuple[str, Seen | None]] = field(default_factory=list)  # compiled units
    closure: includes.Closure = field(default_factory=includes.Closure)
    system_headers: list[SystemHeader] = field(default_factory=list)
    pip_headers: list[PipHeader] = field(default_factory=list)
    torch_cxx: tuple[int, Seen] | None = None  # the standard torch's headers require
    # the flags torch's BuildExtension gives every CUDA unit (its COMMON_NVCC_FLAGS)
    torch_nvcc_flags: tuple[str, ...] = ()
    license: license_text.LicenseFile | None = None
    submodules: list[SubmoduleFinding] = field(default_factory=list)
    title: str = ""
    extensions: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    headers_scanned: bool = True
    # modules setup.py imports that neither the standard library, the tree nor the build
    # venv has: the build stops there (it runs without isolation)
    missing_imports: list[tuple[str, Seen]] = field(default_factory=list)
    # [build-system] requires the build venv does not meet (kiln.verify.buildsystem)
    build_requires: list[str] = field(default_factory=list)
    # ... as written (what add resolves into build_tools), and the build venv's versions
    build_system_unmet: list[str] = field(default_factory=list)
    build_venv: dict[str, str] = field(default_factory=dict)
    # what the wheel will require, as the tree states it (requirement, where it is said)
    requires: list[tuple[str, str]] = field(default_factory=list)
    cmake: cmakelists.Project | None = None  # a CMake project's own files, read
    make: makefile.Makefile | None = None  # a Makefile's rules and variables, read
    # build tools' newest versions on the profile's index (canonical name -> version), where
    # add could resolve them (not --offline): drafted as pins, not left to the user
    pins: dict[str, str] = field(default_factory=dict)
    # archs of a hard-coded 'a' target's family, compiled one by one at add (the first
    # CUDA unit): arch -> None where it compiled, else the compiler's first error; None:
    # not compiled (--no-check, no CUDA unit, no nvcc here)
    family_checked: dict[str, str | None] | None = None
    # CMake switches whose defaults leave the CUDA part out (a CMakeLists.txt at the top,
    # whatever builds it: cmake in place, scikit-build-core, a setup.py calling cmake)
    cmake_switches: list[cmakeswitch.Switch] = field(default_factory=list)

    def build_tool_needs(self) -> list[tuple[str, str, Seen]]:
        """(module, its distribution, where) of what the build imports that the build
        venv lacks: setup.py's imports, and a CMake configure step's (``import numpy`` with
        the build's Python; a Makefile's ``$(shell python -m X)``)."""
        needs = list(self.missing_imports)
        if self.cmake is not None:
            needs += [(m.split(".")[0], seen) for m, seen in self.cmake.imports]
        if self.make is not None:
            needs += [(m.split(".")[0], seen) for m, seen in self.make.imports]
        found: dict[str, tuple[str, Seen]] = {}  # a distribution once, where first seen
        for module, seen in needs:
            found.setdefault(MODULE_DISTRIBUTIONS.get(module, module), (module, seen))
        return [(module, dist, seen) for dist, (module, seen) in found.items()]

    @property
    def device_sources(self) -> list[str]:
        return [s for s, _ in self.sources if s.endswith(".cu")]

    @property
    def env_reads(self) -> list[pysetup.EnvRead]:
        return [r for s in self.setup for r in s.env_reads]

    @property
    def arch_flags(self) -> list[pysetup.ArchFlag]:
        return [f for s in self.setup for f in s.arch_flags]

    def first(self, attr: str) -> Seen | None:
        """The first setup module's finding ``attr`` (torch_extension, threads_flag...)."""
        return next((getattr(s, attr) for s in self.setup if getattr(s, attr)), None)

    def torch_header(self) -> includes.Include | None:
        """The first include of torch's own headers (torch/, ATen/, c10/), else of any
        header torch's include folder provides (pybind11 comes with it)."""
        hits = [self.closure.first[h] for h, p in self.closure.provided.items() if p == "torch"]
        own = [i for i in hits if i.header.startswith(("torch/", "ATen/", "c10/"))]
        found = own or hits
        return found[0] if found else None

    def torch_units(self) -> list[str]:
        """The compiled sources that reach torch's own headers (torch/, ATen/, c10/)."""
        torch = {
            h
            for h, p in self.closure.provided.items()
            if p == "torch" and h.startswith(("torch/", "ATen/", "c10/"))
        }
        return [s for s, _ in self.sources if torch & set(self.closure.reaches.get(s, ()))]

    def cutlass_units(self) -> dict[str, str]:
        """Device source -> the CUTLASS/CuTe header it reaches."""
        out = {}
        for src in self.device_sources:
            hit = sorted(h for h in self.closure.reaches.get(src, ()) if _cutlass(h))
            if hit:
                out[src] = hit[0]
        return out


def missing_imports(
    tree: Path, modules: list[pysetup.SetupPy], site_packages: Path | None
) -> list[tuple[str, Seen]]:
    """What setup.py (and the tree's modules it imports) import that the build venv has
    not: not the standard library, not a module of the tree, not in site-packages."""
    if site_packages is None:
        return []
    have = venv_modules(site_packages)
    out: list[tuple[str, Seen]] = []
    for m in modules:
        for name, seen in m.imports:
            local = (tree / f"{name}.py").is_file() or (tree / name).is_dir()
            if name in sys.stdlib_module_names or local or name in have:
                continue
            if name not in {n for n, _ in out}:
                out.append((name, seen))
    return out


def venv_modules(site_packages: Path) -> set[str]:
    """The top-level modules the build venv has (with setuptools' bundled copies, which
    it puts on sys.path once imported)."""
    have = {p.name.split(".")[0].split("-")[0] for p in site_packages.iterdir()}
    have |= {"distutils"}  # setuptools provides it where the standard library no longer does
    # setuptools >= 71 puts its own bundled copies (packaging, more_itertools, jaraco, ...)
    # on sys.path once imported: setup.py imports them in every build
    bundled = site_packages / "setuptools" / "_vendor"
    if bundled.is_dir():
        have |= {p.name.split(".")[0].split("-")[0] for p in bundled.iterdir()}
    return have


def runtime_requires(tree: Path, modules: list[pysetup.SetupPy]) -> list[tuple[str, str]]:
    """What the wheel will require, as the tree states it: setup.py's literal
    ``install_requires`` and pyproject.toml's ``[project] dependencies``, each with where
    it is said (a computed list is the build's metadata's to say, before its compile)."""
    found = [(r, str(seen)) for m in modules for r, seen in m.install_requires]
    try:
        project = tomllib.loads((tree / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    deps = project.get("dependencies", []) if isinstance(project, dict) else []
    found += [(d, "pyproject.toml: [project] dependencies") for d in deps if isinstance(d, str)]
    return found


def _lacked(imports: list[tuple[str, Seen]], have: set[str] | None) -> list[tuple[str, Seen]]:
    """The imports of a build's own files that neither the standard library nor the build
    venv has (none where the venv is not at hand)."""
    return [
        (name, seen)
        for name, seen in imports
        if have is not None
        and name.split(".")[0] not in have
        and name.split(".")[0] not in sys.stdlib_module_names
    ]


def _cutlass(header: str) -> bool:
    return header.startswith(("cutlass/", "cute/"))


def scan(co: Checkout, env: Environment) -> Findings:
    tree = co.path
    found = Findings(co.url, co.commit, backend(tree))
    if (tree / "setup.py").is_file():
        modules = ["setup.py", *pysetup.local_imports(tree, "setup.py")]
        found.setup = [pysetup.read(tree, m) for m in modules]
    found.build_script = next((s for s in BUILD_SCRIPTS if (tree / s).is_file()), None)
    have = venv_modules(env.site_packages) if env.site_packages else None
    if found.backend.kind == "cmake":
        found.cmake = cmakelists.read(tree, [s.path for s in co.submodules])
        if found.cmake is not None:  # what the configure step imports and the venv lacks
            found.cmake.imports = _lacked(found.cmake.imports, have)
    if (tree / "CMakeLists.txt").is_file():
        found.cmake_switches = cmakeswitch.cuda_switches(tree, [s.path for s in co.submodules])
    if found.backend.kind == "make":
        found.make = makefile.read(tree)
        if found.make is not None:
            found.make.imports = _lacked(found.make.imports, have)
            found.make.modules = cmakelists.declared_modules(tree, [s.path for s in co.submodules])
    found.sources = _sources(tree, found, co)
    roots = includes.external_roots(env.cuda_home, env.site_packages, env.python_include)
    found.headers_scanned = env.site_packages is not None
    found.closure = includes.closure(tree, [s for s, _ in found.sources], roots)
    for inc in found.closure.missing:
        deb, pip = header_packages(inc.header)
        if deb and not any(s.package == deb for s in found.system_headers):
            found.system_headers.append(SystemHeader(inc.header, deb, inc))
        elif pip and not deb:
            found.pip_headers.append(PipHeader(inc.header, pip, inc))
    found.torch_cxx = torch_cxx(env.site_packages)
    found.torch_nvcc_flags = torch_nvcc_flags(env.site_packages)
    found.missing_imports = missing_imports(tree, found.setup, env.site_packages)
    found.requires = runtime_requires(tree, found.setup)
    if "pybind11/numpy.h" in found.closure.first:  # its functions take numpy arrays
        inc = found.closure.first["pybind11/numpy.h"]
        found.requires.append(("numpy", f"{inc.seen}"))
    if env.site_packages is not None:
        found.build_venv = distributions(env.site_packages)
        found.build_requires = buildsystem.problems(tree, found.build_venv)
        found.build_system_unmet = buildsystem.unmet(tree, found.build_venv)
    lic = license_text.find(tree)
    found.license = license_text.identify(tree, lic) if lic else None
    top = [s for s in co.submodules if "/" not in s.path or not _nested(s.path, co)]
    for sub in top:
        name = license_text.find(tree / sub.path)
        sub_license = license_text.identify(tree / sub.path, name) if name else None
        default = next((c for c in SUBMODULE_CANDIDATES if (tree / sub.path / c).is_file()), None)
        found.submodules.append(
            SubmoduleFinding(sub.path, sub.url, sub.commit, sub_license, default != name)
        )
    found.title = _title(tree)
    found.extensions = _extensions(found)
    found.tests = sorted(
        str(p.relative_to(tree)) for d in ("tests", "test") for p in (tree / d).rglob("test*.py")
    )
    return found


def _nested(path: str, co: Checkout) -> bool:
    return any(path.startswith(o.path + "/") for o in co.submodules)


def backend(tree: Path) -> Backend:
    pyproject = tree / "pyproject.toml"
    seen: list[Seen] = []
    table = None
    if pyproject.is_file():
        text = pyproject.read_text(errors="replace")
        try:
            table = tomllib.loads(text).get("build-system")
        except tomllib.TOMLDecodeError:
            table = None
        line = next((i for i, ln in enumerate(text.splitlines(), 1) if "build-backend" in ln), 0)
        if table and line:
            seen.append(Seen("pyproject.toml", line, text.splitlines()[line - 1].strip()))
    if (tree / "setup.py").is_file():
        how = "setup.py"
        if pyproject.is_file() and not table:
            how += " (pyproject.toml has no [build-system]: pip falls back to setuptools)"
        elif table:
            how += f" with pyproject's backend {table.get('build-backend', 'setuptools')}"
        return Backend("setuptools", how, tuple(seen))
    if table:
        return Backend("pep517", str(table.get("build-backend", "setuptools")), tuple(seen))
    script = next((s for s in BUILD_SCRIPTS if (tree / s).is_file()), None)
    if script:
        return Backend("script", script, (Seen(script, 1, "a build script at the top"),))
    make = next((n for n in makefile.NAMES if (tree / n).is_file()), None)
    if make:
        return Backend("make", make, (Seen(make, 1, "a Makefile at the top"),))
    if (tree / "CMakeLists.txt").is_file():
        return Backend("cmake", "CMakeLists.txt", (Seen("CMakeLists.txt", 1, "a CMake project"),))
    return Backend(
        "none",
        "no setup.py, no pyproject.toml [build-system], no build script, no Makefile, no "
        "CMakeLists.txt",
    )


def _sources(tree: Path, found: Findings, co: Checkout) -> list[tuple[str, Seen | None]]:
    """The units the build compiles: the source files setup.py names, else every C, C++
    and CUDA source of the tree outside submodules, tests, benchmarks and docs."""
    named: dict[str, Seen | None] = {}
    for module in found.setup:
        for rel, seen in module.sources:
            named.setdefault(rel, seen)
    if named:
        return list(named.items())
    subs = [s.path for s in co.submodules]
    out: list[tuple[str, Seen | None]] = []
    for path in sorted(tree.rglob("*")):
        inside = path.relative_to(tree)
        if (
            path.suffix in pysetup.SOURCE_SUFFIXES
            and path.is_file()
            and ".git" not in inside.parts
            and not set(inside.parts) & set(_NOT_BUILT)
            and not any(str(inside).startswith(s + "/") for s in subs)
        ):
            out.append((str(inside), None))
    return out


def torch_cxx(site_packages: Path | None) -> tuple[int, Seen] | None:
    """The C++ standard the build venv's torch headers refuse to compile below, with the
    guard's line (torch 2.14's ATen/ATen.h: ``__cplusplus < 202002L`` -> ``#error``)."""
    if site_packages is None:
        return None
    base = site_packages / "torch" / "include"
    for rel in TORCH_GUARD_HEADERS:
        path = base / rel
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        m = _CPLUSPLUS_GUARD.search(text)
        if m and int(m.group(1)) in _CPLUSPLUS_STD:
            line = text.count("\n", 0, m.start()) + 1
            shown = f"torch/include/{rel}"
            return _CPLUSPLUS_STD[int(m.group(1))], Seen(shown, line, m.group(0).split("\n")[0])
    return None


def torch_nvcc_flags(site_packages: Path | None) -> tuple[str, ...]:
    """``COMMON_NVCC_FLAGS`` of the build venv's torch.utils.cpp_extension, read from its
    text (importing torch costs seconds): torch's BuildExtension gives them to every CUDA
    unit (``-D__CUDA_NO_HALF_OPERATORS__``, ...); without them a unit that reaches both
    torch's and CUDA's half types fails ("more than one operator ">" matches")."""
    path = site_packages / "torch" / "utils" / "cpp_extension.py" if site_packages else None
    if path is None or not path.is_file():
        return ()
    for node in ast.parse(path.read_text(errors="replace")).body:
        if (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["COMMON_NVCC_FLAGS"]
            and isinstance(node.value, ast.List)
        ):
            return tuple(
                e.value
                for e in node.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return ()


def _title(tree: Path) -> str:
    for name in ("README.md", "README.rst", "README"):
        path = tree / name
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                text = line.strip().lstrip("#").strip()
                if text and not text.startswith(("<", "[", "!", "=", "-")):
                    return text[:80]
    return tree.name


def _extensions(found: Findings) -> list[str]:
    """Extension module names setup.py gives its Extension/CUDAExtension calls."""
    names: list[str] = []
    for module in found.setup:
        names += module.extension_names
    return list(dict.fromkeys(names))
