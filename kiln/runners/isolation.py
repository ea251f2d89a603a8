"""The local runner's steps cannot reach the network (issue 41), as the Docker runner's
cannot (``network_mode="none"``): each command that does not ask for the network runs in
a network namespace of its own through bubblewrap (``bwrap --unshare-net``: only a
loopback of its own, which bwrap brings up, so a step's own sccache server still
answers; the host's loopback, and everything past it, is out of reach), with the file
system read-only but for the folders the command may write (its ``Command.writable``: the
tree, its outputs and logs, the compiler cache; as the Docker runner mounts them) and the
temporary folders.

Where bubblewrap is missing or cannot make namespaces, util-linux's ``unshare`` (on every
Debian and Ubuntu) does the same as root: network, mount and pid namespaces of the
step's own, its loopback brought up where ``ip`` is, the root file system remounted
read-only in it but for the same folders. Where neither can (an unprivileged
container), the build stops before its first step (``refusal``) unless told
``--allow-network``; the manifest and the release README record which it was
(``runner.network``: ``isolated`` or ``not isolated``), so ``--offline`` means the same
on both runners or says that it did not.

``KILN_BWRAP`` / ``KILN_UNSHARE``: the program to use instead of the one on PATH, or
``none`` (a machine without it: what the tests use to be such a machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from os import PathLike
from pathlib import Path

from kiln.inside import netrefuse
from kiln.inside.kit import contract

log = logging.getLogger(__name__)

# What a step's wrap asks of the machine (namespaces, binds), tried once with `true`.
PROBE = (
    *("--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev"),
    *("--unshare-net", "--unshare-pid", "--proc", "/proc"),
)
ISOLATED = "isolated"
NOT_ISOLATED = "not isolated"
_found: dict[str, str | None] = {}  # "method": how\0program, or None; "why": why not
_lock = threading.Lock()


def _program(name: str, env: str) -> str | None:
    """``name`` on PATH, or what ``env`` names (``none``: absent)."""
    chosen = os.environ.get(env)
    if chosen == "none":
        return None
    return chosen or shutil.which(name)


# As root, in the step's new mount namespace: each writable folder bound on itself (a
# mount of its own), then the root file system remounted read-only (the binds stay
# writable), the loopback up where `ip` is; then the step.
_UNSHARE_SETUP = (
    'for a in "$@"; do case $a in --) break ;; '
    'rw:*) p=${a#rw:}; mount --bind "$p" "$p" && mount -o remount,bind,rw "$p" || exit 97 ;; '
    'ro:*) p=${a#ro:}; mount --bind "$p" "$p" && mount -o remount,bind,ro "$p" || exit 97 ;; '
    "esac; done; "
    "mount -o remount,bind,ro / || exit 97; "
    "ip link set lo up 2>/dev/null; "
    'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
)


def _unshare_argv(unshare: str, binds: Sequence[str], command: Sequence[str]) -> list[str]:
    """``binds``: ``rw:PATH`` / ``ro:PATH``, in order (a later one on top)."""
    return [
        unshare,
        *("--net", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child"),
        *("sh", "-c", _UNSHARE_SETUP, "kiln-step", *binds, "--", *command),
    ]


def _probe_unshare() -> tuple[str | None, str]:
    """unshare's path where it isolates a step here (root), else None and why not."""
    unshare = _program("unshare", contract.UNSHARE)
    if unshare is None:
        return None, "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return None, "unshare needs root to make mount and network namespaces here"
    probe = tempfile.mkdtemp(prefix="kiln-isolation-")
    try:
        # its folder writable, the rest not (a write that passes is undone, and fails it)
        check = f"touch {probe}/ok && if touch /.kiln-probe; then rm -f /.kiln-probe; exit 1; fi"
        res = subprocess.run(
            _unshare_argv(unshare, [f"rw:{probe}"], ["sh", "-c", check]),
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"unshare could not run ({exc})"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if res.returncode == 0:
        return unshare, ""
    last = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
    return None, f"unshare cannot make namespaces here ({last})"


def _probe() -> tuple[str, str] | None:
    """(how, its program) where a step can be isolated here, else None (said once)."""
    bwrap = _program("bwrap", contract.BWRAP)
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
                return "bwrap", bwrap
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            why = f"this machine forbids network namespaces (bwrap: {last})"
    unshare, why_not = _probe_unshare()
    if unshare is not None:
        log.info("build steps isolated by unshare (%s)", why)
        return "unshare", unshare
    _found["why"] = f"{why}; {why_not}"
    return None


def _method() -> tuple[str, str] | None:
    """How steps are isolated here (probed once per process)."""
    with _lock:
        if "method" not in _found:
            found = _probe()
            _found["method"] = "\0".join(found) if found else None
        method = _found["method"]
    if not method:
        return None
    how, program = method.split("\0", 1)
    return how, program


def bwrap() -> str | None:
    """The bwrap that isolates steps here, where it is bubblewrap that does."""
    found = _method()
    return found[1] if found and found[0] == "bwrap" else None


def isolates() -> bool:
    """Whether this machine's local steps run isolated (bubblewrap or unshare)."""
    return _method() is not None


def why_not() -> str:
    """Why no step can be isolated here ("" where they are)."""
    return "" if isolates() else str(_found.get("why") or "")


def refusal() -> str:
    """The one line a local build stops with where no step can be isolated."""
    return (
        f"build steps here cannot be kept from the network ({why_not()}): install "
        f"bubblewrap (apt-get install bubblewrap), build with the Docker runner (--runner "
        f"docker), or pass --allow-network to build with the network (the manifest and the "
        f"release README record the steps as not isolated)"
    )


def allowed_network() -> None:
    """Said once where ``--allow-network`` lets steps run with the network."""
    log.warning(
        "build steps here are not isolated from the network (%s): --allow-network; the "
        "manifest records the steps as not isolated",
        why_not(),
    )


def state() -> str:
    """What the manifest records of this machine's local steps."""
    return ISOLATED if isolates() else NOT_ISOLATED


def _temporary() -> list[str]:
    """The temporary folders compilers write into (TMPDIR, /tmp, /var/tmp)."""
    found = [tempfile.gettempdir(), "/tmp", "/var/tmp"]
    return list(dict.fromkeys(os.path.realpath(t) for t in found if os.path.isdir(t)))


@contextlib.contextmanager
def own_temporary(env: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """``env`` with a temporary folder of the step's own (TMPDIR), removed after it. A step
    has a pid namespace of its own, so two steps' processes may have the same pid, and
    nvcc names its temporary files by pid (``/tmp/tmpxft_00000033_...``): in one shared
    /tmp one step's nvcc deleted the other's ("cc1plus: fatal error:
    /tmp/tmpxft_00000033_00000000-2.cpp: No such file or directory"). Made inside this
    process's TMPDIR. A TMPDIR the recipe sets (not this process's) is the step's as it
    is: the user chose it, and its failures name it; so is ``env`` where the folder
    cannot be made."""
    base = tempfile.gettempdir()
    if env.get("TMPDIR", base) not in (base, os.environ.get("TMPDIR")):
        yield dict(env)
        return
    try:
        own = tempfile.mkdtemp(prefix="kiln-step-", dir=base)
    except OSError:
        yield dict(env)
        return
    try:
        yield {**env, "TMPDIR": own}
    finally:
        shutil.rmtree(own, ignore_errors=True)


def wrap(
    argv: Sequence[str | PathLike[str]],
    writable: Sequence[Path] = (),
    protected: Sequence[Path] = (),
) -> list[str]:
    """``argv`` in a network namespace of its own, the file system read-only but for
    ``writable`` (the step's tree, its outputs, logs and the caches it writes, as the
    Docker runner mounts them) and the temporary folders; of those temporary folders,
    ``protected`` (kiln's own venv, its cache: they may lie under /tmp) stays read-only
    but for what of it is ``writable``. As it is where no namespace can be made."""
    found = _method()
    command = [str(a) for a in argv]
    if found is None:
        return command
    # every download the step tries goes to a proxy of its own that refuses it and names
    # it in the step's log (kiln.inside.netrefuse): the URL, whatever made the request.
    # Run as a file (it is standard library alone), isolated (-I): kiln need not be
    # importable from the step's folder (kiln run from a checkout is not)
    command = [sys.executable, "-I", netrefuse.__file__, "--", *command]
    layers: list[tuple[str, str]] = [("rw", t) for t in _temporary()]
    layers += [("ro", os.path.realpath(p)) for p in protected if os.path.isdir(p)]
    for path in writable:
        Path(path).mkdir(parents=True, exist_ok=True)
        layers.append(("rw", os.path.realpath(path)))
    layers = list(dict.fromkeys(layers))
    how, program = found
    if how == "unshare":
        return _unshare_argv(program, [f"{mode}:{path}" for mode, path in layers], command)
    binds: list[str] = []
    for mode, real in layers:
        binds += ["--bind" if mode == "rw" else "--ro-bind", real, real]
    # A pid namespace of its own too (with its own /proc): when kiln dies, bwrap dies with
    # it and the kernel ends every process of the step, however deep (a step otherwise
    # watches its parent, which is bwrap here, and bwrap outlives a killed kiln).
    return [
        program,
        *("--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev"),
        *binds,
        *("--unshare-net", "--unshare-pid", "--proc", "/proc", "--die-with-parent", "--"),
        *command,
    ]
