"""The local runner's steps cannot reach the network (issue 41), as the Docker runner's
cannot (``network_mode="none"``): each command that does not ask for the network runs in
a network namespace of its own through bubblewrap (``bwrap --unshare-net``: only a
loopback of its own, which bwrap brings up, so a step's own sccache server still
answers; the host's loopback, and everything past it, is out of reach), with the file
system read-only but for the folders the command may write (its ``Command.writable``: the
tree, its outputs and logs, the compiler cache; as the Docker runner mounts them), with a
/tmp and /var/tmp of its own (nothing one step leaves there is another's) and a TMPDIR
of its own on disk.

Where bubblewrap is missing or cannot make namespaces, util-linux's ``unshare`` (on every
Debian and Ubuntu) does the same as root: network, mount and pid namespaces of the
step's own, its loopback brought up where ``ip`` is, private /tmp and /var/tmp, the root
file system remounted read-only in it but for the same folders. Where neither can (an unprivileged
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

from kiln.errors import BuildError
from kiln.inside import netrefuse
from kiln.inside.kit import contract

log = logging.getLogger(__name__)

# What a step's wrap asks of the machine (namespaces, binds), tried once with `true`.
PROBE = (
    *("--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev"),
    *("--tmpfs", "/tmp", "--unshare-net", "--unshare-pid", "--proc", "/proc"),
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


# As root, in the step's new mount namespace, in order: ``tmpfs STAGE`` (a file system in
# memory at STAGE), ``bind ro|rw SOURCE TARGET``, ``move STAGE ROOT`` (the staged private
# folder moved onto ROOT, its binds with it: a bind made after ROOT's own file system is
# covered could not reach what of ROOT the step sees); then the root file system
# remounted read-only (the binds and the private folders stay as they are), the loopback
# up where `ip` is; then the step.
_UNSHARE_SETUP = (
    'while [ "$1" != -- ]; do case $1 in '
    'tmpfs) mkdir -p "$2" && mount -t tmpfs -o mode=1777 kiln-tmp "$2" || exit 97; shift 2 ;; '
    'bind) mkdir -p "$4" && mount --bind "$3" "$4" && mount -o remount,bind,"$2" "$4" '
    "|| exit 97; shift 4 ;; "
    'move) mount --move "$2" "$3" || exit 97; shift 3 ;; '
    "*) exit 96 ;; esac; done; shift; "
    "mount -o remount,bind,ro / || exit 97; "
    "ip link set lo up 2>/dev/null; "
    'exec "$@"'
)


def _unshare_argv(unshare: str, setup: Sequence[str], command: Sequence[str]) -> list[str]:
    """``setup``: the tokens above, in order (a later bind on top)."""
    return [
        unshare,
        *("--net", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child"),
        *("sh", "-c", _UNSHARE_SETUP, "kiln-step", *setup, "--", *command),
    ]


def _probe_unshare() -> tuple[str | None, str]:
    """unshare's path where it isolates a step here (root), else None and why not."""
    unshare = _program("unshare", contract.UNSHARE)
    if unshare is None:
        return None, "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return None, "unshare needs root to make mount and network namespaces here"
    probe = tempfile.mkdtemp(prefix="kiln-isolation-")
    work = os.path.join(probe, "work")
    os.mkdir(work)
    # the steps' own setup: its folder writable, /tmp and /var/tmp its own, the rest
    # read-only (a write that passes is undone, and fails it)
    private = f".{os.path.basename(probe)}"
    check = (
        f"touch {work}/ok /tmp/{private} /var/tmp/{private} && "
        "if touch /.kiln-probe; then rm -f /.kiln-probe; exit 1; fi"
    )
    leaked = [os.path.join(d, private) for d in PRIVATE]
    try:
        res = subprocess.run(
            _unshare_argv(unshare, _unshare_setup([("rw", work)], probe), ["sh", "-c", check]),
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        shared = [p for p in leaked if os.path.exists(p)]
        made = os.path.exists(os.path.join(work, "ok"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"unshare could not run ({exc})"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
        for path in leaked:
            with contextlib.suppress(OSError):
                os.remove(path)
    if res.returncode == 0 and made and not shared:
        return unshare, ""
    last = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
    if res.returncode == 0:
        last = f"{shared[0]} written on the machine" if shared else "its folder not written"
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


# The temporary folders any program writes into without asking (/tmp, /var/tmp): each
# step has its own, a file system in memory, so nothing a step writes there is seen by
# another step or stays after it; what of them the step must see (its tree, its own
# TMPDIR, kiln's venv and cache, a folder its command or environment names) is bound in.
PRIVATE = ("/tmp", "/var/tmp")


def _private_roots() -> list[str]:
    return list(dict.fromkeys(os.path.realpath(t) for t in PRIVATE if os.path.isdir(t)))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _named_by(words: Sequence[str]) -> list[str]:
    """The folders the step's command and environment name (a wheel to install, PATH,
    LIBRARY_PATH, a compiler's path, ...): each absolute path that exists, a file's
    folder."""
    found: list[str] = []
    for value in words:
        for part in value.split(os.pathsep):
            if not part.startswith("/"):
                continue
            if os.path.isfile(part):
                part = os.path.dirname(part)
            if os.path.isdir(part):
                found.append(os.path.realpath(part))
    return found


def _layers(
    named: Sequence[str], writable: Sequence[Path], protected: Sequence[Path]
) -> list[tuple[str, str]]:
    """(ro|rw, folder) to bind, in order, a later one on top: what the command and its
    environment name (``named``, read-only), kiln's own venv and cache (read-only, though
    they may lie inside a writable folder), then what the step writes."""
    rw = []
    for path in writable:
        Path(path).mkdir(parents=True, exist_ok=True)
        rw.append(os.path.realpath(path))
    ro = [os.path.realpath(p) for p in protected if os.path.isdir(p)]
    # (only those in a private temporary folder: the rest of the file system is there,
    # read-only, already)
    roots = _private_roots()
    seen = [
        p
        for p in _named_by(named)
        if any(_under(p, r) for r in roots) and not any(_under(p, b) for b in rw + ro)
    ]
    layers = [("ro", p) for p in seen] + [("ro", p) for p in ro] + [("rw", p) for p in rw]
    return list(dict.fromkeys(layers))


def _bwrap_argv(program: str, layers: Sequence[tuple[str, str]], command: list[str]) -> list[str]:
    binds: list[str] = []
    for mode, real in layers:
        binds += ["--bind" if mode == "rw" else "--ro-bind", real, real]
    # A pid namespace of its own too (with its own /proc): when kiln dies, bwrap dies with
    # it and the kernel ends every process of the step, however deep (a step otherwise
    # watches its parent, which is bwrap here, and bwrap outlives a killed kiln).
    return [
        program,
        *("--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev"),
        *(arg for root in _private_roots() for arg in ("--tmpfs", root)),
        *binds,
        *("--unshare-net", "--unshare-pid", "--proc", "/proc", "--die-with-parent", "--"),
        *command,
    ]


def _unshare_setup(layers: Sequence[tuple[str, str]], scratch: str) -> list[str]:
    """The setup tokens of ``_UNSHARE_SETUP``: each private root staged in ``scratch``,
    the layers bound (under a root: into its stage), then the stages moved onto their
    roots, the one holding ``scratch`` last (its move covers the other stages)."""
    roots = sorted(_private_roots(), key=lambda r: _under(scratch, r))
    stages = {root: os.path.join(scratch, f"stage-{n}") for n, root in enumerate(roots)}
    setup = [token for stage in stages.values() for token in ("tmpfs", stage)]
    for mode, path in layers:
        root = next((r for r in roots if _under(path, r)), None)
        target = path if root is None else os.path.join(stages[root], os.path.relpath(path, root))
        setup += ["bind", mode, path, target]
    for root, stage in stages.items():
        setup += ["move", stage, root]
    return setup


@contextlib.contextmanager
def isolated(
    argv: Sequence[str | PathLike[str]],
    env: Mapping[str, str],
    writable: Sequence[Path] = (),
    protected: Sequence[Path] = (),
    readable: Sequence[Path] = (),
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """(argv, env) that run ``argv`` in a network namespace of its own, the file system
    read-only but for ``writable`` (the step's tree, its outputs, logs and the caches it
    writes, as the Docker runner mounts them), with a /tmp and /var/tmp of its own and a
    TMPDIR of its own on disk (removed after it); ``protected`` (kiln's own venv, its
    cache) stays read-only but for what of it is ``writable``; ``readable`` (the
    command's ``readonly``: a wheel to install, an environment) and what the command and
    its environment name are seen read-only. As they are where no namespace can be made.

    The own TMPDIR: a step has a pid namespace of its own, so two steps' processes may
    have the same pid, and nvcc names its temporary files by pid
    (``/tmp/tmpxft_00000033_...``): in one shared /tmp one step's nvcc deleted the
    other's. A TMPDIR the recipe sets (not this process's) is the step's as it is: the
    user chose it, and its failures name it."""
    found = _method()
    command = [str(a) for a in argv]
    if found is None:
        yield command, dict(env)
        return
    base = tempfile.gettempdir()
    try:
        scratch = tempfile.mkdtemp(prefix="kiln-step-", dir=base)
    except OSError as exc:
        raise BuildError(
            f"cannot make a build step's temporary folder in {base} ({exc}): point TMPDIR "
            f"at a writable folder with room, and rerun"
        ) from exc
    try:
        step_env = dict(env)
        if env.get("TMPDIR", base) in (base, os.environ.get("TMPDIR")):
            step_env["TMPDIR"] = os.path.join(scratch, "tmp")
        writes = [*writable, Path(step_env["TMPDIR"])] if "TMPDIR" in step_env else writable
        # every download the step tries goes to a proxy of its own that refuses it and
        # names it in the step's log (kiln.inside.netrefuse): the URL, whatever made the
        # request. Run as a file (it is standard library alone), isolated (-I): kiln need
        # not be importable from the step's folder (kiln run from a checkout is not); its
        # folder is named, so it is bound in where kiln lies under /tmp
        command = [sys.executable, "-I", netrefuse.__file__, "--", *command]
        named = [*command, *step_env.values(), *(str(p) for p in readable)]
        layers = _layers(named, writes, protected)
        how, program = found
        if how == "unshare":
            yield _unshare_argv(program, _unshare_setup(layers, scratch), command), step_env
        else:
            yield _bwrap_argv(program, layers, command), step_env
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
