"""The profile's CUDA from NVIDIA's PyPI wheels, pinned by sha256 (``--toolchain pypi``).

A host without the builder image (a laptop, a bare CI runner) still compiles with
exactly the profile's nvcc: kiln installs the wheels of ``toolchains/cuda-<X.Y>.txt``
with ``pip --require-hashes --no-deps`` into a venv of its own under the cache (never
into the torch venv: they would replace torch's pinned CUDA runtime), then lays out a
classic ``CUDA_HOME`` beside it (``bin``, ``include``, ``nvvm``, ``lib64`` with the
unversioned ``libcudart.so`` link names the wheels lack), which torch's extension
build accepts (shared/toolchain-notes.md). Builds sharing the cache make it under its
lock, once (``fsutil.made_once``); its marker, written last, says it is whole.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import sys
from importlib import resources
from pathlib import Path

from kiln import fsutil
from kiln.errors import ToolchainError
from kiln.inside import proc
from kiln.toolchain import provision as prov
from kiln.toolchain.buildenv import LAYOUT, make_venv

log = logging.getLogger(__name__)
MARKER = ".kiln-complete"


def lock_text(cuda: str) -> str:
    name = f"toolchains/cuda-{cuda}.txt"
    res = resources.files("kiln").joinpath(name)
    if not res.is_file():
        raise ToolchainError(
            f"no CUDA {cuda} lock in kiln ({name}): --toolchain pypi offers "
            f"only the CUDA versions kiln keeps a hash-pinned lock for"
        )
    return res.read_text()


def components(cuda: str) -> list[dict[str, str]]:
    """Each pinned wheel: name, version, sha256 (recorded in the manifest)."""
    out = []
    for line in lock_text(cuda).splitlines():
        m = re.match(r"^([\w.-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", line)
        if m:
            out.append({"name": m.group(1), "version": m.group(2), "sha256": m.group(3)})
    return out


def nvcc_version(cuda: str) -> str:
    """The nvcc version the lock pins (``nvidia-cuda-nvcc``), read without installing."""
    for c in components(cuda):
        if c["name"] == "nvidia-cuda-nvcc":
            return c["version"]
    raise ToolchainError(f"kiln's CUDA {cuda} lock pins no nvidia-cuda-nvcc")


def _layout(prefix: Path, home: Path) -> None:
    if home.exists():
        shutil.rmtree(home)
    (home / "lib64").mkdir(parents=True)
    for name in ("bin", "include", "nvvm"):
        (home / name).symlink_to(prefix / name)
    for lib in sorted((prefix / "lib").iterdir()):
        (home / "lib64" / lib.name).symlink_to(lib)
    for versioned in sorted((home / "lib64").glob("*.so.*")):
        plain = home / "lib64" / (versioned.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(versioned.name)
    (home / "lib").symlink_to("lib64")


def root_dir(cuda: str, cache: Path) -> Path:
    """Where the pinned toolkit of ``cuda`` lives in the cache (one folder per lock)."""
    text = lock_text(cuda)
    digest = hashlib.sha256(f"{text}\nlayout {LAYOUT}".encode()).hexdigest()[:12]
    return cache.resolve() / "toolchains" / f"cuda-{cuda}-{digest}"


def planned(cuda: str, cache: Path) -> prov.Provision:
    """The pip CUDA a build provisions first, made or not."""
    root = root_dir(cuda, cache)
    what = f"CUDA {cuda} from PyPI ({len(components(cuda))} hash-pinned wheels)"
    if (root / MARKER).exists():
        return prov.Provision(what, str(root), "", made=True)
    others = [p for p in sorted(root.parent.glob("cuda-*")) if (p / MARKER).exists()]
    if others:
        size = prov.about(prov.tree_bytes(others[0]) / prov.GIB, f"as {others[0].name} here")
    else:
        size = prov.about(prov.PYPI_CUDA_GIB, "kiln's figure for a CUDA 13 toolkit from PyPI")
    return prov.Provision(what, str(root), size)


def provision(cuda: str, cache: Path, log_dir: Path) -> Path:
    """The CUDA home of the pinned toolkit, installed once per lock."""
    root = root_dir(cuda, cache)
    fsutil.made_once(
        root,
        lambda: (root / MARKER).exists(),
        lambda: _make(cuda, root, log_dir),
        f"the CUDA {cuda} toolkit from PyPI",
    )
    return root / "cuda"


def _make(cuda: str, root: Path, log_dir: Path) -> None:
    """The toolkit at ``root`` (its lock held), its marker written last."""
    text = lock_text(cuda)
    home = root / "cuda"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    log.info("provisioning CUDA %s from PyPI (hash-pinned) at %s (once)", cuda, root)
    lock = root / "lock.txt"
    lock.write_text(text)
    log_file = log_dir / "provision-cuda.log"
    python = make_venv(
        Path(sys.executable),
        root / "venv",
        ["--require-hashes", "--no-deps", "-r", str(lock)],
        log_file,
        f"CUDA {cuda} from PyPI",
    )
    site = proc.output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    prefix = Path(site) / "nvidia" / f"cu{cuda.split('.')[0]}"
    if not (prefix / "bin" / "nvcc").exists():
        raise ToolchainError(f"the CUDA {cuda} wheels installed no nvcc under {prefix}")
    _layout(prefix, home)
    (root / MARKER).write_text(root.name.rsplit("-", 1)[-1])
