"""A build's records, read from its logs folder into one timeline.

What a build leaves in ``<artifacts>/logs/<release>/``:

- ``<vendor>.jobs``: one JSON line per compiler run (``inside/kit/objcache.py``'s
  ``_record``): its start after the gate's wait, wall and CPU time, peak memory, where it
  ran, its nvcc threads;
- ``<vendor>.phases``: one JSON line per timed block of the step (``orchestrate.context.timed``:
  fetch, patch, build, package, verify, each with its start and end);
- ``memory.jsonl``: kiln's process tree's memory, sampled while the vendors built;

and the release's ``manifest.json`` (beside the logs folder: ``<artifacts>/<release>/``)
says which vendors this run built (an artifact-cache hit leaves an older ``.jobs`` behind),
the memory budget, the CPU slots and each step's phase durations. A build older than the
phase and memory records still makes a timeline: its phases laid end to end from the
manifest's durations (marked estimated), no sampled memory; ``Timeline.notes`` says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.errors import TimingsError
from kiln.plan import bound
from kiln.plan.jobs import JobLine
from kiln.release import manifest as manifest_io

MEMORY_SERIES = "memory.jsonl"  # written by orchestrate.pipeline's sampler
# the run's memory budget and CPU slots (orchestrate.pipeline writes it)
BUDGET_FILE = "budget.json"
# The build's own phase before its first step (loading, the toolchain, the build venv):
# one JSON line {"phase": "provision", "start", "end"} the pipeline writes as the steps
# start; drawn on a row of its own, named so that no vendor can be called the same.
PROVISION_FILE = "provision.phases"
PROVISION_ROW = "(provisioning)"
PHASES = ("fetch", "patch", "build", "package", "verify")
# A compile the kernel killed for memory ran (drawn as a compile); a compiler cache's
# hit compiled nothing (drawn as a hit, as the object cache's).
KINDS = {
    "compiled": "compile",
    "oom-killed": "compile",
    "other": "link",
    "objcache-hit": "hit",
    "cache-hit": "hit",
}


@dataclass(frozen=True)
class Unit:
    """One compiler run: a compile, a link (any run that is not a compile) or an object
    cache hit (no compiler ran)."""

    vendor: str
    source: str  # tree-relative; "" for links
    kind: str  # compile | link | hit
    where: str  # local | remote
    start: float  # epoch seconds, after the gate's wait
    wall_s: float
    cpu_s: float
    rss_gib: float
    waited_s: float
    threads: int
    compiler: str
    rc: int

    @property
    def end(self) -> float:
        return self.start + self.wall_s

    @property
    def label(self) -> str:
        return self.source or f"{self.compiler} ({self.kind})"


@dataclass(frozen=True)
class Phase:
    vendor: str
    name: str
    start: float
    end: float
    estimated: bool = False  # laid end to end from the manifest's durations


@dataclass
class Timeline:
    title: str
    vendors: list[str]
    units: list[Unit]
    phases: list[Phase]
    memory: list[tuple[float, float]]  # (epoch seconds, GiB) sampled
    mem_budget_gib: float | None
    cpus: int | None
    critical: bound.BoundFigures | None  # plan.bound's bound: critical_vendor, critical_unit...
    reused: list[str] = field(default_factory=list)  # artifact-cache hits: nothing ran
    notes: list[str] = field(default_factory=list)  # what is missing, how it degraded
    # the steps that failed: (vendor, its first error, the cause) from <vendor>.failure.json
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def start(self) -> float:
        times = [u.start for u in self.units] + [p.start for p in self.phases]
        return min(times + [t for t, _ in self.memory], default=0.0)

    @property
    def end(self) -> float:
        times = [u.end for u in self.units] + [p.end for p in self.phases]
        return max(times + [t for t, _ in self.memory], default=0.0)

    def compiles(self) -> list[Unit]:
        return [u for u in self.units if u.kind == "compile"]

    def build_phase(self, vendor: str) -> Phase | None:
        found = [p for p in self.phases if p.vendor == vendor and p.name == "build"]
        if not found:
            return None
        return Phase(vendor, "build", min(p.start for p in found), max(p.end for p in found))


def _number(record: Mapping[str, object], key: str, default: float | None = None) -> float:
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key}: {value!r} is not a number")
    return float(value)


def unit(vendor: str, record: Any) -> Unit:
    """One ``.jobs`` line as a :class:`Unit`; ValueError names what is wrong with it."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    kind = KINDS.get(record.get("result", ""))
    if kind is None:
        raise ValueError(f"result: {record.get('result')!r} unknown")
    start, wall = _number(record, "start"), _number(record, "wall_s", 0.0)
    cpu, waited = _number(record, "cpu_s", 0.0), _number(record, "waited_s", 0.0)
    rss = _number(record, "rss_kib", 0)
    threads = _number(record, "threads", 1)
    for name, value in (("wall_s", wall), ("cpu_s", cpu), ("waited_s", waited), ("rss_kib", rss)):
        if value < 0:
            raise ValueError(f"{name}: {value} is negative")
    if threads < 1:
        raise ValueError(f"threads: {threads} is less than 1")
    return Unit(
        vendor=vendor,
        source=str(record.get("source") or ""),
        kind=kind,
        where="remote" if record.get("where") == "remote" else "local",
        start=start,
        wall_s=wall,
        cpu_s=cpu,
        rss_gib=rss / 2**20,
        waited_s=waited,
        threads=int(threads),
        compiler=str(record.get("compiler") or "compiler"),
        rc=int(_number(record, "rc", 0)),
    )


