"""The row of a build that stopped before compiling: setup.py imports a module the
build venv lacks."""

from __future__ import annotations

import re
from pathlib import Path

from kiln.inside.causes.cause import Cause, Failure

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
