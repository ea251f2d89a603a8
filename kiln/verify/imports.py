"""What the import proof imports, and what its results mean (pure: no runner, no build).

- :func:`plan_modules`: every extension module of an output (a shared object whose
  dynamic symbols export ``PyInit_<name>``, at an importable path), its top-level
  packages, and the recipe's own modules; each with what is imported before it (torch,
  for an extension that links torch's libraries, as its own package imports it) and
  whether it is skipped (the recipe's reason, or a GPU it needs and this machine lacks).
- :func:`closure`: every ``DT_NEEDED`` entry of the output's shared objects and who
  provides it where the release lands; the ones nobody provides.
- :func:`requirement_problems`: the output's ``Requires-Dist`` against what the consumer
  environment holds (a runtime lock that pins another torch than the wheel's).
- :func:`read_failure`: what a failed import's output says (an undefined symbol, a
  missing library, a Python error), for :mod:`kiln.verify.loadfacts` to explain.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from kiln.config.models import ImportProofSettings
from kiln.inside.causes.cause import Cause

_EXTENSION = re.compile(r"^(?P<stem>[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z0-9_-]+)?\.so$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# What the GPU driver provides: never shipped by anyone, always there on a GPU machine.
DRIVER_LIBRARIES = frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})
# The dynamic loader itself (named by a few libraries' DT_NEEDED).
LOADERS = frozenset({"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"})
# torch's own libraries: an extension linking any of them is imported after torch.
TORCH_LIBRARY = re.compile(r"^lib(c10|torch|shm)[A-Za-z0-9_]*\.so")


@dataclass(frozen=True)
class PlannedModule:
    name: str
    kind: str  # "extension" | "package" | "declared"
    shared_object: str | None = None  # its file, as the output holds it
    preload: tuple[str, ...] = ()
    skip: str | None = None  # why it is not imported


def extension_name(rel: str) -> tuple[str, str] | None:
    """(module, PyInit stem) of a shared object at ``rel`` inside an importable root,
    or None where its path cannot be a module (a folder that is no identifier:
    ``mylib.libs``, ``x.data``)."""
    parts = rel.split("/")
    m = _EXTENSION.match(parts[-1])
    if not m or not all(_IDENTIFIER.match(p) for p in parts[:-1]):
        return None
    return ".".join([*parts[:-1], m["stem"]]), m["stem"]


def exports_pyinit(path: Path, stem: str) -> bool:
    """Whether the ELF file at ``path`` exports ``PyInit_<stem>`` (it is a module)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        with path.open("rb") as fh:
            symtab = ELFFile(fh).get_section_by_name(".dynsym")
            if not isinstance(symtab, SymbolTableSection):
                return False
            wanted = f"PyInit_{stem}"
            return any(
                sym.name == wanted and sym["st_shndx"] != "SHN_UNDEF"
                for sym in symtab.iter_symbols()
            )
    except (ELFError, OSError):
        return False


def top_level(members: Iterable[str], declared: str | None = None) -> list[str]:
    """The top-level importable names of an output: ``top_level.txt`` where the wheel
    has one, else every top folder with an ``__init__.py`` and every top ``.py`` file."""
    if declared is not None:
        names = [n.strip() for n in declared.splitlines() if n.strip()]
        return sorted({n for n in names if _IDENTIFIER.match(n)})
    found = set()
    for m in members:
        parts = m.split("/")
        if len(parts) == 2 and parts[1] == "__init__.py" and _IDENTIFIER.match(parts[0]):
            found.add(parts[0])
        elif len(parts) == 1 and m.endswith(".py") and _IDENTIFIER.match(m[:-3]):
            found.add(m[:-3])
    return sorted(found)


def plan_modules(
    shared_objects: Mapping[str, Path],
    needed: Mapping[str, list[str]],
    packages: list[str],
    declared: list[str],
    settings: ImportProofSettings,
    driver: bool,
) -> list[PlannedModule]:
    """The modules to import, in order: extensions, packages, then the recipe's own.
    ``shared_objects``: path in the output -> the file on disk; ``needed``: their
    DT_NEEDED; ``driver``: whether this machine has a GPU driver."""
    planned: dict[str, PlannedModule] = {}
    for rel, path in sorted(shared_objects.items()):
        named = extension_name(rel)
        if named is None or not exports_pyinit(path, named[1]):
            continue
        links_torch = any(TORCH_LIBRARY.match(n) for n in needed.get(rel, []))
        planned[named[0]] = PlannedModule(
            named[0], "extension", rel, ("torch",) if links_torch else ()
        )
    for name in packages:
        planned.setdefault(name, PlannedModule(name, "package"))
    for name in [*declared, *settings.modules, *settings.needs_gpu]:
        planned.setdefault(name, PlannedModule(name, "declared"))
    out = []
    for mod in planned.values():
        reason = settings.skip.get(mod.name)
        if reason is None and mod.name in settings.needs_gpu and not driver:
            reason = "needs a GPU (build.import_proof.needs_gpu); this machine has no driver"
        out.append(PlannedModule(mod.name, mod.kind, mod.shared_object, mod.preload, reason))
    return out


