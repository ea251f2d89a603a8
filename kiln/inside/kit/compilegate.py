"""A machine-wide gate for compile jobs: memory and CPU slots shared by every build
step of one kiln run (stdlib only: it runs inside build containers).

Why a gate and not only ``MAX_JOBS``: ninja's ``MAX_JOBS`` bounds one step; when
several upstreams build at once, and when one step finishes early, a fixed split of
the machine either overcommits memory or leaves cores idle. Every compile goes
through kiln's compiler wrapper, which asks the gate for its memory estimate and
its threads before it starts the real compiler, and gives them back when done. A
step therefore gets ``MAX_JOBS`` as large as its parallelism allows and the gate
keeps the sum of what runs under the run's budget.

Which waiting compile goes next: the one with the highest priority that fits, where
a compile's priority is its learned CPU time (the longest first: a long translation
unit started last would run on alone while the other cores idle) and links come
before any compile (their step waits on them). The per-unit estimates come from what
kiln learned of the same recipe (``KILN_GATE_HINTS``: a JSON file kiln writes per step,
from this cache or another build's learned data); a unit without one gets its
family's (its folder's units of its suffix), else the step's estimate. An nvcc compile
holds as many CPU slots as its ``--threads`` (the wrapper sets them per unit) and that
many times its memory per thread.

The gate is a folder: ``budget.json`` ({"mem_gib", "cpus"}), ``lock`` (flock'ed
while the holders are counted), ``holders/<id>.json`` and ``waiting/<id>.json``,
each flock'ed by its live process, and ``changed`` (rewritten whenever a holder or
a waiter comes or goes, so waiters look again only then). A process killed with
SIGKILL loses its flocks, so the next count drops it: no leaked slots after a crash.
flock works across containers that share the bind-mounted folder.

A waiter does not poll for a slot coming free: for each holder it saw, a thread waits
in a blocking shared ``flock`` on that holder's file, which the kernel grants the
moment the holder lets go (done or killed), so the waiter looks again at once and
costs no CPU meanwhile (polling every 50 ms cost 5 ms of CPU per second per waiter,
about 12 CPU-seconds of a 20-minute build). Only what no holder's end announces (a
waiter ahead taking a slot) is still seen by looking at ``changed``, a few times a
second.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict, cast

try:
    from kiln.inside.kit import compileflags
except ImportError:  # run from a tree's .kiln/: the kit's copies beside it
    import compileflags  # type: ignore[no-redef]

POLL_S = 0.25  # how often a waiter whose turn may come next looks at ``changed``
IDLE_POLL_S = 2.0  # ... and one further back in the queue (many wait: keep them cheap)
RESCAN_S = 30.0  # look again at least this often, even when nothing says it changed
FIRST = 1e12  # the priority of non-compiles (links)


def write_budget(gate: Path, mem_gib: float, cpus: int, remote_slots: int = 0) -> None:
    gate.mkdir(parents=True, exist_ok=True)
    (gate / "holders").mkdir(exist_ok=True)
    (gate / "waiting").mkdir(exist_ok=True)
    budget = {"mem_gib": mem_gib, "cpus": cpus, "remote_slots": remote_slots}
    (gate / "budget.json").write_text(json.dumps(budget))


class GateEntry(TypedDict, total=False):
    """A waiter's or holder's file in the gate (``id``: its file's name, added on reading)."""

    id: str
    mem_gib: float
    cpus: int
    priority: float
    since: float
    remote_ok: bool
    where: str  # a holder's: "local" or "remote"
    tree: str  # the step's tree: estimates are comparable within one tree only
    estimate: float  # the kit's ninja's estimate of the unit (unitsize.py), 0: none


def _alive(folder: Path) -> list[GateEntry]:
    """The entries of ``folder`` whose process still holds them; leftovers removed."""
    alive: list[GateEntry] = []
    for path in sorted(folder.glob("*.json")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its process is alive and holds it
                with contextlib.suppress(ValueError, OSError):
                    entry = cast(GateEntry, json.loads(os.pread(fd, 4096, 0) or b"{}"))
                    alive.append({**entry, "id": path.stem})
                continue
            path.unlink(missing_ok=True)  # nobody holds it: a dead process's leftover
        finally:
            os.close(fd)
    return alive


def _bump(gate: Path) -> None:
    with contextlib.suppress(OSError):
        (gate / "changed").write_text(uuid.uuid4().hex)


def _changed_stamp(gate: Path) -> tuple[int, int]:
    try:
        st = (gate / "changed").stat()
        return st.st_mtime_ns, st.st_ino
    except OSError:
        return 0, 0


def admitted(
    budget: dict[str, float], holders: list[GateEntry], waiters: list[GateEntry], me: str
) -> tuple[str | None, int]:
    """Where waiter ``me`` may start now ("local", "remote" or None: not yet), and its
    place in the queue: waiters are taken in :func:`queue_order` and each one that fits
    beside those already running is counted as started; ``me`` goes when its turn comes
    and it fits. A compile that may run remotely (``remote_ok``) takes a free remote slot
    first, a local one when they are all taken: remote slots
    (``remote_slots``, the build servers' CPUs) use no local memory or CPU, which stay
    for the links and for what the build servers cannot run. One job alone always runs (the caller
    checked before the build that one job of every step fits the budget)."""
    local = [h for h in holders if h.get("where", "local") == "local"]
    mem = sum(h.get("mem_gib", 0.0) for h in local)
    cpu = sum(h.get("cpus", 1) for h in local)
    remote = len(holders) - len(local)
    slots = int(budget.get("remote_slots", 0))
    running = len(holders)
    for place, w in enumerate(queue_order(waiters)):
        fits = mem + w.get("mem_gib", 0.0) <= budget["mem_gib"] + 1e-9
        fits = fits and cpu + w.get("cpus", 1) <= budget["cpus"]
        if w.get("remote_ok") and remote < slots:
            if w["id"] == me:
                return "remote", place
            remote += 1
            running += 1
        elif fits or not running:
            if w["id"] == me:
                return "local", place
            mem += w.get("mem_gib", 0.0)
            cpu += w.get("cpus", 1)
            running += 1
        elif w["id"] == me:
            return None, place
    return None, len(waiters)


def queue_order(waiters: list[GateEntry]) -> list[GateEntry]:
    """Longest first by priority (learned CPU seconds); among equal priorities, the
    waiters of one step (one tree) form a group that queues where its first waiter
    arrived, and inside it the kit's ninja's estimates order them (ninja starts them in
    that order; they reach the gate in whatever order they happen to). An estimate
    weighs the upstream's own code, so it is never compared across steps: a first
    build's unit of another step without one (a setuptools compile, a unit reading
    torch's headers more than its own) is not starved behind every estimated unit: one
    such 82 s unit waited 480 s in a cold build of three steps and then ran alone at the
    end (docs/performance.md)."""
    first: dict[tuple[str, float], float] = {}
    for w in waiters:
        group = (w.get("tree", ""), w.get("priority", 0.0))
        first[group] = min(first.get(group, math.inf), w.get("since", 0.0))
    return sorted(
        waiters,
        key=lambda w: (
            -w.get("priority", 0.0),
            first[(w.get("tree", ""), w.get("priority", 0.0))],
            w.get("tree", ""),
            -w.get("estimate", 0.0),
            w.get("since", 0.0),
        ),
    )


def _register(path: Path, entry: GateEntry) -> int:
    """Create ``path`` flock'ed by this process. Only under the gate's lock: a scan that
    saw the file between its creation and its flock would take it for a dead process's
    leftover and remove it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps(entry).encode())
    return fd


def _watch_holder(path: Path, woke: threading.Event) -> None:
    """Set ``woke`` once the holder of ``path`` lets its slot go (a blocking shared flock
    is granted only then; a file already gone means it has gone)."""

    def wait() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            woke.set()
            return
        try:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)
            woke.set()

    threading.Thread(target=wait, daemon=True, name="gate-watch").start()


def _gone(fd: int) -> bool:
    """Whether the file open at ``fd`` was removed (then it is registered no more)."""
    return os.fstat(fd).st_nlink == 0


@contextlib.contextmanager
def slot(
    gate: Path,
    mem_gib: float,
    cpus: int,
    priority: float = 0.0,
    remote_ok: bool = False,
    estimate: float = 0.0,
    tree: str = "",
) -> Iterator[str]:
    """Wait until this job's turn comes and ``mem_gib`` and ``cpus`` fit beside the live
    holders (or a remote slot is free, for a job that may run remotely), hold them while
    the body runs; the body gets where it runs ("local" or "remote")."""
    budget = json.loads((gate / "budget.json").read_text())
    me = uuid.uuid4().hex
    entry: GateEntry = {
        "mem_gib": mem_gib,
        "cpus": cpus,
        "priority": priority,
        "since": time.time(),
        "estimate": estimate,
        "tree": tree,
    }
    entry["remote_ok"] = remote_ok
    waiting = gate / "waiting" / f"{me}.json"
    waiting.parent.mkdir(exist_ok=True)
    with open(gate / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wfd = _register(waiting, entry)
    _bump(gate)
    seen, looked, near = None, 0.0, True
    woke, watched = threading.Event(), set()
    try:
        while True:
            stamp = _changed_stamp(gate)
            if stamp != seen or woke.is_set() or time.monotonic() - looked >= RESCAN_S:
                seen, looked = stamp, time.monotonic()
                woke.clear()  # before the scan: a holder leaving after it wakes us again
                with open(gate / "lock", "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if _gone(wfd):  # never: registered under this lock; but never wait unseen
                        os.close(wfd)
                        wfd = _register(waiting, entry)
                    holders = _alive(gate / "holders")
                    where, place = admitted(budget, holders, _alive(gate / "waiting"), me)
                    if where:
                        held: GateEntry = {**entry, "where": where}
                        if where == "remote":  # no local memory or CPU
                            held["mem_gib"], held["cpus"] = 0.0, 0
                        fd = _register(gate / "holders" / f"{me}.json", held)
                        break
                for h in holders:
                    if h["id"] not in watched:
                        watched.add(h["id"])
                        _watch_holder(gate / "holders" / f"{h['id']}.json", woke)
                # Those next in line look often; the rest of a long queue rarely.
                near = place < max(int(budget["cpus"]), 1)
            woke.wait(POLL_S if near else IDLE_POLL_S)
    finally:
        waiting.unlink(missing_ok=True)
        os.close(wfd)
    _bump(gate)
    try:
        yield where
    finally:
        (gate / "holders" / f"{me}.json").unlink(missing_ok=True)
        os.close(fd)
        _bump(gate)


def learned_hints() -> dict[str, object]:
    """The step's learned figures (``KILN_GATE_HINTS``: plan.schedule.GateHints as JSON),
    {} where there are none; each figure is checked where it is read."""
    path = os.environ.get("KILN_GATE_HINTS")
    if not path:
        return {}
    try:
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _family(source: str) -> str:
    """A unit's family (``plan.schedule.family``): its folder's units of its suffix."""
    return f"{os.path.dirname(source)}/*{os.path.splitext(source)[1]}"


def _unit_hint(source: str | None, key: str) -> float | None:
    """The learned figure ``key`` of a unit: its own, else its family's (a unit the
    learned data does not name, e.g. a new file beside learned ones), else None."""
    hints = learned_hints()
    for table, name in (("units", source or ""), ("families", _family(source or ""))):
        figures = hints.get(table)
        entry = figures.get(name) if isinstance(figures, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get(key), int | float):
            return float(entry[key])
    return None


ESTIMATES = os.path.join(".kiln", "host", "estimates.json")  # in the tree, never packed


def write_estimates(tree: str, estimates: dict[str, int]) -> None:
    """Keep the kit's ``ninja``'s estimates of a first build's units (``unitsize.py``)
    for the gate (written whole, then renamed)."""
    path = os.path.join(tree, ESTIMATES)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(estimates, fh)
    os.replace(tmp, path)


def _estimate(source: str) -> float | None:
    """The kit's ``ninja``'s estimate of a unit with nothing learned (None: none)."""
    tree = dict(compileflags.env_roots()).get("TREE")
    if not tree:
        return None
    try:
        with open(os.path.join(tree, ESTIMATES)) as fh:
            found = json.load(fh).get(source)
    except (OSError, ValueError, AttributeError):
        return None
    return float(found) if isinstance(found, int | float) else None


def hinted_priority(source: str | None) -> float:
    """A compile's priority: its learned CPU seconds (else its family's, else the step's
    default) plus its step's learned links (``tail_cpu_s``: what runs after the step's
    last compile). A unit nothing was learned of is ordered among its own step's by the
    kit's ``ninja``'s estimate at the gate (:func:`unit_estimate`, :func:`queue_order`)."""
    hints = learned_hints()
    tail = hints.get("tail_cpu_s", 0.0)
    tail = float(tail) if isinstance(tail, int | float) else 0.0
    learned = _unit_hint(source, "cpu_s") if source else None
    if learned is not None:
        return learned + tail
    default = hints.get("default_cpu_s", 0.0)
    return (float(default) if isinstance(default, int | float) else 0.0) + tail


def unit_estimate(source: str | None) -> float:
    """The kit's ``ninja``'s estimate of ``source`` (``unitsize.py``: bytes of the
    upstream's code it reads), 0 where it made none: comparable within one tree only."""
    return float(_estimate(source) or 0.0) if source else 0.0


IN_BUILD_MARGIN = 1.25  # plan.schedule.LEARNED_MARGIN (the kit imports nothing of kiln)


def family_peak_here(source: str) -> float | None:
    """The largest peak (GiB, one process: what one nvcc thread took) of the compiles of
    ``source``'s family that already finished in this build (``KILN_JOB_STATS``), times
    the margin; None where none has. What a first build learns as it goes: its recipe's
    estimate is its heaviest unit's (a CUTLASS FMHA unit's 9.2 GiB), which stood in for
    every unit of a step whose others took 1-2.6 GiB, so fewer ran at once than memory
    allowed. Compiles sent to build servers (their local peak is sccache's) do not count."""
    path = os.environ.get("KILN_JOB_STATS")
    if not path:
        return None
    want = _family(source)
    peak = None
    try:
        with open(path) as fh:
            lines = fh.readlines()
    except OSError:
        return None
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(r, dict)
            and r.get("result") == "compiled"
            and r.get("rc") == 0
            and r.get("where", "local") == "local"
            and isinstance(r.get("rss_kib"), int | float)
            and _family(str(r.get("source") or "")) == want
        ):
            peak = max(peak or 0.0, float(r["rss_kib"]) / 2**20)
    return None if peak is None else round(peak * IN_BUILD_MARGIN, 3)


