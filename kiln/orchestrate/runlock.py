"""One build at a time per output and work folder.

An flock on ``<folder>/.kiln.sources.lock`` (``<artifacts>/logs/.kiln.sources.lock``) held for the
whole build. The kernel drops it when its process dies, however it dies, so a lock
is never stale; the file only says who holds it (pid, start time, command) for the
message a second build prints before it refuses (or waits, with ``--wait``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kiln import fsutil
from kiln.errors import Busy

log = logging.getLogger(__name__)

LOCK_NAME = ".kiln.sources.lock"


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        started = time.strftime("%H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']}, started {started}: {info['command']}"
    except (ValueError, KeyError, OSError, TypeError):
        return "holder unknown"


def lock_file(folder: Path) -> Path:
    """Where a folder's lock lives: under ``logs/`` for an artifacts folder, so that
    the release side of it holds only releases."""
    return folder / "logs" / LOCK_NAME if (folder / "logs").is_dir() else folder / LOCK_NAME


def busy_error(folder: Path, holder: str) -> Busy:
    return Busy(
        f"{folder} is in use by another kiln build ({holder}): wait for "
        f"it to finish, pass --wait, or use another --artifacts/--work"
    )


def holder_now(folder: Path) -> str | None:
    """Who holds ``folder``'s lock now, read from its file alone (nothing is locked or
    created: a dry run must not make a build that starts meanwhile refuse); None when
    no live process does. A holder empties the file when it ends; a killed one leaves
    its pid, which is then gone."""
    path = lock_file(folder)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        pid = int(info["pid"])
    except (ValueError, KeyError, OSError, TypeError):
        return None
    else:
        return _holder(fd) if pid != os.getpid() and fsutil.pid_alive(pid) else None
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(folders: list[Path], wait: bool = False) -> Iterator[None]:
    """Lock every folder (in a fixed order, so two builds cannot deadlock)."""
    fds: list[int] = []
    try:
        for folder in sorted({f.resolve() for f in folders}):
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_file(folder), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    holder = _holder(fd)
                    os.close(fd)
                    raise busy_error(folder, holder) from None
                log.warning("waiting for the build holding %s (%s)", folder, _holder(fd))
                fcntl.flock(fd, fcntl.LOCK_EX)
            fds.append(fd)  # held: this process writes and, at the end, empties it
            if os.pread(fd, 1, 0):  # a holder that ended cleanly empties the file
                log.warning(
                    "the last kiln build on %s did not finish (%s): its lock went with it; "
                    "its staging folder and work trees are cleaned, its finished vendors "
                    "reused from the artifact cache",
                    folder,
                    _holder(fd),
                )
            info = {"pid": os.getpid(), "started": time.time(), "command": " ".join(sys.argv)}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        yield
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)
