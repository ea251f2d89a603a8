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
holds as many CPU slots as its ``--threads`` (the wrapper sets them per unit); every
memory figure is per compile with its threads, over its whole process tree (what the
wrapper measures: ``treemem.py``).

What a running compile holds is read as it runs: each holder reports its process
tree's memory (``holders/<id>.live``, a few times a second), and counts for the larger of
that and what it reserved. A waiter is admitted only where its reservation fits the
budget beside them and the machine has the room now (``MemAvailable``, or the room under
the step's cgroup limit) for it and for what the holders may still grow to. A compile
the kernel killed for memory comes back as an ``alone`` waiter: it reserves the whole
budget, goes first, and holds back those behind it until it can run by itself.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

try:
    from kiln.inside.kit import compileflags, contract, treemem
except ImportError:  # run from a tree's .kiln/: the kit's copies beside it
    import compileflags  # type: ignore[no-redef]
    import contract  # type: ignore[no-redef]
    import treemem  # type: ignore[no-redef]

POLL_S = 0.25  # how often a waiter whose turn may come next looks at ``changed``
IDLE_POLL_S = 2.0  # ... and one further back in the queue (many wait: keep them cheap)
RESCAN_S = 30.0  # look again at least this often, even when nothing says it changed
ROOM_RESCAN_S = 2.0  # ... and the first in line this often (the machine's room may grow)
FIRST = 1e12  # the priority of non-compiles (links)
ALONE = FIRST * 2  # a compile killed for memory, compiled again by itself
ROOM_RESERVE_GIB = 0.5  # left free beside what the holders may still grow to


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
    alone: bool  # killed for memory once: runs only with no other local compile
    live_gib: float  # a holder's process tree now (its ``.live`` file, added on reading)


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
                    live = _read_live(path.with_suffix(".live"))
                    alive.append({**entry, "id": path.stem, **({"live_gib": live} if live else {})})
                continue
            path.unlink(missing_ok=True)  # nobody holds it: a dead process's leftover
            path.with_suffix(".live").unlink(missing_ok=True)
        finally:
            os.close(fd)
    return alive


def _read_live(path: Path) -> float:
    """A holder's process tree now (GiB), 0 where it has reported nothing yet."""
    try:
        return float(path.read_text() or 0)
    except (OSError, ValueError):
        return 0.0


def held_gib(h: GateEntry) -> float:
    """What a running compile counts for: what it reserved, or what its processes hold
    now where that is more (a guess too low is seen as the compile grows past it)."""
    return max(h.get("mem_gib", 0.0), h.get("live_gib", 0.0))


def growth_gib(holders: list[GateEntry]) -> float:
    """What the running compiles may still take: each one's reservation beyond what its
    processes hold now."""
    return sum(max(h.get("mem_gib", 0.0) - h.get("live_gib", 0.0), 0.0) for h in holders)


def holders(gate: Path) -> list[GateEntry]:
    """The compiles that hold a slot of the gate now (none where there is no gate)."""
    folder = gate / "holders"
    return _alive(folder) if folder.is_dir() else []


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
    budget: dict[str, float],
    holders: list[GateEntry],
    waiters: list[GateEntry],
    me: str,
    room: float | None = None,
) -> tuple[str | None, int]:
    """Where waiter ``me`` may start now ("local", "remote" or None: not yet), and its
    place in the queue: waiters are taken in :func:`queue_order` and each one that fits
    beside those already running is counted as started; ``me`` goes when its turn comes
    and it fits. Fitting is twofold: its reservation beside what each holder holds
    (:func:`held_gib`) within the budget, and, with ``room`` (the memory the machine can
    give now, :func:`treemem.room_gib`), room for it beside what the holders may still
    grow to (:func:`growth_gib`). A compile that may run remotely (``remote_ok``) takes a
    free remote slot first, a local one when they are all taken: remote slots
    (``remote_slots``, the build servers' CPUs) use no local memory or CPU, which stay
    for the links and for what the build servers cannot run. One job alone always runs
    (the caller checked before the build that one job of every step fits the budget);
    an ``alone`` waiter that does not fit yet holds back every waiter behind it."""
    local = [h for h in holders if h.get("where", "local") == "local"]
    mem = sum(held_gib(h) for h in local)
    cpu = sum(h.get("cpus", 1) for h in local)
    free = None if room is None else room - growth_gib(local) - ROOM_RESERVE_GIB
    remote = len(holders) - len(local)
    slots = int(budget.get("remote_slots", 0))
    running = len(holders)
    held_back = False  # by an ``alone`` waiter ahead that cannot run yet
    for place, w in enumerate(queue_order(waiters)):
        if held_back:
            if w["id"] == me:
                return None, place
            continue
        want = w.get("mem_gib", 0.0)
        fits = mem + want <= budget["mem_gib"] + 1e-9
        fits = fits and cpu + w.get("cpus", 1) <= budget["cpus"]
        fits = fits and (free is None or want <= free + 1e-9)
        if w.get("remote_ok") and remote < slots:
            if w["id"] == me:
                return "remote", place
            remote += 1
            running += 1
        elif fits or not running:
            if w["id"] == me:
                return "local", place
            mem += want
            cpu += w.get("cpus", 1)
            free = None if free is None else free - want
            running += 1
        elif w["id"] == me:
            return None, place
        else:
            held_back = bool(w.get("alone"))
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