def _lines(path: Path) -> tuple[list[Any], int]:
    """The JSON values of a JSON-lines file, and how many lines were not JSON."""
    values, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except ValueError:
            bad += 1
    return values, bad


def units_of(path: Path, vendor: str, notes: list[str]) -> list[Unit]:
    """A ``.jobs`` file's runs; lines that are not JSON or not a run are skipped (as
    ``plan.jobs.job_stats`` skips them) and counted in ``notes``."""
    values, bad = _lines(path)
    out, reasons = [], []
    for value in values:
        try:
            out.append(unit(vendor, value))
        except ValueError as exc:
            reasons.append(str(exc))
    if bad or reasons:
        first = f" (first: {reasons[0]})" if reasons else ""
        notes.append(
            f"{path.name}: {bad + len(reasons)} line(s) skipped, not a compiler run{first}"
        )
    return out


def phases_of(path: Path, vendor: str) -> list[Phase]:
    values, _ = _lines(path)
    out = []
    for v in values:
        try:
            start, end = _number(v, "start"), _number(v, "end")
        except (ValueError, AttributeError):
            continue
        if isinstance(v.get("phase"), str) and end >= start:
            out.append(Phase(vendor, v["phase"], start, end))
    return out


def estimated_phases(vendor: str, timings: dict[str, float], units: list[Unit]) -> list[Phase]:
    """Phases from the manifest's durations alone, laid end to end around the step's
    compiler runs: the build phase ends with its last run and lasts its duration (at least
    from its first run's gate wait), fetch and patch before it, package and verify after."""
    if not units:
        return []
    first = min(u.start - u.waited_s for u in units)
    last = max(u.end for u in units)
    build_start = min(first, last - float(timings.get("build", 0.0)))
    out: list[Phase] = []
    t = build_start
    for name in ("patch", "fetch"):
        took = float(timings.get(name, 0.0))
        out.insert(0, Phase(vendor, name, t - took, t, True))
        t -= took
    out.append(Phase(vendor, "build", build_start, last, True))
    t = last
    for name in ("package", "verify"):
        took = float(timings.get(name, 0.0))
        out.append(Phase(vendor, name, t, t + took, True))
        t += took
    return out


