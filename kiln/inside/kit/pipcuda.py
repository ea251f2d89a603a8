"""What a build host without a full CUDA install needs from torch's pip CUDA (stdlib only).

torch's CUDA builds depend on NVIDIA's pip wheels (``nvidia/cu13``, ``nvidia/nccl``,
``nvidia/nvshmem``, ...). Their headers (cuSPARSE, cuBLAS, NVRTC, NCCL) are what a torch
extension includes, but no compiler looks in site-packages; their libraries ship only
the versioned file (``libnvrtc.so.13``), so an upstream's ``-lnvrtc`` finds nothing; and
a host without a GPU driver has no ``libcuda.so`` for ``-lcuda``. Each upstream's
``setup.py`` leaves that to its users. kiln does it once, for every build:

- the CUDA home's CCCL folder (CUDA 13 moved ``cuda/std``, CUB and Thrust there) and
  every ``nvidia/*/include`` go on ``CPLUS_INCLUDE_PATH`` (``C_INCLUDE_PATH`` without
  CCCL), after the compiler's own ``-I`` paths, so the toolkit's headers still win;
- a folder kiln owns (``.kiln/host/links`` in the tree) gets the unversioned link names
  the wheels lack, pointing at the versioned files, and goes on ``LIBRARY_PATH`` with
  every ``nvidia/*/lib``; the same folders go on ``CMAKE_LIBRARY_PATH`` and
  ``CMAKE_INCLUDE_PATH``, which CMake's ``find_library``/``find_path`` read (not
  ``LIBRARY_PATH``): FindCUDAToolkit then makes ``CUDA::cublas`` and its kin from the pip
  CUDA (without them a project linking ``CUDA::cublas`` stopped at configure: "the
  target was not found");
- where the linker finds no ``libcuda.so``, the toolkit's ``lib64/stubs`` if it has one,
  else a stub with ``SONAME libcuda.so.1`` in that folder, as the toolkit's is: every
  driver function ``cuda.h`` declares, as an empty function (so that a link with
  ``--as-needed``, gcc's default on Debian and Ubuntu, records the driver exactly when
  the code calls it). A link input only: the result records ``NEEDED libcuda.so.1``
  (the driver's name), never the stub's path.

Used by the build step (``python -m kiln.inside step``), by its ``probe`` (what preflight
and the manifest see) and by the shipped ``rebuild.py``, which must prepare an installed
tree the same way on the machine it runs on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from typing import Literal, TypedDict

HOST_DIR = os.path.join(".kiln", "host")  # machine-specific, never packed
LINKS_DIR = os.path.join(HOST_DIR, "links")
STUB_SONAME = "libcuda.so.1"
_VERSIONED = re.compile(r"^(lib[A-Za-z0-9_+.-]*?)\.so\.[0-9][0-9.]*$")
_DRIVER_FN = re.compile(r"\bCUresult\s+(cu[A-Za-z0-9_]+)\s*\(")


def _dirs(root: str, sub: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    found = [os.path.join(root, p, sub) for p in sorted(os.listdir(root))]
    return [d for d in found if os.path.isdir(d)]


def link_names(lib_dirs: list[str]) -> dict[str, str]:
    """Unversioned name -> the versioned file it stands for, where a folder ships only
    the versioned one (the first folder and the shortest name win)."""
    names: dict[str, str] = {}
    for d in lib_dirs:
        files = sorted(os.listdir(d), key=lambda f: (len(f), f))
        for f in files:
            m = _VERSIONED.match(f)
            if not m:
                continue
            plain = m.group(1) + ".so"
            if plain in names or os.path.exists(os.path.join(d, plain)):
                continue
            names[plain] = os.path.join(d, f)
    return names


def _linker_finds(name: str, cc: str, extra_dirs: list[str]) -> bool:
    if any(os.path.exists(os.path.join(d, name)) for d in extra_dirs):
        return True
    try:
        res = subprocess.run(
            [cc, f"-print-file-name={name}"], capture_output=True, text=True, check=False
        )
    except OSError:
        return False
    found = res.stdout.strip()
    return os.path.isabs(found) and os.path.exists(found)


class PipCuda(TypedDict):
    """What a machine's pip CUDA offers (:func:`discover`; the probe prints it as JSON)."""

    cuda_h: str | None
    cccl: str | None
    include_dirs: list[str]
    lib_dirs: list[str]
    links: dict[str, str]  # a missing link name -> the versioned library it names
    cuda_link: Literal["found", "toolkit-stubs", "kiln-stub"]  # how -lcuda is met
    stubs_dir: str


def discover(site: str, cuda_home: str, cc: str = "gcc") -> PipCuda:
    """What this machine offers (plain data: the probe prints it as JSON)."""
    nvidia = os.path.join(site, "nvidia")
    include_dirs = _dirs(nvidia, "include")
    lib_dirs = _dirs(nvidia, "lib")
    cccl = os.path.join(cuda_home, "include", "cccl")
    stubs = os.path.join(cuda_home, "lib64", "stubs")
    found_cuda = _linker_finds("libcuda.so", cc, [os.path.join(cuda_home, "lib64")])
    headers = [
        os.path.join(d, "cuda.h") for d in [os.path.join(cuda_home, "include"), *include_dirs]
    ]
    return {
        "cuda_h": next((h for h in headers if os.path.isfile(h)), None),
        "cccl": cccl if os.path.isdir(cccl) else None,
        "include_dirs": include_dirs,
        "lib_dirs": lib_dirs,
        "links": link_names(lib_dirs),
        "cuda_link": (
            "found"
            if found_cuda
            else "toolkit-stubs"
            if os.path.exists(os.path.join(stubs, "libcuda.so"))
            else "kiln-stub"
        ),
        "stubs_dir": stubs,
    }


