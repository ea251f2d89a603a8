"""The build plan: how many compile jobs each step gets and how much memory the
whole run may use.

Parallelism is sized from memory, not cores. Every memory figure is per compile, with
its nvcc threads, over its whole process tree (what the compiler wrapper measures:
``kiln/inside/kit/treemem.py``). Each step has an estimated peak per compile: the
measured peak for the same recipe and archs (times a margin) when kiln has learned one
(this cache's ``peaks.json``, or another build's learned data:
``kiln/orchestrate/learned.py``), else the recipe's ``mem_per_job_gib``. The run's budget is
the memory available now minus a safety margin (``--mem-budget`` overrides) and its CPU
slots the cores (``--jobs`` overrides). Every independent step starts at once with
``MAX_JOBS`` up to the compiles it can get at one moment (its units, the CPU slots, the
memory for its lightest unit); the compile gate (``kiln/inside/kit/compilegate.py``)
then admits compiles from all steps only while their estimates fit the budget, so the
sum never exceeds it and no core idles while one step is still compiling.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

from kiln import fsutil
from kiln.config.models import Vendor
from kiln.errors import ConfigError
from kiln.inside.kit.compileflags import SOURCE_SUFFIXES
from kiln.plan.cpus import cpu_slots
from kiln.plan.jobs import JobLine


class LearnedEntry(TypedDict, total=False):
    """What the store knows of one vendor's recipe (the manifest's ``learned``:
    kiln.release.manifest.LearnedVendor reads it)."""

    recipe: str
    archs: list[str]
    peak_job_gib: float
    tail_cpu_s: float
    units: dict[str, dict[str, float]]  # per unit: cpu_s, rss_gib
    memory: str  # "tree": per compile over its process tree; absent: its largest process


class UnitHint(TypedDict):
    cpu_s: float
    mem_gib: float


class GateHints(TypedDict):
    """What the compile gate reads of one step's units (``KILN_GATE_HINTS``)."""

    units: dict[str, UnitHint]
    families: dict[str, UnitHint]
    kinds: dict[str, UnitHint]  # by suffix: never one kind's figures for another kind
    default_cpu_s: float
    tail_cpu_s: float


class JobSummary(TypedDict):
    """One step's compiles summed (the manifest's schedule fields of the same names)."""

    compiles: int
    compiles_remote: int
    objcache_hits: int
    cache_hits: int
    oom_reruns: int
    compile_cpu_s: float
    compile_wall_s: float
    gate_wait_s: float
    peak_job_gib: float


GIB = 1024**3
SAFETY_MARGIN_GIB = 1.0  # for kiln itself, the page cache and whatever else runs
SAFETY_FRACTION = 0.10
LEARNED_MARGIN = 1.25  # measured peaks vary between runs of the same compile
TREE = "tree"  # LearnedEntry.memory: what this kiln measures (per compile, its process tree)
FAR_OFF = 2.0  # a recipe's memory figure this many times off what was measured is said


@dataclass(frozen=True)
class Budget:
    mem_gib: float
    cpus: int
    source: str  # "available memory" or "--mem-budget"
    cpus_from: str = "affinity"  # what bounds the CPU slots (plan.cpus)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def available_gib() -> float:
    """MemAvailable, or the cgroup's limit minus its usage when that is smaller (a
    container that sees the host's /proc/meminfo)."""
    avail = None
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    cg = Path("/sys/fs/cgroup")
    try:
        limit = (cg / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cg / "memory.current").read_text())
            room = int(limit) - used
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return (avail or 0) / GIB


def make_budget(mem_budget_gib: float | None, jobs: int | None) -> Budget:
    if mem_budget_gib is not None and mem_budget_gib <= 0:
        raise ConfigError(f"--mem-budget {mem_budget_gib}: must be a positive number of GiB")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs {jobs}: must be 1 or more")
    slots = cpu_slots(jobs)
    if mem_budget_gib is not None:
        return Budget(round(mem_budget_gib, 3), slots.count, "--mem-budget", slots.source)
    avail = available_gib()
    margin = max(SAFETY_MARGIN_GIB, avail * SAFETY_FRACTION)
    mem = round(max(avail - margin, 0.0), 3)
    return Budget(mem, slots.count, "available memory minus margin", slots.source)


