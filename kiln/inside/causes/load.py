"""The rows of a built module that does not import where the release lands (the import
proof, kiln/orchestrate/importproof.py). The facts come from the host
(kiln/verify/loadfacts.py: nm, c++filt, the tree); the rows only read them."""

from __future__ import annotations

import re

from kiln.inside.causes.cause import Cause, LoadFailure, toml_edit
from kiln.inside.causes.places import LIBRARY_PACKAGES, toml_block


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