def environment(found: PipCuda, links_dir: str, base: dict[str, str]) -> dict[str, str]:
    """The variables to set: kiln's folders after whatever ``base`` (the recipe, the
    user) already has, so an explicit setting still wins."""

    def join(var: str, dirs: list[str]) -> str:
        have = [p for p in base.get(var, "").split(os.pathsep) if p]
        return os.pathsep.join([*have, *(d for d in dirs if d not in have)])

    cccl = found.get("cccl")
    cxx = ([cccl] if cccl else []) + list(found["include_dirs"])
    libs = [links_dir, *found["lib_dirs"]]
    if found["cuda_link"] == "toolkit-stubs":
        libs.append(str(found["stubs_dir"]))
    out = {"LIBRARY_PATH": join("LIBRARY_PATH", libs)}
    out["CMAKE_LIBRARY_PATH"] = join("CMAKE_LIBRARY_PATH", libs)
    if cxx:
        out["CPLUS_INCLUDE_PATH"] = join("CPLUS_INCLUDE_PATH", cxx)
    if found["include_dirs"]:
        out["C_INCLUDE_PATH"] = join("C_INCLUDE_PATH", list(found["include_dirs"]))
        out["CMAKE_INCLUDE_PATH"] = join("CMAKE_INCLUDE_PATH", list(found["include_dirs"]))
    return out


def materialize(found: PipCuda, links_dir: str, cc: str = "gcc") -> None:
    """Make the links folder: the link names, and the libcuda stub where needed.
    Made beside and renamed into place, so a half-made folder is never used."""
    parent = os.path.dirname(os.path.abspath(links_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".links-", dir=parent)
    try:
        for plain, target in sorted(found["links"].items()):
            if not os.path.exists(target):
                raise FileNotFoundError(f"{target}: gone since it was listed (link {plain})")
            os.symlink(target, os.path.join(tmp, plain))
        if found["cuda_link"] == "kiln-stub":
            source = os.path.join(tmp, "stub.c")
            with open(source, "w") as fh:
                fh.write(stub_source(found.get("cuda_h"), cc))
            stub = os.path.join(tmp, "libcuda.so")
            subprocess.run(
                [cc, "-shared", "-nostdlib", f"-Wl,-soname,{STUB_SONAME}", "-o", stub, source],
                check=True,
                capture_output=True,
                text=True,
            )
            os.unlink(source)
        if os.path.lexists(links_dir):
            shutil.rmtree(links_dir)
        os.rename(tmp, links_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def stub_source(cuda_h: str | None, cc: str = "gcc") -> str:
    """C source of the libcuda stub: a function per driver function of ``cuda.h`` (after
    its macros, so ``cuMemAlloc`` is ``cuMemAlloc_v2`` as in the driver), each returning
    ``CUDA_ERROR_STUB_LIBRARY`` (34) as the toolkit's stub does: linked against, it only
    names the driver; loaded where no driver is (the import proof), a call says so."""
    names: list[str] = []
    if cuda_h:
        res = subprocess.run(
            [cc, "-E", "-P", "-x", "c", "-I", os.path.dirname(cuda_h), cuda_h],
            capture_output=True,
            text=True,
            check=False,
        )
        names = sorted(set(_DRIVER_FN.findall(res.stdout))) if res.returncode == 0 else []
    body = "".join(f"int {n}(void) {{ return 34; }}\n" for n in names)
    return f"/* kiln: link-time stand-in for the driver's {STUB_SONAME} */\n{body}"


def record(found: PipCuda, site: str, cuda_home: str) -> dict[str, object]:
    """What kiln added, with the machine's paths as ``${SITE_PACKAGES}``, ``${CUDA_HOME}``
    and ``${KILN_LINKS}`` (the manifest and build-<release>.sh show this)."""

    def logical(path: str) -> str:
        for root, name in ((site, "${SITE_PACKAGES}"), (cuda_home, "${CUDA_HOME}")):
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return name + path[len(root.rstrip("/")) :]
        return path

    env = environment(found, "${KILN_LINKS}", {})
    return {
        "rpaths": "-Wl,-rpath into ${SITE_PACKAGES} made $ORIGIN-relative to where the "
        "extension is installed (kiln's compiler wrapper)",
        "env": {
            k: os.pathsep.join(logical(p) for p in v.split(os.pathsep)) for k, v in env.items()
        },
        "links": {k: logical(v) for k, v in sorted(found["links"].items())},
        "libcuda": {
            "found": "found by the linker",
            "toolkit-stubs": "${CUDA_HOME}/lib64/stubs/libcuda.so",
            "kiln-stub": f"a stub of cuda.h's functions in ${{KILN_LINKS}} (SONAME "
            f"{STUB_SONAME}), link-time only",
        }[str(found["cuda_link"])],
    }


def prepare(
    tree: str, site: str, cuda_home: str, base: dict[str, str], cc: str = "gcc"
) -> dict[str, str]:
    """Discover, make the links folder in ``tree`` and return the variables to set."""
    found = discover(site, cuda_home, cc)
    links = os.path.join(tree, LINKS_DIR)
    materialize(found, links, cc)
    return environment(found, links, base)


if __name__ == "__main__":  # python pipcuda.py SITE CUDA_HOME: what this machine offers
    import sys

    print(json.dumps(discover(sys.argv[1], sys.argv[2]), indent=1, sort_keys=True))
