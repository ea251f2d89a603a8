"""The one table of build-failure causes kiln knows: each row reads a failed step's first
errors and, when they are its kind, says the cause and the fix, with what the build really
saw (the header the include path resolved, the package and version it came from, the
folders the linker searched). Standard library only: it runs where the build ran.

Rows, in the order they are tried (the first that matches wins), each a function below:
``disk_full``, ``killed`` (signal 9: most likely out of memory; the runner's own OOM
message wins where its cgroup counted the kill), ``arch_refused`` (a unit kiln's arch
rewrite would not compile for the build's archs: how to leave it out), ``unknown_arch``
(the CUDA release that has it), ``missing_header`` (the Debian/Ubuntu package or NVIDIA's
pip wheel, and the ``[[build.system]]`` entry that makes preflight check it),
``cxx_standard`` (the ``cxx_append_flags`` fix), ``missing_identifier`` (NCCL, NVSHMEM,
CCCL, torch, the CUDA runtime or driver: the header resolved, its package and version;
pin a newer one), ``missing_library`` (``cannot find -lX``: the package, where the linker
looked) and ``undefined_symbol`` (the library that defines it, what the link named, where
it looked).

Its second part (``LOAD_ROWS``) says why a built module does not import where the release
lands (the import proof): ``load_timeout``, ``load_missing_library`` (torch's library
before torch is imported; a library the environment has but the loader does not search;
a library nobody ships: the wheel, the requirement or the ``[[build.runtime_libraries]]``
entry), ``load_abi_mismatch`` (built against another torch than the one it lands with),
``load_left_off_link`` (defined in a library the extension does not link),
``load_never_compiled`` (declared, defined in a source the build never compiled, or
defined nowhere), ``load_needs_gpu``, ``load_missing_module`` and ``load_python_error``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.inside import libraries, proc
from kiln.inside.kit import archflags

if TYPE_CHECKING:
    from kiln.inside.diagnose import Diagnosis


@dataclass(frozen=True)
class Cause:
    row: str
    cause: str
    fix: str
    # A fix that changes the build environment, to be resolved (dry) against the profile's
    # index where the index can be reached (the host, kiln/orchestrate/fixcheck.py): the
    # distribution that pins, its version, the pinned one and the version to go above.
    resolve: dict[str, str] | None = None
    # The fix as a structured edit ``kiln build --fix`` applies (kiln/orchestrate/fixes.py):
    # {"file": "vendors/x.toml", "keys": ["build", "env", "X"], "set": value} or "append":
    # [values] to a list; None where the fix needs judgement (then it stays text).
    edit: dict[str, Any] | None = None


def toml_edit(
    vendor: str, keys: list[str], *, set_to: Any = None, append: list[Any] | None = None
) -> dict[str, Any]:
    """A fix that sets (or appends to) one key of the vendor's TOML."""
    edit: dict[str, Any] = {"file": f"vendors/{vendor}.toml", "keys": keys}
    if append is not None:
        edit["append"] = append
    else:
        edit["set"] = set_to
    return edit


@dataclass(frozen=True)
class Failure:
    """What a row reads: the diagnosis, the whole output, the step's environment, tree."""

    d: Diagnosis
    output: str
    env: Mapping[str, str]
    tree: Path
    vendor: str

    @property
    def messages(self) -> list[str]:
        return [e.message for e in self.d.errors]


# --------------------------------------------------------------------------- packages

# Header (exact name, or a folder prefix ending in "/") -> (Debian/Ubuntu package, NVIDIA's
# pip wheel). The pip names are CUDA 13's; the Debian ones are bookworm's and noble's.
HEADER_PACKAGES: tuple[tuple[str, str | None, str | None], ...] = (
    ("infiniband/", "libibverbs-dev", None),
    ("rdma/", "librdmacm-dev", None),
    ("numa.h", "libnuma-dev", None),
    ("numaif.h", "libnuma-dev", None),
    ("mpi.h", "libopenmpi-dev", None),
    ("hwloc.h", "libhwloc-dev", None),
    ("zlib.h", "zlib1g-dev", None),
    ("Python.h", "python3-dev", None),
    ("fmt/", "libfmt-dev", None),
    ("pybind11/", "pybind11-dev", "pybind11"),
    ("nccl.h", None, "nvidia-nccl-cu13"),
    ("nccl_net.h", None, "nvidia-nccl-cu13"),
    ("nvshmem", None, "nvidia-nvshmem-cu13"),
    ("host/nvshmem", None, "nvidia-nvshmem-cu13"),
    ("device/nvshmem", None, "nvidia-nvshmem-cu13"),
    ("cudnn", None, "nvidia-cudnn-cu13"),
    ("cublas", None, "nvidia-cublas"),
    ("cusparse", None, "nvidia-cusparse"),
    ("cufft", None, "nvidia-cufft"),
    ("curand", None, "nvidia-curand"),
    ("cusolver", None, "nvidia-cusolver"),
    ("cupti", None, "nvidia-cuda-cupti"),
    ("nvrtc.h", None, "nvidia-cuda-nvrtc"),
    ("cuda_runtime", None, "nvidia-cuda-runtime"),
    ("cuda.h", None, "nvidia-cuda-runtime"),
    ("cub/", None, "nvidia-cuda-cccl"),
    ("thrust/", None, "nvidia-cuda-cccl"),
    ("cuda/", None, "nvidia-cuda-cccl"),
)

# Library (the X of -lX) -> (Debian/Ubuntu package, pip wheel).
LIBRARY_PACKAGES: dict[str, tuple[str | None, str | None]] = {
    "ibverbs": ("libibverbs-dev", None),
    "mlx5": ("libibverbs-dev", None),
    "rdmacm": ("librdmacm-dev", None),
    "numa": ("libnuma-dev", None),
    "nccl": (None, "nvidia-nccl-cu13"),
    "nvshmem": (None, "nvidia-nvshmem-cu13"),
    "nvshmem_host": (None, "nvidia-nvshmem-cu13"),
    "nvshmem_device": (None, "nvidia-nvshmem-cu13"),
    "cublas": (None, "nvidia-cublas"),
    "cublasLt": (None, "nvidia-cublas"),
    "cudnn": (None, "nvidia-cudnn-cu13"),
    "cudart": (None, "nvidia-cuda-runtime"),
    "cuda": (None, "the CUDA driver's stub (libcuda.so in CUDA's lib64/stubs)"),
}


# Where a dependency's identifiers are declared: its name, the prefixes or namespaces of
# its identifiers, the header that declares them, and the macros that hold its version.
@dataclass(frozen=True)
class Dependency:
    name: str
    matches: Callable[[str], bool]
    header: str
    version_file: str  # relative to the header's include folder
    version_macros: tuple[str, ...]
    pin: str  # how to get a newer one


