"""The rows of a link that failed: a library the linker cannot find, a symbol no
linked library defines."""

from __future__ import annotations

import os
import re
from pathlib import Path

from kiln.inside import libraries
from kiln.inside.causes.cause import Cause, Failure
from kiln.inside.causes.places import (
    LIBRARY_PACKAGES,
    argv_of,
    flag_values,
    library_dirs,
    site_packages,
    system_entry,
)

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
        + system_entry(f.vendor, "library", lib, deb or "PACKAGE")
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
    argv = argv_of(command)
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"), None)


def undefined_symbol(f: Failure) -> Cause | None:
    syms = _matches(f, _UNDEFINED, "sym")
    if not syms:
        return None
    lib = next((lib for p, lib in SYMBOL_LIBRARIES if syms[0].startswith(p)), None)
    linked = [f"-l{x}" for x in flag_values(f.d.command, ("-l",))]
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