# --------------------------------------------------------------------------- closure


@dataclass(frozen=True)
class Closure:
    provided: dict[str, str]  # soname -> who provides it
    missing: list[tuple[str, str]]  # (shared object, soname) nobody provides


def closure(
    needed: Mapping[str, list[str]],
    own: Iterable[str],
    environment: Mapping[str, list[tuple[str, str]]],
    versions: Mapping[str, str],
    system: Iterable[str],
    runtime_libraries: Mapping[str, str],
) -> Closure:
    """Who provides each DT_NEEDED entry: the output itself (``own``: its files' names),
    a distribution of the consumer environment (``environment``: file name ->
    [(path, distribution)], ``versions``: distribution -> version), the system's C and
    C++ runtime (``system``: the manylinux policy's libraries), the GPU driver, or a
    system package the recipe declares (``runtime_libraries``: soname -> package)."""
    own_names = set(own)
    system_names = set(system)
    provided: dict[str, str] = {}
    missing: list[tuple[str, str]] = []
    for so, names in sorted(needed.items()):
        for name in names:
            if name in own_names:
                who = "the output itself"
            elif name in environment:
                dists = sorted({d for _p, d in environment[name]})
                who = ", ".join(f"{d} {versions.get(d, '?')}" for d in dists)
            elif name in system_names or name in LOADERS:
                who = "the system (C and C++ runtime)"
            elif name in DRIVER_LIBRARIES:
                who = "the GPU driver"
            elif name in runtime_libraries:
                who = f"the system package {runtime_libraries[name]} (declared)"
            else:
                missing.append((so, name))
                continue
            provided[name] = who
    return Closure(dict(sorted(provided.items())), missing)


def system_libraries(platform_tag: str) -> frozenset[str]:
    """The libraries the manylinux policy of ``platform_tag`` lets a wheel take from the
    system (glibc's family, libstdc++, libgcc_s; auditwheel's own list)."""
    from auditwheel.policy import Architecture, Libc, WheelPolicies

    arch = "aarch64" if platform_tag.endswith("aarch64") else "x86_64"
    policies = WheelPolicies(libc=Libc.GLIBC, arch=Architecture(arch))
    name = platform_tag if platform_tag.startswith("manylinux_") else f"manylinux_2_34_{arch}"
    policy = policies.get_policy_by_name(name)
    if policy is None:
        policy = policies.get_policy_by_name(f"manylinux_2_34_{arch}")
    return policy.whitelist if policy is not None else frozenset()


# --------------------------------------------------------------------------- requirements


def unmet_requirements(
    requires: list[str], installed: Mapping[str, str]
) -> list[tuple[Requirement, str | None]]:
    """Each ``Requires-Dist`` of the output (without an extra) that the consumer
    environment does not satisfy, with the version it holds instead (None: none)."""
    unmet: list[tuple[Requirement, str | None]] = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = installed.get(canonicalize_name(req.name))
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append((req, have))
    return unmet


def requirement_problems(requires: list[str], installed: Mapping[str, str]) -> list[str]:
    """:func:`unmet_requirements` said with what the environment holds instead."""
    return [
        f"{req} (not installed)"
        if have is None
        else f"{req} (the environment has {req.name} {have})"
        for req, have in unmet_requirements(requires, installed)
    ]


def requirement_line(req: Requirement) -> str:
    """The line of ``runtime-requirements.txt`` that installs ``req`` (its marker left
    out: install.sh installs for the profile's Python and platform alone)."""
    return f"{req.name}{req.specifier}" if req.specifier else req.name


def pinned_versions(text: str) -> tuple[dict[str, str], bool]:
    """What a requirements text pins (``name==version``, by canonical name), and whether
    it is a whole lock: every requirement pinned by hash, which pip installs with
    ``--require-hashes`` and so only with every dependency listed too."""
    pins: dict[str, str] = {}
    whole = True
    for line in text.replace("\\\n", " ").splitlines():
        spec = line.split("#", 1)[0]
        hashed = "--hash" in spec
        spec = spec.split(" --hash", 1)[0].strip()
        if not spec or spec.startswith("-"):
            continue
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            whole = False
            continue
        whole = whole and hashed
        exact = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if exact:
            pins[canonicalize_name(req.name)] = exact[0].version
    return pins, whole and bool(pins)


def requires_dist(metadata: str) -> list[str]:
    head = metadata.split("\n\n", 1)[0]
    return [
        ln.split(":", 1)[1].strip() for ln in head.splitlines() if ln.startswith("Requires-Dist:")
    ]


# --------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class ImportFailure:
    """What a failed import's output says."""

    module: str
    last_line: str
    symbol: str | None = None  # an undefined symbol (mangled)
    symbol_file: str | None = None  # the file the loader names with it
    library: str | None = None  # a library that could not be opened
    library_file: str | None = None
    python_error: str | None = None  # "ModuleNotFoundError: No module named 'x'"
    frame: str | None = None  # the innermost traceback frame: file:line
    timed_out: bool = False
    output: str = ""
    gpu: bool = False  # the output reads like a GPU or driver that is missing
    lines: list[str] = field(default_factory=list)