DEPENDENCIES: tuple[Dependency, ...] = (
    Dependency(
        "NCCL",
        lambda s: s.startswith(("nccl", "NCCL_")),
        "nccl.h",
        "nccl.h",
        ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"),
        "pin a newer {dist} in the profile's build_tools (kiln.toml: "
        'build_tools = [..., "{dist}>{version}"]) or use a builder image with a newer NCCL',
    ),
    Dependency(
        "NVSHMEM",
        lambda s: s.startswith(("nvshmem", "NVSHMEM")),
        "nvshmem.h",
        "non_abi/nvshmem_version.h",
        (
            "NVSHMEM_VENDOR_MAJOR_VERSION",
            "NVSHMEM_VENDOR_MINOR_VERSION",
            "NVSHMEM_VENDOR_PATCH_VERSION",
        ),
        "pin a newer {dist} in the profile's build_tools (kiln.toml: "
        'build_tools = [..., "{dist}>{version}"]) or use a builder image with a newer NVSHMEM',
    ),
    Dependency(
        "CCCL",
        lambda s: s.startswith(("cub::", "thrust::", "cuda::")) or s in ("cub", "thrust"),
        "cuda/version",
        "cuda/std/__cccl/version.h",
        ("CCCL_MAJOR_VERSION", "CCCL_MINOR_VERSION", "CCCL_PATCH_VERSION"),
        "use a newer CUDA (the profile's cuda and builder image; CCCL comes with it) "
        'or pin a newer nvidia-cuda-cccl in the profile\'s build_tools ("{dist}>{version}")',
    ),
    Dependency(
        "torch",
        lambda s: s.startswith(("at::", "torch::", "c10::")) or s in ("at", "torch", "c10"),
        "torch/version.h",
        "torch/version.h",
        ("TORCH_VERSION_MAJOR", "TORCH_VERSION_MINOR", "TORCH_VERSION_PATCH"),
        "set a newer torch in the profile (kiln.toml: torch = ...); this one is {version}",
    ),
    Dependency(
        "the CUDA driver API",
        lambda s: bool(re.match(r"^(cu[A-Z]|CU_)", s)),
        "cuda.h",
        "cuda.h",
        ("CUDA_VERSION",),
        "use a newer CUDA (the profile's cuda and builder image); this one is {version}",
    ),
    Dependency(
        "the CUDA runtime",
        lambda s: bool(re.match(r"^(cuda[A-Z]|CUDA|__nv|__cuda)", s)),
        "cuda_runtime_api.h",
        "cuda_runtime_api.h",
        ("CUDART_VERSION",),
        "use a newer CUDA (the profile's cuda and builder image); this one is {version}",
    ),
)

# The first CUDA release whose nvcc knows each arch (and, for the few renamed or dropped,
# the last one that did). From NVIDIA's release notes.
ARCH_SINCE: dict[str, str] = {
    "70": "9.0",
    "72": "10.0",
    "75": "10.0",
    "80": "11.0",
    "86": "11.1",
    "87": "11.4",
    "89": "11.8",
    "90": "11.8",
    "90a": "12.0",
    "100": "12.8",
    "100a": "12.8",
    "100f": "12.9",
    "101": "12.8",
    "101a": "12.8",
    "103": "12.9",
    "103a": "12.9",
    "103f": "12.9",
    "110": "13.0",
    "110a": "13.0",
    "110f": "13.0",
    "120": "12.8",
    "120a": "12.8",
    "120f": "12.9",
    "121": "12.9",
    "121a": "12.9",
    "121f": "12.9",
}
ARCH_UNTIL: dict[str, str] = {
    "70": "12.9 (CUDA 13 dropped Volta)",
    "72": "12.9 (CUDA 13 dropped Volta)",
    "101": "12.9 (CUDA 13.0 renamed it sm_110)",
    "101a": "12.9 (CUDA 13.0 renamed it sm_110a)",
}


def _packages(
    name: str, table: Sequence[tuple[str, str | None, str | None]]
) -> tuple[str | None, str | None]:
    for key, deb, pip in table:
        if name == key or (key.endswith("/") and name.startswith(key)):
            return deb, pip
        if not key.endswith("/") and not key.endswith(".h") and name.startswith(key):
            return deb, pip
    return None, None


def header_packages(header: str) -> tuple[str | None, str | None]:
    """(Debian/Ubuntu package, pip wheel) that provide ``header``, from the table above
    (``kiln add`` asks it which of a build's headers the build machine must provide)."""
    return _packages(header, HEADER_PACKAGES)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


# --------------------------------------------------------------------------- where things are


def site_packages() -> list[Path]:
    """The build Python's site-packages (the step runs under the build's Python)."""
    paths = sysconfig.get_paths()
    return [Path(p) for p in dict.fromkeys((paths["purelib"], paths["platlib"]))]


def _argv(command: str | None) -> list[str]:
    """A unit's command line (as ninja printed it) as its arguments."""
    if not command:
        return []
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _flag_dirs(command: str | None, flags: tuple[str, ...]) -> list[str]:
    argv = _argv(command)
    out = []
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                out.append(argv[i + 1])
            elif arg.startswith(flag) and len(arg) > len(flag):
                out.append(arg[len(flag) :])
    return out


def include_dirs(f: Failure) -> list[str]:
    """The folders the failed compile searched, in the compiler's order as far as kiln
    can know it: the command's ``-I``/``-isystem``, the environment's include paths,
    CUDA's, then torch's and NVIDIA's pip wheels' in the build Python."""
    dirs = _flag_dirs(f.d.command, ("-I", "-isystem"))
    for var in ("CPLUS_INCLUDE_PATH", "CPATH", "C_INCLUDE_PATH"):
        dirs += [p for p in f.env.get(var, "").split(os.pathsep) if p]
    cuda = f.env.get("CUDA_HOME") or f.env.get("CUDA_PATH")
    if cuda:
        dirs += [f"{cuda}/include", f"{cuda}/include/cccl"]
    for sp in site_packages():
        dirs += [str(sp / "torch" / "include"), str(sp / "torch/include/torch/csrc/api/include")]
        dirs += sorted(str(p) for p in sp.glob("nvidia/*/include"))
    dirs += ["/usr/local/include", "/usr/include"]
    return [str(f.tree / d) if not os.path.isabs(d) else d for d in dict.fromkeys(dirs)]


