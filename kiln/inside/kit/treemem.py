"""One compile's memory over its whole process tree, sampled while it runs, and the
machine's memory counters the compile gate reads live (stdlib only: part of the kit).

Why a tree: nvcc with ``--threads N`` runs N ``cicc`` (and ``ptxas``) side by side, and
ccache runs nvcc below itself; the largest single process (``ru_maxrss``, what the
wrapper recorded before) saw one of them: a unit recorded at 3.3 GiB peaked at 6.8 GiB.
The sum of the resident sets of the compile's processes, sampled every
:data:`INTERVAL_S`, is what the compile holds; the recorded peak is the larger of that
and the largest process's own peak (which the kernel keeps exactly). Shared pages count
once per process: the safe side for a memory budget.

A process's children are read from ``/proc/<pid>/task/<tid>/children`` (a few reads for
a compile's handful of processes); where the kernel has no such file, from every
process's parent in ``/proc``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

INTERVAL_S = 0.5
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
GIB_KIB = 2**20


def _children(pid: int) -> list[int]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(p) for p in fh.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _children_by_scan(pid: int) -> list[int]:
    """The children of ``pid`` from every process's ``stat`` (kernels without the
    ``children`` file)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        if int(stat[stat.rfind(b")") + 2 :].split()[1]) == pid:
            out.append(int(name))
    return out


HAS_CHILDREN_FILE = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    found, todo = [root], [root]
    read = _children if HAS_CHILDREN_FILE else _children_by_scan
    while todo:
        kids = read(todo.pop())
        found += kids
        todo += kids
    return found


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_kib(root: int) -> int:
    return sum(rss_kib(pid) for pid in tree(root))


class TreeSampler:
    """Samples ``tree_rss_kib(pid)`` in a daemon thread until :meth:`stop`; each sample
    is handed to ``report`` (the compile gate's live figure of this compile)."""

    def __init__(
        self, pid: int, report: Callable[[int], None] | None = None, interval: float = INTERVAL_S
    ) -> None:
        self.pid, self.report, self.interval = pid, report, interval
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="treemem")

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            now = tree_rss_kib(self.pid)
            self.peak_kib = max(self.peak_kib, now)
            if self.report is not None:
                self.report(now)

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()


def oom_kills() -> int:
    """The kernel's count of processes it killed for memory, machine-wide (cgroup limits
    included; ``/proc/vmstat`` is not namespaced, so a container reads the host's)."""
    try:
        with open("/proc/vmstat") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


STEP_CGROUP = "kiln-step-"  # kiln's own per-step cgroups (runners/memlimit.py)


def _inactive_file(folder: str, key: str) -> int:
    """The cgroup's inactive file pages (bytes): page cache the kernel takes back first."""
    try:
        with open(os.path.join(folder, "memory.stat")) as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _room_in(folder: str, limit_file: str, used_file: str, inactive: str) -> int | None:
    """Room under one cgroup's limit (KiB) beside its working set (its usage less its
    inactive page cache, as ``docker stats`` counts it: a cgroup's usage grows with every
    file it reads until its limit, and that cache is given back on demand); None where it
    has no limit or it cannot be read."""
    try:
        with open(os.path.join(folder, limit_file)) as fh:
            limit = fh.read().strip()
        with open(os.path.join(folder, used_file)) as fh:
            used = int(fh.read())
    except (OSError, ValueError):
        return None
    if limit == "max" or int(limit) >= 2**60:
        return None
    working = max(used - _inactive_file(folder, inactive), 0)
    return max(int(limit) - working, 0) // 1024


def _own_cgroup_room_kib() -> int | None:
    """The least room left under the memory limits of this process's cgroup and those
    above it (v2 ``memory.max``, v1 ``memory.limit_in_bytes``): a container's, a CI
    job's; None where none has a limit or none can be read. kiln's own step cgroups are
    left out: their limit is the build's budget, which the gate counts itself."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            root = "/sys/fs/cgroup"
            files = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            root = "/sys/fs/cgroup/memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        rooms = []
        while True:
            if not os.path.basename(path).startswith(STEP_CGROUP):
                room = _room_in(root + path, *files)
                if room is not None:
                    rooms.append(room)
            if path in ("/", ""):
                break
            path = os.path.dirname(path)
        if rooms:
            return min(rooms)
    return None


def room_gib() -> float | None:
    """The memory the machine can give now: ``MemAvailable``, or the room under this
    process's cgroup limit where that is smaller (a build step's own limit, a
    container's); None where neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1])
                    break
    except (OSError, ValueError):
        pass
    cgroup = _own_cgroup_room_kib()
    found = [x for x in (avail, cgroup) if x is not None]
    return min(found) / GIB_KIB if found else None