_UNDEFINED = re.compile(r"(?P<file>/\S+?): undefined symbol: (?P<sym>\S+)")
_CANNOT_OPEN = re.compile(
    r"(?:(?P<file>/\S+?): )?(?P<lib>[^\s:/]+\.so[0-9.]*): cannot open shared object file"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
_PY_ERROR = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*)$")
GPU_PATTERNS = re.compile(
    r"no CUDA-capable device|CUDA driver version is insufficient|Found no NVIDIA driver"
    r"|cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE|CUDA_ERROR_STUB_LIBRARY|stub library"
    r"|NVIDIA driver on your system|CUDA initialization|no GPU|needs a GPU",
    re.IGNORECASE,
)


def read_failure(
    module: str, output: str, timed_out: bool, roots: Iterable[Path] = ()
) -> ImportFailure:
    """``roots``: folders the output's paths are shown relative to (the proof's venv and
    tree are throwaway: ``landing/__init__.py:3`` says where, ``/tmp/...`` does not)."""
    for root in roots:
        output = output.replace(str(root).rstrip("/") + "/", "")
    lines = [ln for ln in output.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else "no output"
    frames = [m for m in (_FRAME.match(ln) for ln in lines) if m]
    frame = f"{frames[-1]['file']}:{frames[-1]['line']}" if frames else None
    py_errors = [m["type"] for m in (_PY_ERROR.match(ln.strip()) for ln in lines) if m]
    undefined = _UNDEFINED.search(output)
    cannot = _CANNOT_OPEN.search(output)
    return ImportFailure(
        module,
        last,
        symbol=undefined["sym"] if undefined else None,
        symbol_file=undefined["file"] if undefined else None,
        library=cannot["lib"] if cannot else None,
        library_file=cannot["file"] if cannot and cannot["file"] else None,
        python_error=py_errors[-1] if py_errors else None,
        frame=frame,
        timed_out=timed_out,
        output=output,
        gpu=bool(GPU_PATTERNS.search(output)),
        lines=lines,
    )


def _torch_pin_holds(req: Requirement, profile: Version) -> bool:
    """Whether what ``req`` installs is the profile's torch, by PEP 440's rules: an exact
    pin by its public version, and by its local label where both have one (2.13.0 and
    2.13.0+cu132 are the same torch to the wheels' ``torch==2.13.0``; +cu130 and +cu132
    are two builds); a range, where it holds the profile's version."""
    exact = [
        s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version
    ]
    if not exact:
        return req.specifier.contains(profile, True) or req.specifier.contains(profile.public, True)
    try:
        pinned = Version(exact[0])
    except InvalidVersion:
        return False
    labels_differ = bool(pinned.local and profile.local and pinned.local != profile.local)
    return pinned.public == profile.public and not labels_differ


def pinned_torch_problem(text: str, source: str, torch: str | None) -> str | None:
    """Where ``install.sh``'s requirements (``text``, from ``source``) pin a torch that
    the profile's (what the wheels are compiled against and require) does not satisfy:
    the line that says so and which pin to change. Checked before any build."""
    if not torch:
        return None
    want = Version(torch).public
    for line in text.replace("\\\n", " ").splitlines():
        spec = line.split("#", 1)[0].split(" --hash", 1)[0].strip()
        if not spec or spec.startswith("-"):
            continue
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "torch":
            continue
        if _torch_pin_holds(req, Version(torch)):
            continue
        return (
            f"{source} pins {req}, but the wheels are compiled against the profile's torch "
            f"{torch} and require torch=={want}: install.sh would install a torch they "
            f"cannot load; pin torch=={want} in runtime-requirements.txt and run `kiln lock` "
            f"(or set the profile's torch to the one pinned there)"
        )
    return None


def another_torch(version: str, where: str, want: str | None, sites: Sequence[str]) -> Cause | None:
    """The torch an import loaded (its ``version`` and ``where``, its ``__init__.py``)
    against the profile's (``want``) and the consumer environment's site folders
    (``sites``: its own, and with ``--proof-env build-python`` the build Python's); None
    when it is the environment's, of that version, or no torch was loaded."""
    if not version or not want:
        return None
    # by real path: the proof's site-packages links the environment's distributions in
    # (as install.sh's one venv holds them), so its torch is reached through a link
    real = os.path.realpath(where)
    inside = any(real.startswith(os.path.realpath(site).rstrip("/") + "/") for site in sites)
    if inside and _same_version(version, want):
        return None
    try:
        public = Version(want).public
    except InvalidVersion:
        public = want
    return Cause(
        "another-torch",
        f"it loaded torch {version} from {where}; the wheels are compiled against torch "
        f"{want} and the consumer environment's is under {' or '.join(sites)}",
        f"pin torch=={public} in runtime-requirements.txt (then `kiln lock`), "
        "and keep other torch installs off the environment's path",
    )


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b