def library_dirs(f: Failure) -> list[str]:
    """The folders the link searched (``-L``, LIBRARY_PATH), as they are (a path a user
    copies must exist)."""
    dirs = _flag_dirs(f.d.command, ("-L",))
    dirs += [p for p in f.env.get("LIBRARY_PATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys(dirs))


def resolve(header: str, dirs: Sequence[str]) -> Path | None:
    for d in dirs:
        p = Path(d) / header
        if p.is_file():
            return p
    return None


def owner(path: Path) -> tuple[str, str] | None:
    """(distribution, version) of the pip wheel that installed ``path``, from the RECORD
    files of the site-packages above it; else the Debian package (``dpkg -S``)."""
    for sp in path.parents:
        if sp.name not in ("site-packages", "dist-packages"):
            continue
        rel = str(path.relative_to(sp))
        for record in sp.glob("*.dist-info/RECORD"):
            try:
                if any(ln.split(",", 1)[0] == rel for ln in record.read_text().splitlines()):
                    name, _, version = record.parent.name.removesuffix(".dist-info").partition("-")
                    return name.replace("_", "-").lower(), version
            except OSError:
                continue
    if shutil.which("dpkg"):
        res = proc.run(["dpkg", "-S", str(path)], check=False)
        if res.returncode == 0 and ":" in res.output:
            pkg = res.output.split(":", 1)[0].strip()
            ver = proc.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=False).output
            return pkg, ver.strip()
    return None


def header_version(include_dir: Path, dep: Dependency) -> str | None:
    try:
        text = (include_dir / dep.version_file).read_text(errors="replace")
    except OSError:
        return None
    parts = []
    for macro in dep.version_macros:
        m = re.search(rf"#\s*define\s+{macro}\s+\(?(\d+)", text)
        if not m:
            break
        parts.append(m[1])
    if not parts:
        return None
    if dep.version_macros in (("CUDA_VERSION",), ("CUDART_VERSION",)):  # 13020 -> 13.2
        n = int(parts[0])
        return f"{n // 1000}.{n % 1000 // 10}"
    return ".".join(parts)


def nvcc_version(env: Mapping[str, str]) -> str | None:
    cuda = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    nvcc = f"{cuda}/bin/nvcc" if cuda else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return None
    m = re.search(r"release (\d+\.\d+)", proc.run([nvcc, "--version"], check=False).output)
    return m[1] if m else None


def toml_block(table: str, /, **keys: str) -> str:
    """A TOML table to paste into a vendor TOML, a key a line, indented under the screen's
    ``fix:`` (what a user copies must paste: one line of keys is not TOML)."""
    body = "".join(f'\n      {k} = "{v}"' for k, v in keys.items())
    return f"\n      {table}{body}"


def _system_entry(vendor: str, key: str, value: str, package: str) -> str:
    return (
        f"declare it in vendors/{vendor}.toml so preflight checks it before the next build:"
        + toml_block("[[build.system]]", **{key: value, "package": package})
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
        deb, pip = _packages(header, HEADER_PACKAGES)
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
            fix += "; " + _system_entry(f.vendor, "header", header, deb)
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


def _cxx_edit(f: Failure, std: str, unit: str | None) -> dict[str, Any]:
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


def _torch_form(arch: str) -> str:
    """``sm_103a`` -> ``10.3a`` (as TORCH_CUDA_ARCH_LIST and upstream tables spell it)."""
    m = re.match(r"sm_(\d+)(\d)([af]?)$", arch)
    return f"{m[1]}.{m[2]}{m[3]}" if m else arch


def _arch_table(tree: Path, made: list[str], missing: list[str]) -> str | None:
    """Where the upstream's setup.py turns TORCH_CUDA_ARCH_LIST into its own targets: the
    first line naming an arch it made (``10.0a``, ``100a``) and none it dropped."""
    setup = tree / "setup.py"
    try:
        lines = setup.read_text(errors="replace").splitlines()
    except OSError:
        return None

    def forms(a: str) -> tuple[str, ...]:
        return (_torch_form(a), a.removeprefix("sm_"))

    for i, line in enumerate(lines, 1):
        if any(x in line for a in made for x in forms(a)) and not any(
            x in line for a in missing for x in forms(a)
        ):
            return f"setup.py:{i}"
    return None


def arch_dropped(f: Failure) -> Cause | None:
    """A CUDA unit made fewer archs than TORCH_CUDA_ARCH_LIST named (kiln's wrapper
    stopped it at its first compile)."""
    for err in f.d.errors:
        m = archflags.DROPPED.match(err.render()) if err.tool == "kiln" else None
        if not m:
            continue
        made = [a.strip() for a in m["made"].split(",") if a.strip() != "no SASS"]
        missing = [a.strip() for a in m["missing"].split(",")]
        listed = f.env.get("TORCH_CUDA_ARCH_LIST", "")
        where = _arch_table(f.tree, made, missing)
        forms = ", ".join(_torch_form(a) for a in missing)
        # the rewrite gives a unit only the archs its own flags cover (an arch-specific
        # target covers itself alone): offered only where the targets made cover the rest
        rewrite = bool(made) and all(
            any(archflags.covers(a, archflags.target(x)) for a in made) for x in missing
        )
        table = f" ({where})" if where else ""
        return Cause(
            "arch-dropped",
            f'kiln set TORCH_CUDA_ARCH_LIST={listed} (arch_control = "torch-arch-list") and '
            f"the upstream asked nvcc for {', '.join(made) or 'no SASS'} only for {m['unit']}: "
            f"it maps the list through targets of its own and leaves "
            f"{', '.join(_torch_form(a) for a in missing)} out"
            + (f" (its arch table: {where})" if where else ""),
            f"give the upstream's table{table} an entry for {forms} (a patch in patches/)"
            + (
                f', or let kiln set every unit\'s archs: arch_control = "rewrite" in '
                f"vendors/{f.vendor}.toml"
                if rewrite
                else f' (arch_control = "rewrite" would not do: {", ".join(made)} covers '
                f"{'itself' if len(made) == 1 else 'themselves'} alone, so the rewrite stops "
                f"the unit as arch-uncovered)"
            )
            + f", or leave {', '.join(missing)} out of build.archs",
        )
    return None


# PTX instructions of one architecture's own features -> the targets that have them
# (PTX ISA 9.0, "Target ISA notes").
INSTRUCTION_ARCHS: tuple[tuple[str, str], ...] = (
    ("wgmma.", "sm_90a only (Hopper's warpgroup MMA; SM100 has tcgen05 instead)"),
    ("tcgen05.", "sm_100a, sm_101a, sm_103a, sm_110a and their families (sm_100f, ...)"),
    ("setmaxnreg", "sm_90a, sm_100a, sm_101a, sm_103a, sm_120a and their families"),
    ("cp.async.bulk.tensor", "sm_90 and later"),
    ("multimem.", "sm_90 and later"),
    ("mbarrier.try_wait", "sm_90 and later"),
    ("elect.sync", "sm_90 and later"),
)
# PTX instruction prefix -> the arch-specific targets that have it (their families too);
# others: the first generic arch that has it.
INSTRUCTION_TARGETS: tuple[tuple[str, frozenset[str], int], ...] = (
    ("wgmma.", frozenset({"90a"}), 0),
    ("tcgen05.", frozenset({"100a", "101a", "103a", "110a", "100f", "101f", "103f", "110f"}), 0),
    ("setmaxnreg", frozenset({"90a", "100a", "101a", "103a", "120a", "100f", "103f", "120f"}), 0),
    ("cp.async.bulk.tensor", frozenset(), 90),
    ("multimem.", frozenset(), 90),
    ("mbarrier.try_wait", frozenset(), 90),
    ("elect.sync", frozenset(), 90),
)


def _has_instruction(insn: str, arch: str) -> bool:
    """Whether ``arch`` (``sm_100a``) has the PTX instruction ``insn`` (unknown: assume so)."""
    name = arch.removeprefix("sm_").removeprefix("compute_")
    for prefix, specific, generic in INSTRUCTION_TARGETS:
        if insn.startswith(prefix):
            number = int(re.sub(r"\D", "", name) or 0)
            return name in specific if specific else number >= generic
    return True


def _built_archs(env: Mapping[str, str]) -> list[str]:
    """The archs the step builds, as kiln told its compiler wrapper or torch."""
    for var in ("KILN_BUILD_ARCHS", "KILN_NVCC_ARCHS", "KILN_NVCC_EXPECT"):
        if env.get(var):
            return env[var].split()
    listed = [a.removesuffix("+PTX") for a in env.get("TORCH_CUDA_ARCH_LIST", "").split(";")]
    return [f"sm_{a.replace('.', '')}" for a in listed if a]


_PTX_INSN = re.compile(
    r"Instruction '(?P<insn>[\w.]+)' (?:not supported on \.target|cannot be compiled for "
    r"architecture) '(?P<target>sm_\w+)'"
)


def ptx_instruction(f: Failure) -> Cause | None:
    """ptxas refuses an instruction the unit's target does not have (Hopper's wgmma built
    for sm_100a): the unit, the arch, which archs have it, where its PTX is kept."""
    for err in f.d.errors:
        m = _PTX_INSN.search(err.message)
        if not m or err.tool != "ptxas":
            continue
        insn, target = m["insn"], m["target"]
        has = next((a for p, a in INSTRUCTION_ARCHS if insn.startswith(p)), None)
        unit = f.d.unit or "a unit"
        kept = f" (its PTX, kept: {err.file}:{err.line})" if err.file else ""
        built = _built_archs(f.env)
        having = [a for a in built if _has_instruction(insn, a)]
        guard = (
            f"compile {unit} only for archs that have {insn}: the upstream's arch guard "
            f"around that code (#if __CUDA_ARCH__ ...) or its switch for the unit "
            f'(arch_control = "toggles" with build.arch_toggles in vendors/{f.vendor}.toml)'
        )
        if built and not having:
            # leaving the arch out only moves the failure to the next one of the build
            fix = (
                f"{guard}; no arch this build makes ({', '.join(built)}) has {insn}: "
                f"leaving {target} out of build.archs does not help (the next arch fails the "
                f"same, or none is left), the code must not be compiled for them"
            )
        else:
            fix = f"{guard}, or leave {target} out of build.archs"
        return Cause(
            "ptx-instruction",
            f"{unit} was compiled for {target}, and its device code uses {insn}"
            + (f", which exists on {has}" if has else f", which {target} does not have")
            + kept,
            fix,
        )
    return None


_ARCH = re.compile(r"(?:Unsupported gpu architecture|Value) '(?:compute_|sm_)(?P<arch>\d+[af]?)'")


def _own_arch_flags(f: Failure, archs: set[str]) -> list[str] | None:
    """The failed unit's single-token arch flags (``-gencode=arch=...``, ``-arch=sm_...``,
    read as kiln's compiler wrapper reads them) that name one of ``archs`` (``"90a"``):
    the upstream's own, which the wrapper can drop token by token. None where one of them
    is a two-token ``-gencode arch=...`` (its ``-gencode`` is shared, so it cannot be
    dropped that way)."""
    flags = []
    for flag in archflags.arch_tokens(_argv(f.d.command)):
        try:
            _, names, _ = archflags.split(flag.split(" "))
        except archflags.ArchFlagError:
            continue
        if any(n.split("_", 1)[-1] in archs for n in names):
            if " " in flag:
                return None
            flags.append(flag)
    return list(dict.fromkeys(flags))


def _drop_flags(flags: list[str]) -> str:
    return f"build.nvcc_drop_flags = [{', '.join(json.dumps(x) for x in flags)}]"


def unknown_arch(f: Failure) -> Cause | None:
    for message in f.messages:
        m = _ARCH.search(message)
        if not m or ("Unsupported" not in message and "is not defined" not in message):
            continue
        arch = m["arch"]
        nvcc = nvcc_version(f.env) or "unknown"
        since, until = ARCH_SINCE.get(arch), ARCH_UNTIL.get(arch)
        if since and until:
            has = f"sm_{arch} is known to CUDA {since} to {until}"
        elif since:
            has = f"sm_{arch} needs CUDA {since} or newer"
        else:
            has = f"no CUDA release kiln knows of has sm_{arch}"
        cause = f"this build's nvcc (CUDA {nvcc}) does not know sm_{arch}: {has}"
        fix = (
            f"set the profile's cuda (and builder image) to a CUDA that has sm_{arch}, or drop "
            f"sm_{arch} from the archs (build.archs / the profile's archs; an arch the "
            f"upstream hard-codes: build.nvcc_drop_flags)"
        )
        if since and nvcc != "unknown" and _version_tuple(nvcc) >= _version_tuple(since):
            fix = f"sm_{arch} was renamed or dropped: {fix}"
        hard = [] if f"sm_{arch}" in _built_archs(f.env) else _own_arch_flags(f, {arch})
        edit = None
        if hard:
            # the upstream's own flag (kiln was not asked for the arch): dropping that
            # token is a mechanical edit ``kiln build --fix`` applies
            edit = toml_edit(f.vendor, ["build", "nvcc_drop_flags"], append=hard)
            fix = (
                f"the upstream hard-codes {' '.join(hard)}: add {_drop_flags(hard)} to "
                f"vendors/{f.vendor}.toml (kiln's compiler wrapper removes it); or {fix}"
            )
        return Cause("unknown-arch", cause, fix, edit=edit)
    return None


def _said_arch_flags(refusal: str) -> list[str] | None:
    """The unit's own arch flags as the wrapper's refusal names them (a build that runs
    nvcc without printing its commands); None where one is a two-token ``-gencode
    arch=...`` (it cannot be dropped token by token) or none is named."""
    _, sep, said = refusal.partition(archflags.FLAGS_SAID)
    words = said.split() if sep else []
    if not words or any("=" not in w for w in words):
        return None
    return list(dict.fromkeys(words))


def arch_refused(f: Failure) -> Cause | None:
    """A unit whose own arch flags cover none of the archs the rewrite builds. Building
    its archs too does not help (the unit would then cover some of the build's archs, not
    all: arch-uncovered), so the fix is to drop its flags where its code is valid on the
    build's archs, or to leave it out."""
    for err in f.d.errors:
        m = archflags.REFUSED.match(err.render()) if err.tool == "kiln" else None
        if not m:
            continue
        asked = {name.strip().split("_", 1)[-1] for name in m["asked"].split(",")}
        own = _own_arch_flags(f, asked) or _said_arch_flags(err.render())
        drop = (
            f"drop its own arch flags so the rewrite gives it the build's archs: "
            f"{_drop_flags(own)} in vendors/{f.vendor}.toml (kiln's compiler wrapper removes "
            f"them from this vendor's nvcc calls)"
            if own
            else "a patch that drops its own arch flags (the rewrite then gives it the "
            "build's archs)"
        )
        return Cause(
            "arch-refused",
            f'kiln\'s arch rewrite (arch_control = "rewrite") compiles a unit only for the '
            f"archs its own flags cover, and {m['unit']}'s ({m['asked']}) cover none of "
            f"{m['built']}: an arch-specific target covers only itself, a family one the later "
            f"archs of its family, a generic one every later arch (docs/archs.md)",
            f"where {m['unit']}'s code is valid on {m['built']}, {drop}; else leave "
            f"{m['unit']} out of this build with the upstream's own switch "
            f'(arch_control = "toggles" with build.arch_toggles in vendors/{f.vendor}.toml) '
            f"or a patch",
        )
    return None


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


def arch_uncovered(f: Failure) -> Cause | None:
    """A unit's own arch flags cover only some of the archs the rewrite builds (an
    arch-specific target of one of them): stopped at its first compile."""
    for err in f.d.errors:
        m = archflags.UNCOVERED.match(err.render()) if err.tool == "kiln" else None
        if not m:
            continue
        kept = ", ".join(f'"{a.strip()}"' for a in m["kept"].split(","))
        return Cause(
            "arch-uncovered",
            f'kiln\'s arch rewrite (arch_control = "rewrite") gives a unit only the archs its '
            f"own flags cover, and {m['unit']} asks for {m['asked']}, which covers "
            f"{m['kept']} alone: an arch-specific target runs on that arch only, so its "
            f"kernels would be missing on {m['missing']} (docs/archs.md)",
            f"where the unit's code is valid on the whole family, ask for the family target "
            f"(e.g. -gencode=arch=compute_100f,code=sm_100f: a patch in patches/); else build "
            f"only what it covers: build.archs = [{kept}] in vendors/{f.vendor}.toml",
        )
    return None


_CANNOT_FIND = re.compile(r"cannot find -l(?P<lib>\S+?)(?::|$)")


def _matches(f: Failure, rx: re.Pattern[str], group: str) -> list[str]:
    """``group`` of every error message ``rx`` matches, each once, in order."""
    found = (rx.search(message) for message in f.messages)
    return list(dict.fromkeys(m[group] for m in found if m))


def missing_library(f: Failure) -> Cause | None:
    libs = _matches(f, _CANNOT_FIND, "lib")
    if not libs:
        return None
    looked = library_dirs(f)
    lib = libs[0]
    deb, pip = LIBRARY_PACKAGES.get(lib, (None, None))
    fixes = [f"apt-get install {deb}"] if deb else []
    fixes += [f"pip install {pip} (the profile's build_tools)"] if pip else []
    if not fixes:
        fixes = [f"install the package that provides lib{lib}.so"]
    fix = "; or ".join(fixes) + (
        f"; or add its folder to build.env LIBRARY_PATH in vendors/{f.vendor}.toml (kiln "
        "links it from there and ships it in the wheel, which would not load without it); "
        + _system_entry(f.vendor, "library", lib, deb or "PACKAGE")
    )
    return Cause(
        "missing-library",
        f"the linker found no {', '.join('-l' + x for x in libs)}: it looked in LIBRARY_PATH "
        f"and -L {', '.join(looked) or '(none)'} and the compiler's own folders",
        fix,
    )


_UNDEFINED = re.compile(r"undefined (?:reference to|symbol:?) [`‘']?(?P<sym>[\w:]+)")
# Symbol prefix -> the library that defines it.
SYMBOL_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("nccl", "nccl"),
    ("nvshmemx", "nvshmem_host"),
    ("nvshmem", "nvshmem_host"),
    ("cublasLt", "cublasLt"),
    ("cublas", "cublas"),
    ("cudnn", "cudnn"),
    ("cuda", "cudart"),
    ("__cuda", "cudart"),
    ("cu", "cuda"),
    ("ibv_", "ibverbs"),
    ("mlx5dv_", "mlx5"),
)


# where setuptools links an extension: build/lib.<platform>/<its path in the wheel>
_BUILD_LIB = re.compile(r"(?:^|/)build/lib[^/]*/(?P<inside>.+\.so)$")
# At most this many libraries are read with nm to find an unknown symbol's definer.
MAX_LIBRARIES_READ = 40


def _site_library_dirs() -> list[Path]:
    """The build Python's site-packages folders that hold libraries (NVIDIA's wheels)."""
    return [d for sp in site_packages() for d in (*sp.glob("nvidia/*/lib"), *sp.glob("*/lib"))]


def _definer(f: Failure, sym: str, name: str | None) -> Path | None:
    """The library that defines ``sym``: by ``name`` (its prefix's library) in the folders
    the link searched, then in the build Python's site-packages; with no name, the first
    library of the searched folders whose dynamic symbols include it (nm)."""
    searched = library_dirs(f)
    if name:
        found = libraries.shared_libraries([*searched, *_site_library_dirs()], name)
        return found[0] if found else None
    # the linker shows C++ names demangled (kiln_scale, c10::foo): nm's are mangled
    # (_Z10kiln_scalei), so those are matched by their mangled parts
    mangled = "".join(f"{len(part)}{part}" for part in sym.split("::"))
    for lib in libraries.shared_libraries(searched)[:MAX_LIBRARIES_READ]:
        defined = libraries.defined_symbols(str(lib))
        if sym in defined or any(s.startswith("_Z") and mangled in s for s in defined):
            return lib
    return None


def _link_fix(f: Failure, definer: Path) -> str:
    """Link ``definer`` and, where it lands in site-packages beside the extension (NVIDIA's
    wheels), let the loader find it there, in one patch: the link alone would fail the
    next import (the loader searches no site-packages)."""
    lname = libraries.link_name(definer)
    target = _BUILD_LIB.search(link_output(f.d.command) or "")
    runpath = libraries.runpath_to(target["inside"] if target else None, os.path.realpath(definer))
    link = f"add {lname!r} to the extension's libraries in setup.py (-l{lname})"
    if runpath:
        link = (
            f"link it and let the loader find it where it lands, in one patch (patches/): "
            f"{link} and '-Wl,-rpath,{runpath}' to its extra_link_args (the folder of "
            f"{definer.name} beside it in site-packages)"
        )
    else:
        link = f"link it: {link}, a patch in patches/"
    if str(definer.parent) not in library_dirs(f):
        link += (
            f"; the link does not search {definer.parent}: name it in the same patch (library_dirs)"
        )
    return link


def link_output(command: str | None) -> str | None:
    """What a command line writes (the argument after ``-o``)."""
    argv = _argv(command)
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"), None)


def undefined_symbol(f: Failure) -> Cause | None:
    syms = _matches(f, _UNDEFINED, "sym")
    if not syms:
        return None
    lib = next((lib for p, lib in SYMBOL_LIBRARIES if syms[0].startswith(p)), None)
    linked = [f"-l{x}" for x in _flag_dirs(f.d.command, ("-l",))]
    looked = library_dirs(f)
    definer = _definer(f, syms[0], lib)
    if definer is not None:
        needs = f"{definer.name} ({definer.parent})"
        fix = _link_fix(f, definer)
    else:
        needs = f"lib{lib} (-l{lib})" if lib else "the library that defines them"
        fix = (
            f"link {needs}: add it to the upstream's libraries (a patch), or its folder to "
            f"build.env LIBRARY_PATH when it is present but not found"
        )
    return Cause(
        "undefined-symbol",
        f"the link left {', '.join(syms[:4])} undefined: they are defined in {needs}; the "
        f"link named {' '.join(linked) or 'no -l libraries kiln could see'}, looked in "
        f"LIBRARY_PATH and -L {', '.join(looked) or '(none)'}",
        fix,
    )


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)
_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '(?P<name>[\w.]+)'")