@dataclass
class Held:
    """A slot held: where the compile runs, and how it reports its process tree's memory
    as it runs (the gate counts a holder for the larger of that and its reservation)."""

    where: str | None
    live: Path | None = None
    _shown: float = -1.0

    def report(self, kib: int) -> None:
        """Write the holder's live figure where it moved by 64 MiB or more (renamed into
        place: a reader never sees half a number)."""
        gib = kib / 2**20
        if self.live is None or abs(gib - self._shown) < 1 / 16:
            return
        self._shown = gib
        tmp = self.live.with_name(f".{self.live.name}.{os.getpid()}")
        with contextlib.suppress(OSError):
            tmp.write_text(f"{gib:.3f}")
            os.replace(tmp, self.live)


@contextlib.contextmanager
def slot(
    gate: Path,
    mem_gib: float,
    cpus: int,
    priority: float = 0.0,
    remote_ok: bool = False,
    estimate: float = 0.0,
    tree: str = "",
    alone: bool = False,
    room: Callable[[], float | None] = treemem.room_gib,
) -> Iterator[Held]:
    """Wait until this job's turn comes and ``mem_gib`` and ``cpus`` fit beside the live
    holders and in the machine's ``room`` (or a remote slot is free, for a job that may
    run remotely), hold them while the body runs; the body gets the slot (where it runs,
    and where it reports its memory). ``alone``: the job runs with no other local
    compile (it reserves the whole budget and goes first)."""
    budget = json.loads((gate / "budget.json").read_text())
    me = uuid.uuid4().hex
    if alone:
        mem_gib, priority, remote_ok = float(budget["mem_gib"]), ALONE, False
    entry: GateEntry = {
        "mem_gib": mem_gib,
        "cpus": cpus,
        "priority": priority,
        "since": time.time(),
        "estimate": estimate,
        "tree": tree,
    }
    entry["remote_ok"] = remote_ok
    if alone:
        entry["alone"] = True
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
                    where, place = admitted(budget, holders, _alive(gate / "waiting"), me, room())
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
                # Those next in line look often; the rest of a long queue rarely. The
                # next in line also looks again soon without news: the machine's room
                # (not announced by anyone) may be what holds it back.
                near = place < max(int(budget["cpus"]), 1)
                if place == 0:
                    looked = min(looked, time.monotonic() - RESCAN_S + ROOM_RESCAN_S)
            woke.wait(POLL_S if near else IDLE_POLL_S)
    finally:
        waiting.unlink(missing_ok=True)
        os.close(wfd)
    _bump(gate)
    live = gate / "holders" / f"{me}.live"
    try:
        yield Held(where, live if where == "local" else None)
    finally:
        (gate / "holders" / f"{me}.json").unlink(missing_ok=True)
        live.unlink(missing_ok=True)
        os.close(fd)
        _bump(gate)


def learned_hints() -> dict[str, object]:
    """The step's learned figures (``KILN_GATE_HINTS``: plan.schedule.GateHints as JSON),
    {} where there are none; each figure is checked where it is read."""
    path = contract.StepFiles.from_env(os.environ).gate_hints
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


