"""Hashing and all-or-nothing output: nothing half-written ever appears in ``artifacts/``
or in kiln's cache, which builds from several checkouts may share at once
(:func:`making`)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.errors import DiskFull

SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

log = logging.getLogger(__name__)


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
    and calls :func:`swap_in`. On any exception, Ctrl-C included, it is removed."""
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


def swap_in(stage: Path, final: Path) -> None:
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


def lock_path(entry: Path) -> Path:
    """The lock file of a cache entry: ``.<name>.lock`` beside it (never removed: a lock
    file removed while another process waits on it would let a third one in)."""
    return entry.with_name(f".{entry.name}.lock")


@contextmanager
def making(entry: Path, what: str) -> Iterator[None]:
    """Hold the exclusive lock of the cache entry ``entry`` (a folder or a file, made
    or not) while it is made or changed. Every kiln sharing the cache (other checkouts,
    other work and artifacts folders) takes the same lock for the same entry: a second
    one waits, says so, and then finds the entry made. An ``flock``: the kernel drops it
    when its process dies, however it dies, so it is never stale; each call opens the
    file anew, so two threads of one process exclude each other too. Standard library
    only (``kiln.inside.facts`` uses it). Not reentrant: never nest two for one entry."""
    lock = lock_path(entry)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another kiln making %s (%s)", what, entry)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor drops the lock


def made_once(
    entry: Path, is_made: Callable[[], bool], make: Callable[[], None], what: str
) -> bool:
    """Make ``entry`` unless ``is_made()``: under its lock (:func:`making`), asked again
    once the lock is held, so of builds racing for it exactly one makes it and the others
    reuse it. ``make`` must leave ``is_made()`` false until the entry is whole (a marker
    written last, or a rename into place). Returns whether this call made it."""
    if is_made():
        return False
    with making(entry, what):
        if is_made():
            return False
        make()
        return True


def write_atomic(path: Path, text: str) -> None:
    """``path`` with ``text``, whole or not at all: written beside and renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(name, 0o644)
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)