def _setup_line(f: Failure, before: int, module: str) -> str | None:
    """The line of setup.py the traceback before ``before`` stops at: a frame of
    setup.py itself, or setuptools' ``exec`` of it (shown as ``<string>``) where that line
    of the tree's setup.py imports ``module``."""
    frames = list(_FRAME.finditer(f.output[:before]))
    if not frames:
        return None
    last = frames[-1]
    if last["file"].endswith("setup.py"):
        return last["line"]
    if last["file"] == "<string>":
        try:
            lines = (f.tree / "setup.py").read_text(errors="replace").splitlines()
            text = lines[int(last["line"]) - 1]
        except (OSError, IndexError):
            return None
        if re.search(rf"\bimport\s+{re.escape(module)}\b|\bfrom\s+{re.escape(module)}\b", text):
            return last["line"]
    return None


# a module setup.py imports -> the distribution that provides it (where the names differ)
MODULE_DISTRIBUTIONS = {"yaml": "PyYAML", "cv2": "opencv-python", "PIL": "pillow"}


def setup_import(f: Failure) -> Cause | None:
    """setup.py imports a module the build venv lacks (pybind11, cmake, ...): the build
    never reached a compiler. Names setup.py's line and the build_tools entry."""
    m = _NO_MODULE.search(f.output)
    module = m["name"].split(".")[0] if m else ""
    line = _setup_line(f, m.start(), module) if m else None
    if not m or line is None:
        return None
    own = _tree_module(f.tree, module)
    if own is not None:  # the tree's own: no distribution would be the fix
        return Cause(
            "setup-import",
            f"setup.py:{line} imports {m['name']}, a module of the upstream's own tree "
            f"({own}) that is not on sys.path when setup.py runs from the tree's root",
            f"make setup.py find it where it lies ({own}): a patch that imports it by that "
            f"path (or adds its folder to sys.path); no build_tools entry provides it",
        )
    dist = MODULE_DISTRIBUTIONS.get(module, module)
    return Cause(
        "setup-import",
        f"setup.py:{line} imports {m['name']}, which the build venv does not have (the "
        "build runs without isolation: setup.py's own imports come from the build venv)",
        f'add "{dist}==VERSION" (its version pinned) to build.build_tools in '
        f"vendors/{f.vendor}.toml (installed for this vendor's build alone), e.g. "
        f'build_tools = ["{dist}==VERSION"]; or to the profile\'s build_tools in kiln.toml '
        "(the build venv every vendor shares)",
        # a module is not always a distribution: the host checks on the index first
        resolve={"kind": "distribution", "dist": dist, "module": module},
    )


