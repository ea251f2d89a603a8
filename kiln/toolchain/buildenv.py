"""The Python a build runs in: one that holds exactly the profile's torch.

Inside the builder image that is the image's own Python (pass ``--python``).
Elsewhere kiln provisions a venv per (Python, torch, build tools) under its cache,
once, and reuses it (uv fills it, from the uv cache the consumer environments share:
torch is on disk once, :mod:`kiln.toolchain.uvtool`); a half-made venv (no completion
marker) is made again. Builds that share the cache make it under its lock
(``fsutil.made_once``): one makes it, the others wait and reuse it. A venv cannot be
renamed into place (its scripts and ``pyvenv.cfg`` name its own path), so it is made
where it stays and trusted only once its marker, written last, is there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from packaging.version import Version

from kiln import fsutil
from kiln.config.models import Profile
from kiln.errors import ToolchainError
from kiln.inside import proc
from kiln.inside.kit import contract
from kiln.toolchain import provision as prov
from kiln.toolchain import uvtool

log = logging.getLogger(__name__)

ENV_VAR = contract.BUILD_PYTHON
MARKER = ".kiln-complete"
# Every file of a venv kiln provisions gets this mtime (1980-01-01, zip's epoch). GCC's
# `#pragma once` takes two headers of equal content, size and mtime (in seconds) for one
# file: torch ships c10/util/python_stub.h and torch/csrc/utils/python_stub.h, and whether
# pip wrote them within one second decided whether the second was included, so the
# object's debug info depended on the moment of install. Part of the venvs' identity
# (LAYOUT), so venvs made before are made again.
PINNED_MTIME = 315532800
LAYOUT = 2


def _spec(profile: Profile) -> dict[str, object]:
    return {
        "python": profile.python,
        "torch": profile.torch,
        "index": profile.torch_index,
        "tools": list(profile.build_tools),
        "installer": uvtool.installer(uvtool.binary()),
        "layout": LAYOUT,
    }


def env_dir(profile: Profile, cache: Path) -> Path:
    digest = hashlib.sha256(json.dumps(_spec(profile), sort_keys=True).encode()).hexdigest()[:12]
    return cache / "envs" / f"py{profile.python}-torch{profile.torch}-{digest}"


def chosen_python(explicit: str | None) -> str | None:
    """``--python``, else ``$KILN_BUILD_PYTHON``: a Python kiln does not provision."""
    return explicit or os.environ.get(ENV_VAR) or None


def build_python(profile: Profile, cache: Path, explicit: str | None, log_dir: Path) -> Path:
    """``--python``, else ``$KILN_BUILD_PYTHON``, else a provisioned venv."""
    chosen = chosen_python(explicit)
    if chosen:
        path = Path(chosen)
        if not (path.exists() or shutil.which(chosen)):
            raise ToolchainError(f"build Python {chosen} not found: fix --python/${ENV_VAR}")
        # Absolute (not resolved: a venv's python is a link that must stay one): steps run
        # elsewhere.
        return path.absolute() if path.exists() else Path(shutil.which(chosen) or chosen)
    return provision(profile, cache, log_dir)


def make_venv(
    base: Path, venv: Path, pip_args: list[str], log_file: Path, what: str, uv: str | None = None
) -> Path:
    """A venv at ``venv`` from ``base``, with ``pip install pip_args`` run in it: by
    ``uv`` where given (linked from the uv cache beside ``venv``, with this machine's
    pip settings: :mod:`kiln.toolchain.uvtool`), else by the venv's pip."""
    proc.run(
        [base, "-m", "venv", venv],
        error=ToolchainError,
        log_file=log_file,
        what=f"creating the venv for {what}",
    )
    python = venv / "bin" / "python"
    if uv:
        install = uvtool.install_command(
            uv, python, uvtool.cache_of(venv.parent), uvtool.host_settings(), pip_args
        )
    else:
        install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        install += pip_args
    proc.run(install, error=ToolchainError, log_file=log_file, what=f"installing {what}")
    fsutil.set_mtimes(venv, PINNED_MTIME)
    return python