# Recipe keys that change nothing a compile uses: the memory guess itself (a fix of it
# must not forget what was measured) and what only the import proof reads.
NOT_COMPILED = {"mem_per_job_gib", "import_proof", "import_check"}


def recipe_fingerprint(vendor: Vendor) -> str:
    """What a learned peak belongs to: the recipe (flags, archs, env), nothing else."""
    text = json.dumps(vendor.build.model_dump(mode="json", exclude=NOT_COMPILED), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Measured:
    """What one step's compiles measured, for the next run's plan: the peak per compile
    job (None: no real compile, only the links' time), each unit's figures, and the
    CPU seconds of its non-compiles."""

    peak_job_gib: float | None
    units: dict[str, dict[str, float]] | None = None
    tail_cpu_s: float | None = None


class PeakStore:
    """Measured peak RSS per compile job, per vendor and recipe (``peaks.json`` in
    kiln's cache), so the next run plans from what the last one used; and per
    translation unit its CPU seconds and peak RSS, which the compile gate uses to start
    the longest units first and to reserve each unit's own memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.changed = False  # saved only then: a run that learned nothing writes nothing
        self.touched: set[str] = set()  # the vendors this run learned about
        try:
            self.data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}

    def entry(self, vendor: Vendor) -> LearnedEntry | None:
        """What is learned of ``vendor``'s current recipe (None: nothing). The file is
        JSON kiln wrote; each figure is still checked where it is read."""
        entry = self.data.get(vendor.name)
        if isinstance(entry, dict) and entry.get("recipe") == recipe_fingerprint(vendor):
            return per_compile(cast(LearnedEntry, entry), vendor)
        return None

    def adopt(
        self, entries: Mapping[str, LearnedEntry], vendors: list[Vendor], override: bool
    ) -> list[str]:
        """Take another build's learned data (``kiln/orchestrate/learned.py``) for the vendors
        whose recipe it was learned with: in place of this cache's own entry where
        ``override`` (``--learned-from``, asked for by name), else only where this cache
        knows nothing of that recipe (the workspace's ``learned.json``). Returns the
        vendors taken. Not saved by itself: a build that measures anew saves the union."""
        taken = []
        for vendor in vendors:
            entry = entries.get(vendor.name)
            if not entry or entry.get("recipe") != recipe_fingerprint(vendor):
                continue
            if override or self.entry(vendor) is None:
                self.data[vendor.name] = json.loads(json.dumps(entry))  # a copy
                taken.append(vendor.name)
        return taken

    def learned(self, vendor: Vendor) -> float | None:
        entry = self.entry(vendor)
        if entry is not None:
            peak = entry.get("peak_job_gib")
            return float(peak) if isinstance(peak, int | float) and peak > 0 else None
        return None

    def units(self, vendor: Vendor) -> dict[str, dict[str, float]]:
        """Per translation unit (its path in the tree): learned ``cpu_s`` and ``rss_gib``."""
        entry = self.entry(vendor)
        units = entry.get("units") if entry is not None else None
        return units if isinstance(units, dict) else {}

    def tail(self, vendor: Vendor) -> float:
        """The learned CPU seconds of the step's non-compiles (its links): what must
        still run once its last compile is done."""
        entry = self.entry(vendor)
        tail = entry.get("tail_cpu_s") if entry is not None else None
        return float(tail) if isinstance(tail, int | float) else 0.0

    def merged(self, vendor: Vendor, measured: Measured) -> LearnedEntry | None:
        """The entry ``vendor`` would have with ``measured`` taken in (the store itself
        unchanged): what a step reports in its manifest before the pipeline merges it."""
        entry = self.entry(vendor)
        if measured.peak_job_gib is None or measured.peak_job_gib <= 0:
            if entry is None or measured.tail_cpu_s is None:
                return entry
            return {**entry, "tail_cpu_s": round(measured.tail_cpu_s, 1)}
        # The larger of this and the last peak of the same recipe: one run may have
        # compiled only the light files (the rest were cache hits).
        peak_job_gib = max(measured.peak_job_gib, self.learned(vendor) or 0.0)
        known = {**self.units(vendor), **(measured.units or {})}
        tail = self.tail(vendor) if measured.tail_cpu_s is None else measured.tail_cpu_s
        return {
            "recipe": recipe_fingerprint(vendor),
            "archs": list(vendor.build.archs),
            "peak_job_gib": round(peak_job_gib, 3),
            "tail_cpu_s": round(tail, 1),
            "units": dict(sorted(known.items())),
            "memory": TREE,
        }

    def merge(self, vendor: Vendor, measured: Measured) -> None:
        """Take in what one step measured. Called by the pipeline alone, once the steps
        are done (the steps read the store while they run; none writes it)."""
        after = self.merged(vendor, measured)
        if after is None or after == self.data.get(vendor.name):
            return
        self.data[vendor.name] = after
        self.changed = True
        self.touched.add(vendor.name)

    def remember(
        self,
        vendor: Vendor,
        peak_job_gib: float,
        units: dict[str, dict[str, float]] | None = None,
        tail_cpu_s: float | None = None,
    ) -> None:
        if peak_job_gib > 0:
            self.merge(vendor, Measured(peak_job_gib, units, tail_cpu_s))

    def remember_tail(self, vendor: Vendor, tail_cpu_s: float) -> None:
        """A run whose compiles were all cache hits still ran its links: their time is
        learned from it too (where this recipe has an entry)."""
        self.merge(vendor, Measured(None, None, tail_cpu_s))

    def save(self) -> None:
        """Write what this run learned, merged into the file as it is now: builds from
        other checkouts that share the cache save theirs too (under the file's lock, each
        reading the other's), so no vendor's figures are lost to a later writer."""
        if not self.changed:
            return
        with fsutil.making(self.path, "the learned compile figures"):
            try:
                now = json.loads(self.path.read_text())
            except (OSError, ValueError):
                now = {}
            if not isinstance(now, dict):
                now = {}
            now.update({name: self.data[name] for name in self.touched if name in self.data})
            fsutil.write_atomic(self.path, json.dumps(now, indent=1, sort_keys=True))
            self.data = now


def recipe_threads(vendor: Vendor) -> int:
    """The most nvcc threads a unit of this recipe runs with (its cap, at most its archs)."""
    b = vendor.build
    return max(1, min(b.nvcc_threads or 1, max(len(b.archs), 1)))


def per_compile(entry: LearnedEntry, vendor: Vendor) -> LearnedEntry:
    """``entry`` with its memory figures per compile: an older kiln recorded each
    compile's largest process (one of the ``cicc`` its nvcc threads run side by side), so
    its CUDA units' figures are taken times the recipe's threads, the safe side; an
    entry this kiln wrote is as it is."""
    if entry.get("memory") == TREE:
        return entry
    threads = recipe_threads(vendor)
    units = {
        src: {**u, "rss_gib": round(float(u.get("rss_gib", 0.0)) * threads, 3)}
        if src.endswith(".cu") and isinstance(u, dict)
        else u
        for src, u in (entry.get("units") or {}).items()
    }
    peak = entry.get("peak_job_gib")
    out: LearnedEntry = {**entry, "units": units, "memory": TREE}
    if isinstance(peak, int | float):
        out["peak_job_gib"] = round(float(peak) * threads, 3)
    return out


def recipe_guess(vendor: Vendor, threads: int | None) -> float:
    """What a unit of a kind nothing was seen or learned of reserves at the gate: the
    recipe's ``mem_per_job_gib`` (per compile at its threads) at the threads chosen."""
    return at_threads(vendor, vendor.build.mem_per_job_gib, threads)


def far_off_note(vendor: Vendor, stats: list[JobLine]) -> str | None:
    """One sentence where the recipe's ``mem_per_job_gib`` is far (``FAR_OFF`` times) from
    what this step's compiles measured per compile (None: near enough, or nothing
    measured): the measured value, the unit, and the line that matches it."""
    compiled = [
        s for s in stats if s.get("result") == "compiled" and s.get("rc") == 0 and s.get("rss_kib")
    ]
    if not compiled:
        return None
    top = max(compiled, key=lambda s: s.get("rss_kib", 0))
    measured = top.get("rss_kib", 0) / 2**20
    figure = vendor.build.mem_per_job_gib
    # the recipe's figure at the threads its units ran with (one, on a small machine)
    ran_at = max((s.get("threads", 1) for s in compiled), default=1)
    if vendor.build.nvcc_threads and ran_at < recipe_threads(vendor):
        return None  # its compiles ran with fewer threads than the figure counts
    if measured <= 0 or (figure <= measured * FAR_OFF and measured <= figure * FAR_OFF):
        return None
    suggested = max(round(measured * LEARNED_MARGIN * 4) / 4, 0.25)
    return (
        f"{vendor.name}: build.mem_per_job_gib = {figure:g} GiB per compile, but its "
        f"compiles took at most {measured:.2f} GiB ({top.get('source') or 'a compile'}, "
        f"over its process tree); `mem_per_job_gib = {suggested:g}` in "
        f"vendors/{vendor.name}.toml plans a first build by it (what was measured is "
        f"learned and planned from already)"
    )


@dataclass(frozen=True)
class Choice:
    """What the scheduler chose for one step (recorded in the manifest)."""

    max_jobs: int
    nvcc_threads: int | None  # None: the recipe does not let kiln set NVCC_THREADS
    mem_per_job_gib: float  # the estimate per compile, with its nvcc threads
    estimate_source: str  # "recipe" or "learned"
    gate_mem_gib: float  # what the step's heaviest compile reserves in the gate
    translation_units: int

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def count_translation_units(tree: Path) -> int:
    skip = {".git", ".kiln", "build", "dist"}
    n = 0
    for _root, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d not in skip]
        n += sum(1 for f in files if f.endswith(SOURCE_SUFFIXES))
    return n


def estimate(vendor: Vendor, peaks: PeakStore) -> tuple[float, str]:
    learned = peaks.learned(vendor)
    if learned is not None:
        return round(learned * LEARNED_MARGIN, 3), "learned"
    return vendor.build.mem_per_job_gib, "recipe"


def at_threads(vendor: Vendor, per_job: float, threads: int | None) -> float:
    """A per-compile figure (taken at the recipe's threads) for compiles run with
    ``threads``: each nvcc thread runs a cicc of its own, so its share of them."""
    full = recipe_threads(vendor)
    return round(per_job * max(threads or full, 1) / full, 3)


def check_fits(vendors: list[Vendor], peaks: PeakStore, budget: Budget) -> None:
    """Before anything starts: every step must be able to run one compile, at the fewest
    nvcc threads kiln may give it (one, where the recipe lets kiln set them)."""
    for v in vendors:
        per_job, source = estimate(v, peaks)
        least = at_threads(v, per_job, 1) if v.build.nvcc_threads else per_job
        if least > budget.mem_gib:
            # the recipe's figure plans only where nothing was learned: a fix naming it
            # for a learned estimate would change nothing (issue 54 (4))
            lower = (
                "(measured by an earlier build of this recipe, over each compile's process "
                "tree: it is what one compile took)"
                if source == "learned"
                else f"or lower build.mem_per_job_gib in vendors/{v.name}.toml if the "
                f"estimate is too high"
            )
            raise ConfigError(
                f"{v.name}: one compile needs an estimated {least:g} GiB ({source}), "
                f"more than the memory budget of {budget.mem_gib:g} GiB ({budget.source}): "
                f"raise --mem-budget, free memory, {lower}"
            )


def step_slots(budget: Budget, lightest_gib: float, remote_slots: int = 0, threads: int = 1) -> int:
    """The most compiles one step can get at one moment: the run's CPU slots (a step
    alone gets them all) over the CPU slots one compile holds (its nvcc ``threads``),
    fewer where the memory budget holds fewer of its lightest compile (per compile, with
    its threads), plus the build servers' slots (sccache-dist: no local CPU or memory).

    Why not more: ninja offers MAX_JOBS units in its order (longest first) and they
    reach the gate within a second, in no set order; the first to arrive take the free
    slots. Offered 16 on 16 CPUs with 2 threads each, 8 ran and the second-longest unit
    (137 s) lost the race to small ones, started 27 s late and ended 16 s after the
    longest: the build's wall (docs/performance.md)."""
    threads = max(threads, 1)
    by_cpu = max(budget.cpus // threads, 1)
    by_mem = int(budget.mem_gib // lightest_gib) if lightest_gib > 0 else by_cpu
    return max(1, min(by_cpu, by_mem)) + max(remote_slots, 0)


def nvcc_threads(vendor: Vendor, per_job: float, budget: Budget) -> int | None:
    """NVCC_THREADS for a recipe that lets kiln set it: the recipe's cap, no more than its
    archs (nvcc's threads compile the targets of one unit side by side). Each unit then
    runs with no more than its own targets (the compiler wrapper lowers ``--threads``
    per unit) and reserves that many CPU slots at the gate: the figure depends on the
    recipe and the unit alone, never on this machine's cores, so compiler-cache keys are
    the same on every builder; one thread only where one compile at the recipe's threads
    (``per_job``, per compile) would not fit the memory budget at all."""
    if vendor.build.nvcc_threads is None:
        return None
    threads = recipe_threads(vendor)
    return 1 if per_job > budget.mem_gib else threads


def choose(
    vendor: Vendor,
    tree: Path,
    peaks: PeakStore,
    budget: Budget,
    remote_slots: int = 0,
    units: int | None = None,
) -> Choice:
    """MAX_JOBS and NVCC_THREADS for one step. ``max_jobs``/``nvcc_threads`` in the
    recipe are caps (an upstream that breaks with more), not the choice.

    MAX_JOBS is what the step offers at once: never more than it could run at one
    moment (``step_slots``), since a compile waiting at the gate is a process holding
    memory the budget does not count, and a step handed 128 on 16 CPUs says nothing
    true. Which units go first is the gate's choice between steps, and within a ninja
    build the kit's ``ninja`` (``kiln/inside/kit/ninjaorder.py``: learned units longest
    first), so a step needs no queue of waiting compiles for the order.

    ``units``: the step's units where the tree is not there to count (the dry run counts
    them in the pinned commit); with none known (nothing learned, no tree, no count),
    MAX_JOBS is what the slots allow, as the build's would be for as many units."""
    b = vendor.build
    per_job, source = estimate(vendor, peaks)
    learned_units = peaks.units(vendor)
    known = bool(learned_units) or units is not None or tree.is_dir()
    if learned_units:
        tus = len(learned_units)
    else:
        tus = units if units is not None else count_translation_units(tree)
    threads = nvcc_threads(vendor, per_job, budget)
    per_job = at_threads(vendor, per_job, threads)
    lightest = min(
        (
            float(u["rss_gib"]) * LEARNED_MARGIN
            for u in learned_units.values()
            if isinstance(u, dict) and isinstance(u.get("rss_gib"), int | float) and u["rss_gib"]
        ),
        default=per_job,
    )
    slots = step_slots(budget, lightest, remote_slots, threads or 1)
    jobs = max(1, min(max(tus, 1) if known else slots, slots, b.max_jobs or slots))
    return Choice(jobs, threads, per_job, source, round(per_job, 3), tus)


def family(source: str) -> str:
    """A unit's family: the units of its folder with its suffix (``csrc/x/*.cu``). A unit
    the learned data does not name (a new file) is planned from its family's figures."""
    return f"{posixpath.dirname(source)}/*{posixpath.splitext(source)[1]}"


def _grouped(out: dict[str, UnitHint], key: Callable[[str], str]) -> dict[str, UnitHint]:
    """The units' hints by ``key``: the mean CPU time and the largest reservation."""
    grouped: dict[str, list[UnitHint]] = {}
    for src, u in out.items():
        grouped.setdefault(key(src), []).append(u)
    return {
        name: UnitHint(
            cpu_s=round(sum(u["cpu_s"] for u in members) / len(members), 3),
            mem_gib=max(u["mem_gib"] for u in members),
        )
        for name, members in sorted(grouped.items())
    }


def kind(source: str) -> str:
    """A unit's kind: its suffix (the compile gate's ``kind_of``)."""
    return posixpath.splitext(source)[1]


def gate_hints(vendor: Vendor, peaks: PeakStore) -> GateHints:
    """What the compile gate learns of this step's units (``KILN_GATE_HINTS``): per unit
    its CPU seconds and memory to reserve per compile (its learned peak over its process
    tree, nvcc threads included, times a margin); per family (``family``) and per kind
    (its suffix) the mean CPU time and the largest reservation of its learned units, for
    units without figures of their own (a kind nothing was learned of gets the recipe's
    guess: a step's C++ figures never stand in for its CUDA units); then the mean CPU
    time of all known units. ``tail_cpu_s``, the step's learned links, is added to each
    unit's priority: the longest path from a compile to its step's end, as
    critical-path list scheduling ranks jobs, so a step with a long link finishes its
    compiles early enough for that link to run beside other steps' compiles instead of
    alone at the end (a 12 s link after another step's last 7 s unit:
    docs/performance.md)."""
    units = peaks.units(vendor)
    out = {
        src: UnitHint(
            cpu_s=round(float(u.get("cpu_s", 0.0)), 3),
            mem_gib=round(float(u.get("rss_gib", 0.0)) * LEARNED_MARGIN, 3),
        )
        for src, u in units.items()
        if isinstance(u, dict) and u.get("rss_gib")
    }
    mean = sum(u["cpu_s"] for u in out.values()) / len(out) if out else 0.0
    return {
        "units": out,
        "families": _grouped(out, family),
        "kinds": _grouped(out, kind),
        "default_cpu_s": round(mean, 3),
        "tail_cpu_s": peaks.tail(vendor),
    }


def learned_units(stats: list[JobLine]) -> dict[str, dict[str, float]]:
    """Per unit, from one step's compiles: CPU seconds and peak RSS (GiB)."""
    out: dict[str, dict[str, float]] = {}
    for s in stats:
        source = s.get("source")
        if s.get("result") != "compiled" or s.get("rc") != 0 or not source:
            continue
        out[source] = {
            "cpu_s": round(float(s.get("cpu_s", 0.0)), 3),
            "rss_gib": round(float(s.get("rss_kib", 0)) / 2**20, 3),
        }
    return out


def learned_tail(stats: list[JobLine]) -> float:
    """CPU seconds of the step's compiler runs that are not compiles (links)."""
    return round(
        sum(
            float(s.get("cpu_s", 0.0))
            for s in stats
            if s.get("result") == "other" and s.get("rc") == 0
        ),
        3,
    )


def most_at_once(stats: list[JobLine]) -> int:
    """The most compiles that ran on this machine at the same moment (from their start and
    wall time; those the gate sent to build servers are not counted)."""
    events = []
    for s in stats:
        here = s.get("where") != "remote"
        if s.get("result") == "compiled" and here and isinstance(s.get("start"), int | float):
            events += [(s["start"], 1), (s["start"] + float(s.get("wall_s", 0.0)), -1)]
    most = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


def summarize_jobs(stats: list[JobLine]) -> JobSummary:
    compiled = [s for s in stats if s.get("result") == "compiled"]
    return {
        "compiles": len(compiled),
        # where kiln's gate sent them: build servers (sccache-dist), the rest ran here
        "compiles_remote": sum(1 for s in compiled if s.get("where") == "remote"),
        "objcache_hits": sum(1 for s in stats if s.get("result") == "objcache-hit"),
        # the compiler cache's (ccache) answers, per compile: a hit compiled nothing
        "cache_hits": sum(1 for s in stats if s.get("result") == "cache-hit"),
        # compiles the kernel killed for memory, compiled again alone
        "oom_reruns": sum(1 for s in stats if s.get("result") == "oom-killed"),
        "compile_cpu_s": round(sum(s.get("cpu_s", 0.0) for s in compiled), 3),
        "compile_wall_s": round(sum(s.get("wall_s", 0.0) for s in compiled), 3),
        "gate_wait_s": round(sum(s.get("waited_s", 0.0) for s in stats), 3),
        "peak_job_gib": round(max((s.get("rss_kib", 0) for s in compiled), default=0) / 2**20, 3),
    }