def _tree_module(tree: Path, module: str) -> str | None:
    """Where the tree holds ``module`` (``module.py`` or ``module/__init__.py``, three
    folders down at most, outside .git and kiln's .kiln), as a path in the tree."""
    for depth in range(4):
        pattern = "/".join(["*"] * depth)
        for candidate in (f"{module}.py", f"{module}/__init__.py"):
            for found in sorted(tree.glob(f"{pattern}/{candidate}" if pattern else candidate)):
                rel = found.relative_to(tree)
                if rel.parts[0] not in (".git", ".kiln"):
                    return str(rel)
    return None


_NET_ERROR = re.compile(
    r"urlopen error|Name or service not known|Temporary failure in name resolution|"
    r"Could not resolve host|Network is unreachable|No route to host|Connection refused|"
    r"getaddrinfo failed|Failed to establish a new connection"
)
_URL = re.compile(r"https?://[^\s'\"<>)\]]+")
_SWITCH = re.compile(
    r"os\.(?:getenv|environ\.get)\(\s*[\"'](?P<var>\w+)[\"']\s*(?:,\s*[\"'](?P<default>[^\"']*)"
    r"[\"']\s*)?\)\s*(?P<op>==|!=)\s*[\"'](?P<value>[^\"']*)[\"']"
)