def _what(profile: Profile) -> str:
    packages = [f"torch {profile.torch}"] if profile.torch else []
    packages += profile.build_tools
    return f"the build venv (Python {profile.python}: {', '.join(packages) or 'no packages'})"


def planned(profile: Profile, cache: Path, explicit: str | None) -> prov.Provision | None:
    """The build venv a build provisions first, made or not (None: ``--python``)."""
    venv = env_dir(profile, cache)
    if chosen_python(explicit):
        return None
    if (venv / MARKER).exists():
        return prov.Provision(_what(profile), str(venv), "", made=True)
    try:
        _base_python(profile)
        error = None
    except ToolchainError as exc:
        error = exc
    return prov.Provision(_what(profile), str(venv), _size(profile, cache), error=error)


def _size(profile: Profile, cache: Path) -> str:
    """About how large the venv will be: as another made venv of the same torch in the
    cache (other build tools), else kiln's documented figure (toolchain/provision.py)."""
    for other in sorted((cache / "envs").glob(f"py*-torch{profile.torch}-*")):
        if (other / MARKER).exists():
            measured = prov.tree_bytes(other) / prov.GIB
            return prov.about(measured, f"as {other.name}, the same torch, in this cache")
    if not profile.torch:
        return prov.about(prov.VENV_NO_TORCH_GIB, "no torch: the build tools alone")
    if Version(profile.torch).local == "cpu":
        return prov.about(prov.VENV_TORCH_CPU_GIB, "kiln's figure for a CPU-only torch")
    return prov.about(prov.VENV_TORCH_CUDA_GIB, "kiln's figure for torch with its CUDA wheels")


def provision(profile: Profile, cache: Path, log_dir: Path) -> Path:
    venv = env_dir(profile, cache)
    python = venv / "bin" / "python"
    if (venv / MARKER).exists():
        return python
    base = _base_python(profile)
    fsutil.made_once(
        venv,
        lambda: (venv / MARKER).exists(),
        lambda: _make(profile, base, venv, log_dir),
        f"the build venv (torch {profile.torch})",
    )
    return python


def _base_python(profile: Profile) -> Path:
    """The Python the venv is made from: the profile's, on PATH."""
    base = shutil.which(f"python{profile.python}")
    if base is None:
        raise ToolchainError(
            f"python{profile.python} not found on PATH: install Python {profile.python} or pass "
            f"--python with an interpreter that has torch {profile.torch}"
        )
    return Path(base)


def _make(profile: Profile, base: Path, venv: Path, log_dir: Path) -> None:
    """The venv at ``venv``, made in place (its lock held), its marker written last;
    a half-made one (a killed run's: no marker) is removed first."""
    if venv.exists():
        shutil.rmtree(venv)
    log.info("provisioning a build venv (torch %s) at %s (once)", profile.torch, venv)
    log_file = log_dir / "provision-build-env.log"
    index = ["--extra-index-url", profile.torch_index] if profile.torch_index else []
    # Pin the public version: PyPI's CUDA wheels are filed as plain 2.14.1 although
    # torch.__version__ says 2.14.1+cu130, while the PyTorch index files 2.13.0+cu132.
    # `==2.13.0` matches both forms (PEP 440 ignores the local label), pip prefers the
    # labelled build, and preflight then checks torch.__version__ against the profile.
    torch = [f"torch=={Version(profile.torch).public}"] if profile.torch else []
    make_venv(
        base,
        venv,
        [*index, *torch, *profile.build_tools],
        log_file,
        f"{' '.join(torch + profile.build_tools)} into the build venv",
        uvtool.binary(),
    )
    (venv / MARKER).write_text(json.dumps(_spec(profile), sort_keys=True))
