#!/usr/bin/env python3
"""A CUDA home that gives cudafe++ a fixed module ID (stdlib only).

cudafe++ names a translation unit's internal entities after a module ID
(``_GLOBAL__N__<id>``, ``__fatbinwrap_<id>``, CCCL's anonymous-namespace objects in
device code). nvcc asks it to make one (``--gen_module_id_file``); for a file that
defines no non-template external routine cudafe++ ends that ID with its own process id,
so such a file differs on every compile, even in the same folder (a 3-line file that
instantiates a template and uses ``cuda::std::ignore`` is enough). nvcc has no option
for it, but cudafe++ reads the ID from ``--module_id_file_name F`` when it is not told
to generate one.

So kiln's compiler wrapper runs nvcc from a CUDA home of its own: ``bin/nvcc`` is a link
to the real one (nvcc finds its tools beside the path it was started as), ``bin/cudafe++``
is this script, everything else links to the real home; ``bin/nvcc.profile`` is the real
one with its ``TOP`` spelled as the real home's, so every include and library path nvcc
passes on (``-L`` lands in the device link's recorded command line) reads as without the
shim, wherever the shim lies. This script writes the ID the
wrapper chose (``KILN_MODULE_ID``: from the source's path in the tree and the compile's
normalized command) into ``F``, drops ``--gen_module_id_file`` and runs the real cudafe++
(``KILN_REAL_CUDAFE``). Without ``KILN_MODULE_ID`` it changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile

try:
    from kiln.inside.kit import contract
except ImportError:  # run from a tree's .kiln/: the kit's copies beside it
    import contract  # type: ignore[no-redef]

SHIM_VERSION = "1"  # part of every module ID: a change to this scheme changes the IDs


def module_id(rel_source: str, seed: str) -> str:
    """``_<hash of path>_<len>_<name>_<hash of compile>_0``, cudafe++'s own shape."""
    name = re.sub(r"[^A-Za-z0-9]", "_", os.path.basename(rel_source)) or "tu"
    h_path = hashlib.sha256(rel_source.encode()).hexdigest()[:8]
    h_seed = hashlib.sha256(f"{SHIM_VERSION}\0{seed}".encode()).hexdigest()[:8]
    return f"_{h_path}_{len(name)}_{name}_{h_seed}_0"


def _write_file(path: str, text: str, mode: int) -> None:
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def ensure_home(real_home: str, dest: str, python: str) -> str:
    """The shim CUDA home for ``real_home`` (spelled as the build spells it) at ``dest``
    (made once, atomically; remade when it points at another home). Returns ``dest``."""
    real_home = os.path.abspath(real_home)
    stamp = f"{SHIM_VERSION}\n{real_home}\n{python}\n"
    marker = os.path.join(dest, ".kiln-shim")
    try:
        with open(marker) as fh:
            if fh.read() == stamp:
                return dest
    except OSError:
        pass
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".cuda-", dir=parent)
    os.chmod(tmp, 0o755)
    try:
        for entry in sorted(os.listdir(real_home)):
            if entry != "bin":
                os.symlink(os.path.join(real_home, entry), os.path.join(tmp, entry))
        os.mkdir(os.path.join(tmp, "bin"))
        real_bin = os.path.join(real_home, "bin")
        for entry in sorted(os.listdir(real_bin)):
            if entry not in ("cudafe++", "nvcc.profile"):
                os.symlink(os.path.join(real_bin, entry), os.path.join(tmp, "bin", entry))
        with open(os.path.join(real_bin, "nvcc.profile")) as fh:
            profile = fh.read()
        # TOP as nvcc would have read it from the real bin/ ($(_HERE_) stays in PATH, so
        # that this bin/, with its cudafe++, is searched first).
        _write_file(
            os.path.join(tmp, "bin", "nvcc.profile"),
            profile.replace("$(_HERE_)/..", f"{real_bin}/.."),
            0o644,
        )
        here = os.path.abspath(__file__)
        _write_file(
            os.path.join(tmp, "bin", "cudafe++"),
            "#!/bin/sh\n# kiln: cudafe++ with a fixed module ID (see cudashim.py)\n"
            f'{contract.REAL_CUDAFE}="{os.path.join(real_bin, "cudafe++")}" '
            f'exec "{python}" "{here}" "$@"\n',
            0o755,
        )
        _write_file(os.path.join(tmp, ".kiln-shim"), stamp, 0o644)
        aside = None
        if os.path.lexists(dest):
            aside = tempfile.mkdtemp(prefix=".cuda-old-", dir=parent)
            os.rename(dest, os.path.join(aside, "home"))
        try:
            os.rename(tmp, dest)
        except OSError:
            if not os.path.isfile(marker):  # another compile made it first: fine
                raise
        if aside:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def cudafe_args(args: list[str], ident: str | None) -> tuple[list[str], str | None]:
    """(the arguments for the real cudafe++, the module-ID file to write first)."""
    if not ident or "--gen_module_id_file" not in args:
        return args, None
    out, target = [], None
    it = iter(args)
    for a in it:
        if a == "--gen_module_id_file":
            continue
        if a == "--module_id_file_name":
            target = next(it, None)
            out += [a, target or ""]
            continue
        out.append(a)
    return (out, target) if target else (args, None)


def main(argv: list[str]) -> int:
    real = os.environ.get(contract.REAL_CUDAFE)
    if not real:
        sys.stderr.write("cudashim: KILN_REAL_CUDAFE is not set\n")
        return 2
    args, target = cudafe_args(argv[1:], os.environ.get(contract.MODULE_ID))
    if target:
        with open(target, "w") as fh:
            fh.write(os.environ[contract.MODULE_ID])
    os.execv(real, [real, *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