def _download_switch(f: Failure) -> str | None:
    found = _download_switch_edit(f)
    return found[0] if found else None


def _download_switch_edit(f: Failure) -> tuple[str, dict[str, Any]] | None:
    """The setup.py switch that builds from source instead of downloading: a variable
    compared with a constant (``os.getenv("X_FORCE_BUILD", "FALSE") == "TRUE"``), and
    what the recipe sets it to now."""
    try:
        text = (f.tree / "setup.py").read_text(errors="replace")
    except OSError:
        return None
    found = list(_SWITCH.finditer(text))
    preferred = [m for m in found if re.search(r"FORCE|BUILD|SOURCE|DOWNLOAD|SKIP", m["var"])]
    for m in preferred or found:
        line = text.count("\n", 0, m.start()) + 1
        have = f.env.get(m["var"])
        want = m["value"]
        if have == want:
            continue  # set as compared: not what let the download happen
        now = (
            f'vendors/{f.vendor}.toml sets {m["var"]} = "{have}", but setup.py:{line} compares '
            f'it with {m["op"]} "{want}"'
            if have is not None
            else f'setup.py:{line} reads {m["var"]} (compared with {m["op"]} "{want}")'
        )
        said = f'{now}: set {m["var"]} = "{want}" in [build.env] of vendors/{f.vendor}.toml'
        return said, toml_edit(f.vendor, ["build", "env", m["var"]], set_to=want)
    return None


def _download_in_setup(f: Failure) -> str | None:
    """The URL setup.py downloads, with its line (a traceback of setup.py run by
    setuptools shows no source lines, so the output may not have it)."""
    try:
        lines = (f.tree / "setup.py").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines, 1):
        found = _URL.search(line)
        if found and re.search(r"urlopen|urlretrieve|download|wget|curl|requests\.get", line):
            return f"{found.group(0)} (setup.py:{i})"
    return None


