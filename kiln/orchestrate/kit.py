"""The kit kiln puts into every work tree before its build runs: ``.kiln/`` with the
compiler wrapper (``objcache.py`` and wrappers in ``bin/``: deterministic flags, the
object cache, ccache, the run's compile gate), ``order/ninja`` (first on the build's
PATH: the build file's units in critical-path order, ``ninjaorder.py``) and the
stand-alone tools a shipped tree needs again (``rebuild.py`` and what it imports).
Every build kind compiles through it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from kiln.inside.kit import contract
from kiln.inside.kit.objcache import wrapper_env
from kiln.toolchain.checks import Toolchain

KIT = ".kiln"
# The kit: stand-alone (stdlib only) modules that import each other by plain name there.
KIT_FILES = (
    "objcache.py",
    "compileflags.py",
    "archflags.py",
    "compilegate.py",
    "cudashim.py",
    "pipcuda.py",
    "patchapply.py",
    "rebuild.py",
    "ninjaorder.py",
    "unitsize.py",
    "treemem.py",
    "contract.py",
)
WRAPPERS = {"gcc": contract.REAL_CC, "g++": contract.REAL_CXX, "nvcc": contract.REAL_NVCC}
WRAPPER_DEFAULTS = {"gcc": "gcc", "g++": "g++", "nvcc": "nvcc"}
# nvcc calls its host compiler (this wrapper again) several times per CUDA unit, inside a
# compile the wrapper already runs (KILN_WRAPPED=1): those calls get the flags alone, from
# the small compileflags.py, not the object cache's imports (about 0.1 CPU-s a call).
# ``-S``: the kit is stdlib only; the build venv's .pth files cost each call more.
WRAPPER = """#!/bin/sh
# kiln: compile through the object cache (see ../objcache.py)
if [ "${{KILN_WRAPPED:-}}" = 1 ]; then m=compileflags.py; else m=objcache.py; fi
exec "${{KILN_OBJCACHE_PYTHON:-python3}}" -S "$(dirname "$0")/../$m" "${{{var}:-{default}}}" "$@"
"""
NINJA = """#!/bin/sh
# kiln: the build file's units longest first, then the real ninja (see ../ninjaorder.py)
exec "${KILN_OBJCACHE_PYTHON:-python3}" -S "$(dirname "$0")/../ninjaorder.py" "$@"
"""


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
    (kit / "path").mkdir(exist_ok=True)
    for name, var in WRAPPERS.items():
        wrapper = kit / "bin" / name
        wrapper.write_text(WRAPPER.format(var=var, default=WRAPPER_DEFAULTS[name]))
        wrapper.chmod(0o755)
    # first on the build's PATH: ``nvcc`` by name compiles through the wrapper too
    (kit / "path" / "nvcc").write_text(WRAPPER.format(var=contract.REAL_NVCC, default="nvcc"))
    (kit / "path" / "nvcc").chmod(0o755)
    (kit / "order").mkdir(exist_ok=True)
    (kit / "order" / "ninja").write_text(NINJA)
    (kit / "order" / "ninja").chmod(0o755)
    return kit


def kit_environment(tree: Path, tc: Toolchain, base: dict[str, str]) -> dict[str, str]:
    """Compiler wrappers and object-cache settings for a build in ``tree``, kiln's
    ``ninja`` then the build Python first on PATH (a clean Python environment)."""
    env = wrapper_env(tree, tc.python, tc.site_packages, tc.cuda_home, base)
    env["PATH"] = f"{tree / KIT / 'order'}:{env['PATH']}"
    return env
