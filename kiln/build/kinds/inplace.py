"""Builds in place (DeepInfer): a tree that ships as a tarball, not as a wheel.

Before the upstream's own build command runs, kiln puts a small kit into the tree's
``.kiln/`` folder: the object cache (``objcache.py`` with compiler wrappers in
``bin/``) and ``rebuild.py``, both stand-alone. The build's compiles go through the
object cache, so the tarball carries every object it made; ``rebuild_c`` on an
installed tree then recompiles only what a patch changed. After the build kiln
verifies the declared outputs (SASS archs), tries the import, and writes
``.kiln/tree.json`` (what was built, how to rebuild) and ``.kiln/applied/`` (the
patches as applied, so an edited patch can be swapped in later).
"""

from __future__ import annotations

import json
import logging
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from kiln.config.models import Profile, Vendor
from kiln.errors import VerifyError
from kiln.inside.kit.objcache import wrapper_env
from kiln.release import archive
from kiln.sources.patches import AppliedPatch
from kiln.toolchain.checks import Toolchain
from kiln.verify.binaries import SharedObject, check_archs, check_linkage, device_archs, linkage

log = logging.getLogger("kiln.inplace")

KIT = ".kiln"
TREE_FILE = "tree.json"
# Build leftovers that never go into the tarball (the kit's object cache does).
DEFAULT_EXCLUDE = (
    "build",
    "dist",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    ".ninja_log",
    ".ninja_deps",
    "tmpxft_*",
    ".kiln/host",  # links into this machine's CUDA and site-packages (pipcuda, cudashim)
)
# The kit: stand-alone (stdlib only) modules that import each other by plain name there.
KIT_FILES = ("objcache.py", "compilegate.py", "cudashim.py", "pipcuda.py", "rebuild.py")
WRAPPERS = {"gcc": "KILN_REAL_CC", "g++": "KILN_REAL_CXX", "nvcc": "KILN_REAL_NVCC"}
WRAPPER_DEFAULTS = {"gcc": "gcc", "g++": "g++", "nvcc": "nvcc"}


def install_kit(tree: Path) -> Path:
    """Put the compiler wrappers, the object cache and rebuild.py into ``tree/.kiln``
    (git-ignored there, so upstreams that look at ``git status`` see no change)."""
    kit = tree / KIT
    git_info = tree / ".git" / "info"
    if git_info.is_dir():
        exclude = git_info / "exclude"
        text = exclude.read_text(errors="replace") if exclude.exists() else ""
        if f"/{KIT}/" not in text:
            exclude.write_text(text + f"/{KIT}/\n")
    (kit / "bin").mkdir(parents=True, exist_ok=True)
    shipped = resources.files("kiln.inside.kit")
    for name in KIT_FILES:
        (kit / name).write_text(shipped.joinpath(name).read_text())
    for name, var in WRAPPERS.items():
        wrapper = kit / "bin" / name
        wrapper.write_text(
            "#!/bin/sh\n# kiln: compile through the object cache (see ../objcache.py)\n"
            f'exec "${{KILN_OBJCACHE_PYTHON:-python3}}" "$(dirname "$0")/../objcache.py" '
            f'"${{{var}:-{WRAPPER_DEFAULTS[name]}}}" "$@"\n'
        )
        wrapper.chmod(0o755)
    return kit


def kit_environment(tree: Path, tc: Toolchain, base: dict[str, str]) -> dict[str, str]:
    """Compiler wrappers and object-cache settings for a build in ``tree``, the build
    Python first on PATH (a clean Python environment)."""
    return wrapper_env(tree, tc.python, tc.site_packages, tc.cuda_home, base)


def find_outputs(tree: Path, patterns: list[str], what: str) -> list[Path]:
    found = sorted({p for pattern in patterns for p in tree.glob(pattern) if p.is_file()})
    if not found:
        raise VerifyError(
            f"{what}: the build left none of {', '.join(patterns)} in the tree; "
            f"check build.outputs or the build log"
        )
    return found


def verify_outputs(tree: Path, vendor: Vendor) -> list[SharedObject]:
    objects = []
    for path in find_outputs(tree, vendor.build.outputs, vendor.name):
        sass, ptx = device_archs(path)
        needed, runpath = linkage(path)
        objects.append(SharedObject(str(path.relative_to(tree)), sass, ptx, needed, runpath))
    check_archs(vendor.name, objects, list(vendor.build.archs))
    check_linkage(vendor.name, objects)
    return objects


def judge_import(module: str, returncode: int, output: str) -> dict[str, Any]:
    """An import that worked is "ok"; a missing driver (libcuda) means "skipped" here;
    any other failure is an error: a module that cannot load is not a build."""
    if returncode == 0:
        return {"module": module, "status": "ok"}
    last = (output.strip().splitlines() or ["no output"])[-1]
    if "libcuda.so" in output or "no CUDA-capable device" in output:
        return {"module": module, "status": "skipped", "reason": last}
    raise VerifyError(f"import {module} from the built tree failed: {last}")


def write_tree_metadata(
    tree: Path,
    vendor: Vendor,
    commit: str,
    applied: list[AppliedPatch],
    patches_dir: Path,
    recorded_env: dict[str, str],
) -> None:
    kit = tree / KIT
    applied_dir = kit / "applied"
    if applied_dir.exists():
        shutil.rmtree(applied_dir)
    applied_dir.mkdir(parents=True)
    for p in applied:
        shutil.copy2(patches_dir / p.file, applied_dir / p.file)
    machine = {"CUDA_HOME", "PATH", "SOURCE_DATE_EPOCH"}
    meta = {
        "vendor": vendor.name,
        "commit": commit,
        "command": vendor.build.command,
        "rebuild_command": vendor.build.rebuild_command or vendor.build.command,
        "outputs": vendor.build.outputs,
        "archs": list(vendor.build.archs),
        "env": {k: v for k, v in sorted(recorded_env.items()) if k not in machine},
        "patches": [{"file": p.file, "sha256": p.sha256} for p in applied],
    }
    (kit / TREE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def arch_family(archs: list[str]) -> str:
    """``['sm_100a', 'sm_103a']`` -> ``sm100`` (the family name the model card uses)."""
    majors = sorted({a[3:].rstrip("af")[:-1] for a in archs}, key=int)
    return "-".join(f"sm{m}0" for m in majors) or "host"


def tarball_name(vendor: Vendor, commit: str, tag: str, profile: Profile) -> str:
    return (
        f"{vendor.name}-{commit[:7]}-{tag}-{arch_family(list(vendor.build.archs))}-"
        f"{profile.cuda_tag}-{profile.python_tag}.tar.zst"
    )


def pack_tree(tree: Path, dest: Path, vendor: Vendor, mtime: int) -> Path:
    exclude = [*DEFAULT_EXCLUDE, *vendor.build.exclude]
    return archive.pack([(tree, vendor.name)], dest, mtime, exclude)