def network_download(f: Failure) -> Cause | None:
    """The upstream's build reached for the network (a prebuilt wheel, a submodule
    fetched at build time): builds are offline."""
    m = _NET_ERROR.search(f.output)
    if not m:
        return None
    urls = _URL.findall(f.output[: m.end() + 400])
    url = urls[-1] if urls else _download_in_setup(f) or "something from the network"
    switch = _download_switch_edit(f)
    return Cause(
        "network-download",
        f"the upstream's build tried to download {url}, and builds are offline (kiln fetches "
        "sources first; a build step never reaches the network)",
        switch[0]
        if switch
        else "set the upstream's switch that builds from source instead of downloading (read "
        "its setup.py), in [build.env] of the vendor TOML; or put what it downloads in the tree "
        "(a submodule, a patch)",
        edit=switch[1] if switch else None,
    )


def killed(f: Failure) -> Cause | None:
    text = f.output
    if re.search(r"died due to signal 9|signal 9 \(Kill|\bKilled\b", text):
        return Cause(
            "killed",
            "a compiler was killed (signal 9): most likely out of memory",
            "lower --jobs or raise build.mem_per_job_gib / --mem-limit",
        )
    return None


_CANNOT_WRITE = re.compile(
    r"(?:when writing output to|cannot open output file|can't open output file|can't create|"
    r"error writing to|could not write to|cannot write)\s+(?P<path>/\S+?):?\s*:\s*"
    r"(?P<why>[^\n]+)"
)


def _free_at(path: Path) -> str:
    """``N MiB free of M`` on the file system that holds ``path`` (its nearest folder
    that exists)."""
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return "its free space could not be read"
    return f"{usage.free // 2**20} MiB free of {usage.total // 2**20} MiB"


def cannot_write(f: Failure) -> Cause | None:
    """A compiler that could not write its output or its temporary files (the disk filled
    during a long build, a temporary folder gone or not writable): the compiler's own
    fatal error, with the free space where it wrote."""
    m = _CANNOT_WRITE.search(f.output)
    if not m:
        return None
    path = Path(m["path"])
    temporary = path.suffix in (".ii", ".i", ".s", ".ptx", ".cubin", ".fatbin", ".c") or str(
        path
    ).startswith(("/tmp/", os.environ.get("TMPDIR", "/tmp/")))
    where = "its temporary files (under $TMPDIR)" if temporary else "its output"
    return Cause(
        "compiler-cannot-write",
        f"the compiler could not write {where}: {path} ({m['why'].strip()}); the file "
        f"system there has {_free_at(path)}",
        "free space there, or point TMPDIR (the compilers' temporary files) or --work at "
        "a disk with room, and rerun: what compiled is kept by the compiler cache",
    )


def disk_full(f: Failure) -> Cause | None:
    if "No space left on device" not in f.output:
        return None
    usage = shutil.disk_usage(f.tree)
    return Cause(
        "disk-full",
        f"the disk filled while building: the file system of {f.tree} has "
        f"{usage.free // 2**20} MiB free",
        "free space there (or point --work/--cache at a larger disk) and rerun",
    )


ROWS: tuple[Callable[[Failure], Cause | None], ...] = (
    cannot_write,
    disk_full,
    killed,
    setup_import,
    network_download,
    arch_refused,
    arch_uncovered,
    output_gone,
    arch_dropped,
    ptx_instruction,
    unknown_arch,
    missing_header,
    cxx_standard,
    missing_identifier,
    missing_library,
    undefined_symbol,
)


def explain(
    d: Diagnosis, output: str, env: Mapping[str, str], tree: Path, vendor: str
) -> Cause | None:
    """The first row that knows these errors, or None (the errors alone are shown)."""
    f = Failure(d, output, env, tree, vendor)
    for row in ROWS:
        cause = row(f)
        if cause is not None:
            return cause
    return None


# --------------------------------------------------------------------------- imports
# The same table's second part: why a built module does not import where the release
# lands (the import proof, kiln/orchestrate/importproof.py). The facts come from the host
# (kiln/verify/loadfacts.py: nm, c++filt, the tree); the rows only read them.


@dataclass(frozen=True)
class LoadFailure:
    """What is known of one failed import."""

    vendor: str
    module: str
    shared_object: str | None  # the extension that failed, as the output holds it
    message: str  # the import's last line
    symbol: str | None = None  # an undefined symbol, mangled
    demangled: str | None = None
    definers: tuple[str, ...] = ()  # libraries of the environment that define it exactly
    # the first definer's folder, $ORIGIN-relative to the extension where both land in
    # site-packages and the definer is not torch's (the loader searches no site-packages)
    definer_runpath: str | None = None
    linked: bool = False  # whether the extension's DT_NEEDED names one of them
    same_name: tuple[str, ...] = ()  # "lib (owner): other signature" of the same name
    dependency: str | None = None  # the dependency whose namespace the symbol is in
    torch_pin: str | None = None  # the torch the output was compiled against
    torch_environment: str | None = None  # the torch the consumer environment holds
    declared_at: tuple[str, ...] = ()  # tree:line of its declarations in headers
    defined_uncompiled: tuple[str, ...] = ()  # tree:line of definitions never compiled
    library: str | None = None  # a library the loader could not open
    library_owner: str | None = None  # the distribution of the environment that has it
    # its folder, $ORIGIN-relative to the extension, where both land in site-packages
    library_runpath: str | None = None
    library_is_torch: bool = False
    python_error: str | None = None
    frame: str | None = None  # the innermost traceback frame
    timed_out: bool = False
    gpu: bool = False  # the output reads like a missing GPU or driver


def _so(f: LoadFailure) -> str:
    return f.shared_object or f.module


def load_timeout(f: LoadFailure) -> Cause | None:
    if not f.timed_out:
        return None
    return Cause(
        "import-timeout",
        f"importing {f.module} did not finish within its time limit",
        f"find what the import waits for (a lock, a download, a GPU); raise "
        f"build.import_proof.timeout_s in vendors/{f.vendor}.toml if it is only slow",
    )


def load_abi_mismatch(f: LoadFailure) -> Cause | None:
    if not f.symbol or f.definers or not (f.same_name or f.dependency):
        return None
    dep = f.dependency or "its dependency"
    other = f"; the environment has {f.same_name[0]}" if f.same_name else ""
    envs = (
        f" (compiled against {f.torch_pin}; the environment holds torch {f.torch_environment})"
        if dep == "torch" and f.torch_pin
        else ""
    )
    return Cause(
        "abi-mismatch",
        f"{_so(f)} needs {f.demangled or f.symbol}, which the consumer environment's {dep} "
        f"does not define{other}: the output was built against another {dep} than the one "
        f"it lands with{envs}",
        f"build against the {dep} the release installs: the profile's torch (kiln.toml) and "
        "the torch of runtime-requirements.txt (pinned by `kiln lock` into "
        "runtime-requirements.lock) must be the same version",
    )


