"""The local runner's steps cannot reach the network (issue 41), as the Docker runner's
cannot (``network_mode="none"``): each command that does not ask for the network runs in
a network namespace of its own through bubblewrap (``bwrap --unshare-net``: only a
loopback of its own, which bwrap brings up, so a step's own sccache server still
answers; the host's loopback, and everything past it, is out of reach), with the file
system read-only but for the folders the command may write (its ``Command.writable``: the
tree, its outputs and logs, the compiler cache; as the Docker runner mounts them) and the
temporary folders.

Where the machine forbids namespaces (an unprivileged container, no bubblewrap), kiln
says so once and runs the step as before; the manifest and the release README record
which it was (``runner.network``: ``isolated`` or ``not isolated``), so ``--offline``
means the same on both runners or says that it did not.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

log = logging.getLogger(__name__)

# What a step's wrap asks of the machine (namespaces, binds), tried once with `true`.
PROBE = (
    *("--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev"),
    *("--unshare-net", "--unshare-pid", "--proc", "/proc"),
)
ISOLATED = "isolated"
NOT_ISOLATED = "not isolated"
_found: dict[str, str | None] = {}
_lock = threading.Lock()


def _probe() -> str | None:
    """bwrap's path where it can make a network namespace here, else None (warned once)."""
    bwrap = shutil.which("bwrap")
    why = "bubblewrap (bwrap) is not installed"
    if bwrap:
        try:
            res = subprocess.run(
                [bwrap, *PROBE, "true"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"bwrap could not run ({exc})"
        else:
            if res.returncode == 0:
                return bwrap
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            why = f"this machine forbids network namespaces (bwrap: {last})"
    log.warning(
        "build steps here are not isolated from the network: %s; install bubblewrap or use "
        "the Docker runner (the manifest records the steps as not isolated)",
        why,
    )
    return None


def bwrap() -> str | None:
    """The bwrap that isolates steps here (probed once per process)."""
    with _lock:
        if "bwrap" not in _found:
            _found["bwrap"] = _probe()
        return _found["bwrap"]


def state() -> str:
    """What the manifest records of this machine's local steps."""
    return ISOLATED if bwrap() else NOT_ISOLATED


def _temporary() -> list[str]:
    """The temporary folders compilers write into (TMPDIR, /tmp, /var/tmp)."""
    found = [tempfile.gettempdir(), "/tmp", "/var/tmp"]
    return list(dict.fromkeys(os.path.realpath(t) for t in found if os.path.isdir(t)))


def wrap(argv: Sequence[str | PathLike[str]], writable: Sequence[Path] = ()) -> list[str]:
    """``argv`` in a network namespace of its own, the file system read-only but for
    ``writable`` (the step's tree, its outputs, logs and the caches it writes, as the
    Docker runner mounts them) and the temporary folders; as it is where no namespace can
    be made."""
    found = bwrap()
    command = [str(a) for a in argv]
    if found is None:
        return command
    binds: list[str] = []
    for path in [*(str(p) for p in writable), *_temporary()]:
        Path(path).mkdir(parents=True, exist_ok=True)
        real = os.path.realpath(path)
        binds += ["--bind", real, real]
    # A pid namespace of its own too (with its own /proc): when kiln dies, bwrap dies with
    # it and the kernel ends every process of the step, however deep (a step otherwise
    # watches its parent, which is bwrap here, and bwrap outlives a killed kiln).
    return [
        found,
        *("--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev"),
        *binds,
        *("--unshare-net", "--unshare-pid", "--proc", "/proc", "--die-with-parent", "--"),
        *command,
    ]