def mem_per_thread(source: str | None) -> float:
    """What one nvcc thread of this unit reserves: its learned peak (or its family's)
    times the margin; else the largest of its family's compiles that finished in this
    build (``family_peak_here``); else the step's estimate (``KILN_GATE_MEM_GIB``)."""
    learned = _unit_hint(source, "mem_gib") if source else None
    if learned is not None:
        return learned
    here = family_peak_here(source) if source else None
    if here is not None:
        return here
    return float(os.environ.get("KILN_GATE_MEM_GIB", "0") or 0)


def from_environment(
    source: str | None = None, priority: float = 0.0, remote_ok: bool = False, threads: int = 1
) -> contextlib.AbstractContextManager[str | None]:
    """The slot this compile needs, from the step's environment: ``threads`` CPU slots
    (nvcc's ``--threads`` for this unit; 1 for anything else) and that many times its
    memory per thread; a no-op outside kiln's builds (e.g. ``rebuild.py`` on an
    installed tree)."""
    gate = os.environ.get("KILN_GATE_DIR")
    if not gate or not (Path(gate) / "budget.json").is_file():
        return contextlib.nullcontext(None)
    threads = max(threads, 1)
    tree = dict(compileflags.env_roots()).get("TREE", "")
    return slot(
        Path(gate),
        mem_per_thread(source) * threads,
        threads,
        priority,
        remote_ok,
        unit_estimate(source),
        tree,
    )
