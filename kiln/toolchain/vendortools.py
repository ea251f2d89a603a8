"""A vendor's own build tools (``build.build_tools`` in its TOML): what its setup.py
imports that the profile's build venv lacks, given to that vendor's build alone.

The profile's ``build_tools`` go into the build venv every vendor shares (a new venv, a
torch install, for one vendor's need); a vendor's go into its tree's ``.kiln/tools``,
put first on ``PYTHONPATH`` in its steps (on both runners: the tree is where the step
runs). pip installs them once into kiln's cache, keyed by the requirements and the
profile's Python and platform: wheels only, without dependencies (each tool is listed
and pinned, as in a lock), for the profile's Python and platform (the host's pip, so a
builder image needs none). With ``--offline`` pip reads no index: only what
``PIP_FIND_LINKS`` offers, unless the cache has them already."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kiln.config.models import Profile
from kiln.errors import KilnError, ToolchainError
from kiln.inside import proc

# In the tree, beside kiln's kit (kiln owns .kiln/).
TOOLS_DIR = ".kiln/tools"


def key(reqs: Sequence[str], profile: Profile) -> str:
    material = json.dumps([sorted(reqs), profile.python, profile.platform])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def pip_command(reqs: Sequence[str], profile: Profile, target: Path, offline: bool) -> list[str]:
    return [
        sys.executable,
        *("-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check"),
        *("--no-deps", "--only-binary=:all:", "--python-version", profile.python),
        *(arg for platform in profile.wheel_platforms for arg in ("--platform", platform)),
        *("--target", str(target)),
        *(["--no-index"] if offline else []),
        *reqs,
    ]


def _kept(reqs: Sequence[str], profile: Profile, cache: Path, offline: bool, log: Path) -> Path:
    """The tools' folder in kiln's cache, installed there first where it is not yet."""
    kept = cache / "vendor-tools" / key(reqs, profile)
    if kept.is_dir():
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{kept.name}-", dir=kept.parent) as tmp:
        target = Path(tmp) / "tools"
        listed = " ".join(reqs)
        try:
            proc.run(
                pip_command(reqs, profile, target, offline),
                log_file=log,
                what=f"pip install of build.build_tools {listed}",
                error=ToolchainError,
            )
        except KilnError as exc:
            said = str(exc).strip().splitlines()
            pip_said = next(
                (ln for ln in reversed(said) if "ERROR:" in ln), said[-1] if said else ""
            )
            where = " (--offline: only PIP_FIND_LINKS' wheels)" if offline else ""
            raise ToolchainError(
                f"build.build_tools {listed}: pip could not install them for Python "
                f"{profile.python}{where}: {pip_said.strip()}; pin versions that have wheels "
                f"(log: {log})"
            ) from None
        try:
            os.replace(target, kept)
        except OSError:
            if not kept.is_dir():  # not made meanwhile by another build sharing the cache
                raise
    return kept


def install(
    reqs: Sequence[str], profile: Profile, cache: Path, tree: Path, offline: bool, log: Path
) -> Path:
    """The vendor's tools in ``tree``'s :data:`TOOLS_DIR` (replacing what a build before
    left there); returns that folder."""
    kept = _kept(reqs, profile, cache, offline, log)
    dest = tree / TOOLS_DIR
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(kept, dest, symlinks=True)
    return dest