def memory_of(path: Path) -> list[tuple[float, float]]:
    if not path.is_file():
        return []
    values, _ = _lines(path)
    out = []
    for v in values:
        try:
            out.append((_number(v, "t"), _number(v, "rss_gib")))
        except (ValueError, AttributeError):
            continue
    return sorted(out)


def locate(path: Path) -> tuple[Path, Path | None]:
    """(the logs folder, the release's manifest or None) from either: a release's logs
    folder (``<artifacts>/logs/<release>``) or its release folder (``<artifacts>/<release>``)."""
    if not path.is_dir():
        raise TimingsError(f"{path}: no such folder: give a build's logs folder or its release")
    if (path / manifest_io.FILE_NAME).is_file() and not list(path.glob("*.jobs")):
        logs = path.parent / "logs" / path.name
        return logs, path / manifest_io.FILE_NAME
    release = path.parent.parent / path.name / manifest_io.FILE_NAME
    return path, release if release.is_file() else None


def load(
    logs: Path,
    manifest: Path | None = None,
    *,
    vendors: list[str] | None = None,
    mem_budget_gib: float | None = None,
    cpus: int | None = None,
) -> Timeline:
    """The timeline of the build whose logs are in ``logs``. ``manifest`` (that build's)
    names the vendors it built and its budget; without one (a failed build) the caller
    gives them, else every ``.jobs`` file counts."""
    notes: list[str] = []
    m = manifest_io.read(manifest) if manifest is not None else None
    reused: list[str] = []
    durations: dict[str, dict[str, float]] = {}
    title = logs.name
    if m is not None:
        title = m.release.name
        fresh: list[str] = []
        for name, entry in m.vendors.items():
            art = entry.caches.artifact if entry.caches else None
            (reused if art is not None and art.status == "hit" else fresh).append(name)
            durations[name] = dict(entry.timings)
        vendors = vendors if vendors is not None else fresh
        if m.scheduler is not None:
            mem_budget_gib = m.scheduler.mem_gib if mem_budget_gib is None else mem_budget_gib
            cpus = m.scheduler.cpus if cpus is None else cpus
    if m is None:  # a failed build: no manifest; the budget it ran with, where it wrote it
        budget_mem, budget_cpus = _budget(logs / BUDGET_FILE)
        mem_budget_gib = budget_mem if mem_budget_gib is None else mem_budget_gib
        cpus = budget_cpus if cpus is None else cpus
        if mem_budget_gib is None or cpus is None:
            notes.append(
                f"no manifest and no {BUDGET_FILE}: the memory budget and CPU slots are unknown"
            )
    if vendors is None:
        failed = {p.name.removesuffix(".failure.json") for p in logs.glob("*.failure.json")}
        vendors = sorted({p.stem for p in logs.glob("*.jobs")} | failed)
    failures = failures_of(logs, vendors)
    memory = memory_of(logs / MEMORY_SERIES)
    units: list[Unit] = []
    provision = logs / PROVISION_FILE
    phases: list[Phase] = phases_of(provision, PROVISION_ROW) if provision.is_file() else []
    estimated = []
    built = []
    for vendor in vendors:
        jobs, phase_file = logs / f"{vendor}.jobs", logs / f"{vendor}.phases"
        own = phases_of(phase_file, vendor) if phase_file.is_file() else []
        if own and not any(p.name == "build" for p in own):
            reused.append(vendor)  # fetched, then found in the artifact cache
            phases += own
            continue
        mine = units_of(jobs, vendor, notes) if jobs.is_file() else []
        if memory and mine and max(u.end for u in mine) < memory[0][0]:
            # records of an earlier build (a vendor this run did not build): its sampler
            # had started before any of this run's steps ran
            notes.append(f"{vendor}: its records are an earlier build's: left out")
            continue
        if not own and durations.get(vendor):
            own = estimated_phases(vendor, durations[vendor], mine)
            if own:
                estimated.append(vendor)
        units += mine
        phases += own
        built.append(vendor)
    if not units and not failures:
        raise TimingsError(
            f"{logs}: no compiler records of this build (<vendor>.jobs): give the logs folder "
            f"of a build that compiled (artifacts/logs/<release>)"
        )
    if estimated:
        notes.append(
            f"no phase start times recorded ({', '.join(estimated)}: a build before "
            f"<vendor>.phases): phases drawn from the manifest's durations laid end to end"
        )
    elif not phases:
        notes.append("no phase records and no manifest: phases omitted")
    if not memory:
        notes.append(
            f"no memory series ({MEMORY_SERIES}: a build before it): memory over time is "
            f"estimated from each compile's peak (summed while it ran), not sampled"
        )
    # the build's own figures, as its summary used them: its CPU slots and its wall (the
    # manifest's, else from the first record to the last)
    times = [u.start for u in units] + [p.start for p in phases]
    ends = [u.end for u in units] + [p.end for p in phases]
    wall = (
        m.scheduler.wall_s
        if m is not None and m.scheduler is not None and m.scheduler.wall_s
        else max(ends, default=0.0) - min(times, default=0.0)
    )
    # the part of that wall before the first step (a manifest's; none without one)
    before = (
        m.scheduler.bound.provision_s
        if m is not None and m.scheduler is not None and m.scheduler.bound is not None
        else 0.0
    )
    return Timeline(
        title=title,
        vendors=built,
        units=sorted(units, key=lambda u: (u.start, u.end, u.vendor, u.source)),
        phases=phases,
        memory=memory,
        mem_budget_gib=mem_budget_gib,
        cpus=cpus,
        critical=critical_path(built, units, phases, cpus or 1, wall, before),
        reused=sorted(set(reused)),
        notes=notes,
        failures=failures,
    )


