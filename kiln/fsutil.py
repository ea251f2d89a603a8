"""Hashing and all-or-nothing output: nothing half-written ever appears in ``artifacts/``."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.errors import DiskFull

SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

log = logging.getLogger("kiln.fs")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def user_cache_dir() -> Path:
    """Where kiln caches when neither ``--cache`` nor ``$KILN_CACHE_DIR`` says: the XDG
    base directory spec's ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln`` (a relative
    ``$XDG_CACHE_HOME`` is ignored, as the spec says)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "kiln"


def mount_point(path: Path) -> Path:
    """The mount point of the file system that holds ``path`` (or would hold it)."""
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def disk_full(exc: OSError, path: Path, doing: str = "writing") -> DiskFull | None:
    """A one-line :class:`DiskFull` for an ENOSPC/EDQUOT ``exc`` raised while ``doing``
    ``path``, naming the file system and its free space; None for any other error."""
    if exc.errno not in SPACE_ERRNOS:
        return None
    mount = mount_point(path)
    try:
        free = f"{shutil.disk_usage(mount).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    what = "no space left" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    return DiskFull(
        f"disk full: {doing} {path} failed: {what} on the file system mounted at {mount} "
        f"({free}); free space there (or point --artifacts/--work/--cache at a larger disk) "
        f"and rerun"
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(staging_root: Path) -> None:
    """Drop staging folders left by runs that were killed (their PID is gone)."""
    if not staging_root.is_dir():
        return
    for entry in staging_root.iterdir():
        pid = entry.name.rsplit("-", 1)[-1].removesuffix(".old")
        if pid.isdigit() and not pid_alive(int(pid)):
            log.info("removing stale staging folder %s", entry)
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh folder beside ``final`` (under ``.staging/``); the caller fills it
    and calls :func:`publish`. On any exception, Ctrl-C included, it is removed."""
    staging_root = final.parent / ".staging"
    remove_stale_staging(staging_root)
    stage = staging_root / f"{final.name}-{os.getpid()}"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    try:
        yield stage
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
        if staging_root.exists() and not any(staging_root.iterdir()):
            staging_root.rmdir()


def publish(stage: Path, final: Path) -> None:
    """Swap ``stage`` in as ``final`` with two renames (the old one is removed after)."""
    old = stage.with_name(stage.name + ".old")
    if final.exists():
        os.replace(final, old)
    os.replace(stage, final)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def set_mtimes(root: Path, mtime: int) -> None:
    """Give every file and folder under ``root`` (``.git`` aside) the same mtime."""
    for dirpath, dirnames, filenames in os.walk(root):
        if ".git" in dirnames:
            dirnames.remove(".git")
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.utime(path, (mtime, mtime))
        os.utime(dirpath, (mtime, mtime))