def load_left_off_link(f: LoadFailure) -> Cause | None:
    if not f.symbol or not f.definers or f.linked:
        return None
    lib = f.definers[0].split(" ", 1)[0]
    name = re.sub(r"^lib|\.so.*$", "", lib)
    fix = (
        f"link it: add {name!r} to the extension's libraries in setup.py (-l{name}, a patch "
        f"in patches/), so the extension records NEEDED {lib}"
    )
    if f.definer_runpath:
        # the link alone fails the next import: the loader then cannot open the library
        # (it searches no site-packages), unless torch happened to load it first
        fix = (
            f"link it and let the loader find it where it lands, in one patch (patches/): add "
            f"{name!r} to the extension's libraries in setup.py (-l{name}, NEEDED {lib}) and "
            f"'-Wl,-rpath,{f.definer_runpath}' to its extra_link_args (the folder of "
            f"{f.definers[0]} beside it in site-packages)"
        )
    return Cause(
        "library-left-off-link",
        f"{f.demangled or f.symbol} is defined in {f.definers[0]}, which {_so(f)} does not "
        f"link (no DT_NEEDED {lib}): nothing loads that library before it",
        fix,
    )


def load_never_compiled(f: LoadFailure) -> Cause | None:
    if not f.symbol or f.definers:
        return None
    what = f.demangled or f.symbol
    if f.defined_uncompiled:
        where = f.defined_uncompiled[0]
        source = where.rsplit(":", 1)[0]
        return Cause(
            "declared-never-compiled",
            f"{what} is declared"
            + (f" at {f.declared_at[0]}" if f.declared_at else "")
            + f" and defined at {where}, which the build never compiled: no library of the "
            "consumer environment defines it either",
            f"add {source} to the extension's sources in setup.py (a patch in patches/)",
        )
    declared = f" (declared at {f.declared_at[0]})" if f.declared_at else ""
    return Cause(
        "declared-never-compiled",
        f"{what}{declared} is defined by no source the build compiled and by no library of "
        "the consumer environment",
        "define it, or add the source that defines it to the extension's sources in "
        "setup.py (a patch in patches/); a library that should provide it belongs in the "
        "extension's libraries",
    )


def load_missing_library(f: LoadFailure) -> Cause | None:
    if not f.library:
        return None
    if f.library_is_torch:
        return Cause(
            "imports-before-torch",
            f"{f.module} loads an extension that links torch's {f.library} before torch is "
            "imported (torch's libraries are found only once torch is loaded)",
            "import torch first in the package's __init__.py (a patch), as torch extensions do",
        )
    if f.library_owner:
        runpath = (
            f"add '-Wl,-rpath,{f.library_runpath}' to the extension's extra_link_args in "
            f"setup.py (a patch in patches/: the folder of {f.library} beside it in "
            "site-packages)"
            if f.library_runpath
            else "give the extension a RUNPATH to it ($ORIGIN-relative, e.g. -Wl,-rpath,"
            "'$ORIGIN/../nvidia/<pkg>/lib')"
        )
        return Cause(
            "library-not-found",
            f"{_so(f)} needs {f.library}, which the consumer environment has ({f.library_owner}) "
            "but the loader does not search there",
            f"{runpath}; or import the package that loads it first",
        )
    stem = re.sub(r"^lib|\.so.*$", "", f.library)
    deb, pip = LIBRARY_PACKAGES.get(stem, (None, None))
    ship = (
        f"add {pip} to runtime-requirements.txt and the wheel's dependencies"
        if pip
        else (
            "add the wheel that ships it to runtime-requirements.txt and the wheel's dependencies"
        )
    )
    system = (deb or "PACKAGE").removesuffix("-dev")
    return Cause(
        "library-nobody-ships",
        f"{_so(f)} needs {f.library}, and no declared dependency ships it: not the output, "
        "not a distribution of the consumer environment, not the system's C/C++ runtime",
        f"{ship}; or graft it into the wheel (auditwheel repair without excluding it); or "
        f"declare it a system requirement in vendors/{f.vendor}.toml:"
        + toml_block("[[build.runtime_libraries]]", soname=f.library, package=system),
    )


def load_needs_gpu(f: LoadFailure) -> Cause | None:
    if not f.gpu:
        return None
    edit = toml_edit(f.vendor, ["build", "import_proof", "needs_gpu"], append=[f.module])
    return Cause(
        "needs-gpu",
        f"importing {f.module} needs a GPU (or its driver), and this machine has none: {f.message}",
        f"list it in build.import_proof.needs_gpu in vendors/{f.vendor}.toml (imported where "
        "a GPU is, recorded as skipped elsewhere), or make the GPU work lazy (on first use, "
        "not at import)",
        edit=edit,
    )


def load_missing_module(f: LoadFailure) -> Cause | None:
    m = re.match(r"ModuleNotFoundError: No module named '(?P<name>[\w.]+)'", f.python_error or "")
    if not m:
        return None
    top = m["name"].split(".")[0]
    return Cause(
        "missing-python-dependency",
        f"importing {f.module} needs the module {m['name']}, which neither the output nor "
        "the consumer environment holds" + (f" (at {f.frame})" if f.frame else ""),
        f"add the distribution that provides {top} to the wheel's dependencies and to "
        "runtime-requirements.txt (then `kiln lock`); or, for an optional part, skip the "
        f"module: build.import_proof.skip in vendors/{f.vendor}.toml",
    )


def _raising_module(frame: str | None) -> str | None:
    """The module whose code raised, from the innermost frame inside the output
    (``landing/__init__.py:3`` -> ``landing``, ``landing/ops.py:9`` -> ``landing.ops``)."""
    if not frame or frame.startswith("/") or not frame.split(":")[0].endswith(".py"):
        return None
    parts = frame.split(":")[0].removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def load_python_error(f: LoadFailure) -> Cause | None:
    if not f.python_error:
        return None
    raising = _raising_module(f.frame)
    # importing pkg._C runs pkg/__init__.py first: where that raises, both fail, and
    # skipping one alone only moves the failure to the other
    modules = [f.module] + ([raising] if raising and raising != f.module else [])
    where = (
        f" (the code of {raising}, which importing {f.module} runs first)"
        if len(modules) > 1
        else ""
    )
    entries = ", ".join(f'"{m}" = "REASON"' for m in modules)
    return Cause(
        "raises-at-import",
        f"importing {f.module} raises {f.python_error}"
        + (f" at {f.frame}" if f.frame else "")
        + where,
        "fix the code that runs at import (a patch in patches/), or skip "
        + ("both modules" if len(modules) > 1 else "the module")
        + f" with the reason: import_proof.skip = {{ {entries} }} in [build] of "
        f"vendors/{f.vendor}.toml",
    )


LOAD_ROWS: tuple[Callable[[LoadFailure], Cause | None], ...] = (
    load_timeout,
    load_missing_library,
    load_abi_mismatch,
    load_left_off_link,
    load_never_compiled,
    load_needs_gpu,
    load_missing_module,
    load_python_error,
)


def explain_load(f: LoadFailure) -> Cause:
    """The first import row that knows this failure (always one: the last is general)."""
    for row in LOAD_ROWS:
        cause = row(f)
        if cause is not None:
            return cause
    return Cause(
        "import-failed",
        f"importing {f.module} failed: {f.message}",
        "see the import's output in the log",
    )
