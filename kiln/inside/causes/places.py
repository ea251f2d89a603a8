"""Where things are, for the rows: the packages that ship a header or a library
(Debian/Ubuntu's and NVIDIA's pip wheels), the folders a failed command searched, the
owner and version of what it found, the nvcc of the step."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.inside import proc
from kiln.inside.causes.cause import Failure

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


def packages_for(
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
    return packages_for(header, HEADER_PACKAGES)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


# --------------------------------------------------------------------------- where things are


def site_packages() -> list[Path]:
    """The build Python's site-packages (the step runs under the build's Python)."""
    paths = sysconfig.get_paths()
    return [Path(p) for p in dict.fromkeys((paths["purelib"], paths["platlib"]))]


def argv_of(command: str | None) -> list[str]:
    """A unit's command line (as ninja printed it) as its arguments."""
    if not command:
        return []
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def flag_values(command: str | None, flags: tuple[str, ...]) -> list[str]:
    argv = argv_of(command)
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
    dirs = flag_values(f.d.command, ("-I", "-isystem"))
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
    dirs = flag_values(f.d.command, ("-L",))
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


def system_entry(vendor: str, key: str, value: str, package: str) -> str:
    return (
        f"declare it in vendors/{vendor}.toml so preflight checks it before the next build:"
        + toml_block("[[build.system]]", **{key: value, "package": package})
    )
