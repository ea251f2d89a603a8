"""A memory limit for local build steps: a cgroup of their own, and OOM kills named as such.

The Docker runner gets a limit from the container; the local runner gets the same limit
from a child of kiln's own memory cgroup (cgroup v2, or v1's ``memory`` hierarchy):
the command is started through a tiny launcher that moves itself into the cgroup and
then ``exec``s the command, so the step and every process it starts (pip, ninja, nvcc)
are inside it before they allocate anything. The kernel's OOM-kill counter of that
cgroup, not a guess from an exit code, says whether the step ran out of memory.

Where cgroups cannot be written (not root, no memory controller, a cgroup v2 parent
that holds processes) the step runs without a limit and kiln says so once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import BuildError
from kiln.inside import proc
from kiln.inside.causes.resources import OOM_FIX
from kiln.inside.kit.treemem import STEP_CGROUP

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Runs as the step's first process: join the cgroup, then become the command.
_ENTER = (
    "import os, sys; f = open(sys.argv[1], 'w'); f.write(str(os.getpid())); f.close(); "
    "os.execvp(sys.argv[2], sys.argv[2:])"
)
_counter = itertools.count()
_warned: list[str] = []


def oom_error(what: str, mem_gib: float | None, log_file: Path | None) -> BuildError:
    """The one message for a step the kernel killed for memory (both runners)."""
    where = f"; full log: {log_file}" if log_file else ""
    limit = f"limit {mem_gib:g} GiB" if mem_gib else "no kiln limit: the machine's memory"
    return BuildError(f"{what}: killed: out of memory ({limit}): {OOM_FIX}{where}", oom=True)


def absorbed(what: str, kills: int) -> None:
    """A step that succeeded although the kernel killed processes of it for memory: the
    compiler wrapper compiled each killed compile again alone (said, not an error)."""
    log.info(
        "%s: %d process(es) killed for memory and compiled again alone; the step built",
        what,
        kills,
    )


def _own_cgroups() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            found[c] = path
    return found


def _parent() -> tuple[Path, int]:
    """(the memory cgroup folder to make children in, cgroup version); OSError if none."""
    own = _own_cgroups()
    v2 = CGROUP_ROOT / "cgroup.controllers"
    if v2.exists() and "memory" in v2.read_text().split() and "" in own:
        parent = CGROUP_ROOT / own[""].lstrip("/")
        subtree = parent / "cgroup.subtree_control"
        if "memory" not in subtree.read_text().split():
            subtree.write_text("+memory")  # EBUSY where the parent itself holds processes
        return parent, 2
    v1 = CGROUP_ROOT / "memory"
    if "memory" in own and (v1 / "memory.limit_in_bytes").exists():
        return v1 / own["memory"].lstrip("/"), 1
    raise OSError("no writable memory cgroup (cgroup v2 memory controller or v1 memory)")


@dataclass
class MemoryCgroup:
    path: Path
    version: int
    limit_bytes: int

    @classmethod
    def create(cls, mem_gib: float) -> MemoryCgroup:
        parent, version = _parent()
        path = parent / f"{STEP_CGROUP}{os.getpid()}-{next(_counter)}"
        path.mkdir()
        group = cls(path, version, int(mem_gib * 2**30))
        try:
            if version == 2:
                (path / "memory.max").write_text(str(group.limit_bytes))
                swap = path / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(group.limit_bytes))
                memsw = path / "memory.memsw.limit_in_bytes"
                if memsw.exists():  # memory + swap: no escaping the limit into swap
                    memsw.write_text(str(group.limit_bytes))
        except OSError:
            group.remove()
            raise
        return group

    def wrap(self, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        """``argv`` started inside this cgroup (through the launcher)."""
        return [
            sys.executable,
            "-I",
            "-c",
            _ENTER,
            str(self.path / "cgroup.procs"),
            *map(str, argv),
        ]

    def oom_kills(self) -> int:
        """How many processes the kernel killed in this cgroup for lack of memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        """Kill what is left in the cgroup (a step's orphans), then remove it."""
        for _ in range(50):
            with contextlib.suppress(OSError):
                self.path.rmdir()
                return
            with contextlib.suppress(OSError):
                for pid in (self.path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.1)
        log.warning("could not remove the cgroup %s", self.path)


@contextlib.contextmanager
def limited(mem_gib: float | None) -> Iterator[MemoryCgroup | None]:
    """A fresh memory cgroup of ``mem_gib`` for one step, or None where none can be made."""
    group = None
    if mem_gib:
        try:
            group = MemoryCgroup.create(mem_gib)
        except OSError as exc:
            if not _warned:
                _warned.append(str(exc))
                log.warning("build steps run without a memory limit here (%s)", exc)
    try:
        yield group
    finally:
        if group is not None:
            group.remove()


def run_limited(
    argv: Sequence[str | os.PathLike[str]],
    *,
    mem_gib: float | None,
    what: str,
    log_file: Path | None = None,
    check: bool = True,
    **kwargs: Any,  # proc.run's own keywords (cwd, env, echo, timeout), passed on
) -> proc.Result:
    """:func:`kiln.proc.run` inside a memory cgroup of ``mem_gib``; a step that failed
    after the kernel OOM-killed a process of it raises the out-of-memory error. One that
    succeeded all the same (its compiles killed for memory were compiled again alone by
    the compiler wrapper) is said and returned."""
    with limited(mem_gib) as group:
        cmd = group.wrap(argv) if group else [str(a) for a in argv]
        try:
            res = proc.run(cmd, what=what, log_file=log_file, check=check, **kwargs)
        except BuildError:
            if group and group.oom_kills():
                raise oom_error(what, mem_gib, log_file) from None
            raise
        kills = group.oom_kills() if group else 0
        if kills and res.returncode != 0:
            raise oom_error(what, mem_gib, log_file)
        if kills:
            absorbed(what, kills)
        return res