def _budget(path: Path) -> tuple[float | None, int | None]:
    """The memory budget (GiB) and CPU slots a failed build wrote, where it wrote them."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    mem, cpus = data.get("mem_gib"), data.get("cpus")
    return (
        float(mem) if isinstance(mem, int | float) else None,
        cpus if isinstance(cpus, int) else None,
    )


def failures_of(logs: Path, vendors: list[str]) -> list[tuple[str, str, str]]:
    """(vendor, first error, cause) of each step that failed (its failure record)."""
    out = []
    for vendor in vendors:
        try:
            record = json.loads((logs / f"{vendor}.failure.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        errors = record.get("errors") or []
        first = str(errors[0].get("text", "")).splitlines()[0] if errors else ""
        cause = record.get("cause") or {}
        out.append(
            (vendor, first or str(record.get("failed", "failed")), str(cause.get("cause", "")))
        )
    return out


def critical_path(
    vendors: list[str],
    units: list[Unit],
    phases: list[Phase],
    cpus: int,
    wall_s: float,
    provision_s: float = 0.0,
) -> bound.BoundFigures | None:
    """``plan.bound``'s bound, from the same records it reads in a build: the step whose
    longest unit, links and packaging take the longest; with the build's CPU slots and
    wall, so that the CPU floor and what bounds the build are the summary's own."""
    paths = {}
    cpu = 0.0
    for vendor in vendors:
        stats = [
            JobLine(
                result={"compile": "compiled", "link": "other"}.get(u.kind, "objcache-hit"),
                rc=u.rc,
                wall_s=u.wall_s,
                source=u.source,
            )
            for u in units
            if u.vendor == vendor
        ]
        took: dict[str, float] = {}
        for p in phases:
            if p.vendor == vendor:
                took[p.name] = took.get(p.name, 0.0) + p.end - p.start
        paths[vendor] = bound.step_path(stats, took).to_json()
        cpu += sum(u.cpu_s for u in units if u.vendor == vendor and u.kind == "compile")
    return bound.bound(paths, cpu, cpus, wall_s, provision_s)
