"""The kit kiln puts into every work tree before its build runs: ``.kiln/`` with the
compiler wrapper (``objcache.py`` and wrappers in ``bin/``: deterministic flags, the
object cache, ccache, the run's compile gate) and the stand-alone tools a shipped tree
needs again (``rebuild.py`` and what it imports). Every build kind compiles through it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from kiln.inside.kit.objcache import wrapper_env
from kiln.toolchain.checks import Toolchain

KIT = ".kiln"
# The kit: stand-alone (stdlib only) modules that import each other by plain name there.
KIT_FILES = (
    "objcache.py",
    "compilegate.py",
    "cudashim.py",
    "pipcuda.py",
    "patchapply.py",
    "rebuild.py",
)
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