def kind_of(source: str) -> str:
    """A unit's kind: its suffix (``.cu``, ``.cpp``): what one kind of unit takes says
    nothing of another (a step's C++ units of 1-2 GiB beside CUDA units of 7)."""
    return os.path.splitext(source)[1]


def peaks_here(source: str) -> tuple[float | None, float | None]:
    """The largest peaks (GiB, per compile over its process tree) of the compiles of
    ``source``'s family and of its kind that already finished in this build
    (``KILN_JOB_STATS``), times the margin; None where none has. What a first build
    learns as it goes: its recipe's guess is its heaviest unit's (a CUTLASS FMHA unit's
    9.2 GiB), which stood in for every unit of a step whose others took 1-2.6 GiB, so
    fewer ran at once than memory allowed. Compiles sent to build servers (their local
    peak is sccache's), cache hits and compiles killed for memory do not count."""
    path = contract.StepFiles.from_env(os.environ).job_stats
    if not path:
        return None, None
    family, kind = _family(source), kind_of(source)
    by_family = by_kind = None
    try:
        with open(path) as fh:
            lines = fh.readlines()
    except OSError:
        return None, None
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not (
            isinstance(r, dict)
            and r.get("result") == "compiled"
            and r.get("rc") == 0
            and r.get("where", "local") == "local"
            and isinstance(r.get("rss_kib"), int | float)
        ):
            continue
        unit = str(r.get("source") or "")
        peak = float(r["rss_kib"]) / 2**20
        if kind_of(unit) == kind:
            by_kind = max(by_kind or 0.0, peak)
            if _family(unit) == family:
                by_family = max(by_family or 0.0, peak)
    margin = IN_BUILD_MARGIN
    return (
        None if by_family is None else round(by_family * margin, 3),
        None if by_kind is None else round(by_kind * margin, 3),
    )


def _kind_hint(source: str) -> float | None:
    """The largest learned reservation of ``source``'s kind in this step (None: none)."""
    kinds = learned_hints().get("kinds")
    entry = kinds.get(kind_of(source)) if isinstance(kinds, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("mem_gib"), int | float):
        return float(entry["mem_gib"])
    return None


def mem_per_compile(source: str | None) -> float:
    """What this compile reserves (with its nvcc threads, over its process tree), from
    the most particular figure there is: its own learned peak times the margin, else its
    family's (learned, else the heaviest of its family that finished in this build).
    A unit of a family nothing was seen of reserves the recipe's guess
    (``KILN_GATE_MEM_GIB``), or less where the heaviest of its kind (learned, or finished
    in this build) took less: both are upper estimates, and one outlier of a kind (a
    CUTLASS FMHA unit's 9 GiB beside units of 1-2) must not stand in for every unit of
    it (a cold build ran one compile at a time on 2 cores that way). What a guess misses
    the gate sees as the compile grows (its live figure), and a compile the kernel kills
    is compiled again alone."""
    guess = contract.StepFiles.from_env(os.environ).gate_mem_gib
    if not source:
        return guess
    learned = _unit_hint(source, "mem_gib")
    if learned is not None:
        return learned
    family_here, kind_here = peaks_here(source)
    if family_here is not None:
        return family_here
    kinds = [k for k in (_kind_hint(source), kind_here) if k is not None]
    return min(guess, max(kinds)) if kinds and guess > 0 else (max(kinds) if kinds else guess)


def from_environment(
    source: str | None = None,
    priority: float = 0.0,
    remote_ok: bool = False,
    threads: int = 1,
    alone: bool = False,
) -> contextlib.AbstractContextManager[Held]:
    """The slot this compile needs, from the step's environment: ``threads`` CPU slots
    (nvcc's ``--threads`` for this unit; 1 for anything else) and its memory
    (:func:`mem_per_compile`); ``alone``: by itself (killed for memory once). Outside
    kiln's builds (e.g. ``rebuild.py`` on an installed tree) no slot: ``Held(None)``."""
    gate = contract.StepFiles.from_env(os.environ).gate_dir
    if not gate or not (Path(gate) / "budget.json").is_file():
        return contextlib.nullcontext(Held(None))
    threads = max(threads, 1)
    tree = dict(compileflags.env_roots()).get("TREE", "")
    return slot(
        Path(gate),
        mem_per_compile(source),
        threads,
        priority,
        remote_ok,
        unit_estimate(source),
        tree,
        alone,
    )
