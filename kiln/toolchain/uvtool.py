"""kiln's uv (a pinned dependency), for the venvs kiln fills with torch: the build venv
and the import proof's consumer environment. uv keeps each distribution unpacked once in
a cache beside the environments (``envs/.uv-cache``: one filesystem) and hard-links it
into every venv it fills, so torch's 5 GB are on disk once whatever the number of
environments, and a venv whose distributions are cached is filled in seconds (most of
them compiling its bytecode).
The files are the wheels' own (hash-checked where the requirements carry hashes)."""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

from kiln.inside import proc
from kiln.toolchain import pipconfig

CACHE = ".uv-cache"  # under the cache's envs/, beside the venvs it fills


def binary() -> str | None:
    """kiln's own uv (the pinned ``uv`` wheel's binary), or None where it is missing."""
    try:
        import uv as uv_package
    except ImportError:
        return None
    try:
        found = uv_package.find_uv_bin()
    except FileNotFoundError:
        return None
    return found if os.access(found, os.X_OK) else None


def installer(uv: str | None) -> str:
    """What fills a venv, for its identity: ``pip``, or ``uv==VERSION``."""
    if uv is None:
        return "pip"
    try:
        return f"uv=={metadata.version('uv')}"
    except metadata.PackageNotFoundError:
        return "uv"


def install_command(
    uv: str,
    python: Path,
    cache: Path,
    settings: pipconfig.UvSettings,
    args: list[str],
    bytecode: bool = True,
) -> list[str]:
    """``uv pip install ARGS`` into the venv of ``python``, linking from the uv cache
    ``cache`` (:func:`cache_of`, :func:`shared_cache`), with pip's settings (never a
    uv.toml of the machine's: ``--no-config``) and, with ``bytecode``, every module's
    bytecode compiled as pip compiles it (imports read ``.pyc``, not the sources)."""
    return [
        uv,
        "pip",
        "install",
        "--quiet",
        "--no-config",
        "--python",
        str(python),
        "--cache-dir",
        str(cache),
        "--link-mode",
        "hardlink",
        *(["--compile-bytecode"] if bytecode else []),
        *settings.args,
        *args,
    ]


def cache_of(envs: Path) -> Path:
    """The uv cache of the environments folder ``envs``."""
    return envs / CACHE


def shared_cache(build_python: str, envs: Path) -> Path:
    """The uv cache a venv under ``envs`` links from: the one that filled the build venv
    of ``build_python`` where that venv is one kiln made (its folder's ``.uv-cache``,
    holding torch already) on the filesystem of ``envs`` (hard links cross no
    filesystem), so a consumer environment made in another kiln cache (a cold run's
    empty one, a test's) links torch's 5 GB instead of unpacking them again; else
    ``envs``' own. The files are the same wheels' either way: uv checks the hashes of
    what it links against the requirements'."""
    own = cache_of(envs)
    theirs = cache_of(Path(build_python).parent.parent.parent)
    if not theirs.is_dir() or theirs.resolve() == own.resolve():
        return own
    where = envs
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        same = theirs.stat().st_dev == where.stat().st_dev and os.access(theirs, os.W_OK)
    except OSError:
        return own
    return theirs if same else own


def host_settings() -> pipconfig.UvSettings:
    """pip's settings on this machine (``pip config list`` of kiln's own Python: the
    machine's pip files and ``PIP_*`` variables); none where pip cannot say."""
    try:
        res = proc.run(
            [sys.executable, "-m", "pip", "config", "list"],
            what="reading pip's settings",
            check=False,
        )
    except OSError:
        return pipconfig.UvSettings()
    if res.returncode != 0:
        return pipconfig.UvSettings()
    return pipconfig.uv_settings(pipconfig.parse(res.output))
