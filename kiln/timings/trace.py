"""The timeline as Chrome trace-event JSON (the format Perfetto, ui.perfetto.dev, and
chrome://tracing open; the spec: "Trace Event Format", Google, JSON object form).

- process 1 "compile slots": one thread (track) per lane (``timings.slots``), an ``X``
  (complete) event per compiler run, ``ts``/``dur`` in microseconds from the build's
  first record; its ``args`` hold the record (vendor, unit, kind, where, CPU, memory,
  waited, threads, critical);
- process 2 "steps": one track per vendor, an ``X`` event per phase (fetch, patch,
  build, package, verify; ``args.estimated`` where drawn from durations alone);
- process 3 "compile gate (waits)": each run's wait at the gate as a slice, per step;
- ``C`` (counter) events on process 1: "compiles at once" (compiles, CPU slots held),
  "CPUs used" (each run's CPU seconds over its wall), "waiting at the gate",
  "memory GiB" (sampled in use where recorded, the compiles' peaks summed, the budget);
- ``M`` metadata events naming the processes and threads and ordering the tracks.
"""

from __future__ import annotations

from kiln.timings import series, slots
from kiln.timings.records import PROVISION_ROW, Timeline, Unit

SLOTS_PID, STEPS_PID, GATE_PID = 1, 2, 3


def _us(t: float, t0: float) -> int:
    return round((t - t0) * 1e6)


def is_critical(u: Unit, timeline: Timeline) -> bool:
    """The chain that decides the wall: the critical step's longest unit and the links
    after it (what followed the unit's end). A quick compiler run before it (a g++
    probe of 3 ms at the step's start) is the step's, not the chain's."""
    c = timeline.critical
    if not c or u.vendor != c.get("critical_vendor"):
        return False
    longest = [
        x
        for x in timeline.units
        if x.vendor == u.vendor and x.kind == "compile" and x.source == c.get("critical_unit")
    ]
    if u.kind == "compile":
        return u in longest
    if u.kind != "link":
        return False
    return not longest or u.start >= max(x.end for x in longest) - 0.001


def _meta(pid: int, tid: int | None, name: str, value: object) -> dict[str, object]:
    event: dict[str, object] = {"ph": "M", "pid": pid, "name": name, "args": value}
    if tid is not None:
        event["tid"] = tid
    return event


def build(timeline: Timeline, assigned: list[tuple[Unit, slots.Lane]]) -> dict[str, object]:
    t0 = timeline.start
    lanes = slots.lanes(assigned)
    tid = {lane: i + 1 for i, lane in enumerate(lanes)}
    events: list[dict[str, object]] = [
        _meta(SLOTS_PID, None, "process_name", {"name": "compile slots"}),
        _meta(SLOTS_PID, None, "process_sort_index", {"sort_index": 1}),
        _meta(STEPS_PID, None, "process_name", {"name": "steps"}),
        _meta(STEPS_PID, None, "process_sort_index", {"sort_index": 0}),
        _meta(GATE_PID, None, "process_name", {"name": "compile gate (waits)"}),
        _meta(GATE_PID, None, "process_sort_index", {"sort_index": 2}),
    ]
    for lane, n in tid.items():
        events.append(_meta(SLOTS_PID, n, "thread_name", {"name": lane.name}))
        events.append(_meta(SLOTS_PID, n, "thread_sort_index", {"sort_index": n}))
    rows = timeline.vendors + timeline.reused
    if any(p.vendor == PROVISION_ROW for p in timeline.phases):
        rows = [PROVISION_ROW, *rows]
    for i, vendor in enumerate(rows):
        events.append(_meta(STEPS_PID, i + 1, "thread_name", {"name": vendor}))
    step_tid = {v: i + 1 for i, v in enumerate(rows)}
    for u, lane in assigned:
        events.append(
            {
                "ph": "X",
                "pid": SLOTS_PID,
                "tid": tid[lane],
                "name": u.label,
                "cat": f"{u.kind},{u.where},{u.vendor}",
                "ts": _us(u.start, t0),
                "dur": max(_us(u.end, t0) - _us(u.start, t0), 0),
                "args": {
                    "vendor": u.vendor,
                    "unit": u.source,
                    "kind": u.kind,
                    "where": u.where,
                    "compiler": u.compiler,
                    "rc": u.rc,
                    "wall_s": round(u.wall_s, 3),
                    "cpu_s": round(u.cpu_s, 3),
                    "peak_gib": round(u.rss_gib, 3),
                    "waited_s": round(u.waited_s, 3),
                    "threads": u.threads,
                    "start_epoch": u.start,
                    "critical": is_critical(u, timeline),
                },
            }
        )
    # gate waits as slices: per step, each run's wait from its wrapper's start to its
    # compiler's (on tracks of their own: a wait overlaps the runs it waited for)
    gate_tracks: dict[str, list[float]] = {}
    for u in sorted(timeline.units, key=lambda x: x.start - x.waited_s):
        if u.waited_s <= 0:
            continue
        ends = gate_tracks.setdefault(u.vendor, [])
        free = next((i for i, e in enumerate(ends) if e <= u.start - u.waited_s), None)
        if free is None:
            ends.append(u.start)
            free = len(ends) - 1
        ends[free] = u.start
        events.append(
            {
                "ph": "X",
                "pid": GATE_PID,
                "tid": (list(gate_tracks).index(u.vendor) + 1) * 1000 + free,
                "name": f"waiting: {u.label}",
                "cat": f"gate,{u.vendor}",
                "ts": _us(u.start - u.waited_s, t0),
                "dur": max(_us(u.start, t0) - _us(u.start - u.waited_s, t0), 0),
                "args": {"vendor": u.vendor, "unit": u.source, "waited_s": round(u.waited_s, 3)},
            }
        )
    for vendor, ends in gate_tracks.items():
        for i in range(len(ends)):
            tid_gate = (list(gate_tracks).index(vendor) + 1) * 1000 + i
            events.append(
                _meta(GATE_PID, tid_gate, "thread_name", {"name": f"{vendor} wait {i + 1}"})
            )
    for t, n in series.waiting(timeline.units):
        events.append(
            {
                "ph": "C",
                "pid": SLOTS_PID,
                "name": "waiting at the gate",
                "ts": _us(t, t0),
                "args": {"compiles waiting": n},
            }
        )
    for t, used in series.cpu_used(timeline.units):
        events.append(
            {
                "ph": "C",
                "pid": SLOTS_PID,
                "name": "CPUs used",
                "ts": _us(t, t0),
                "args": {"CPUs used": used},
            }
        )
    for p in timeline.phases:
        events.append(
            {
                "ph": "X",
                "pid": STEPS_PID,
                "tid": step_tid.get(p.vendor, 0),
                "name": p.name,
                "cat": f"phase,{p.vendor}",
                "ts": _us(p.start, t0),
                "dur": max(_us(p.end, t0) - _us(p.start, t0), 0),
                "args": {"vendor": p.vendor, "estimated": p.estimated},
            }
        )
    for t, compiles, held in series.at_once(timeline.units):
        events.append(
            {
                "ph": "C",
                "pid": SLOTS_PID,
                "name": "compiles at once",
                "ts": _us(t, t0),
                "args": {"compiles": compiles, "CPU slots held": held},
            }
        )
    budget = timeline.mem_budget_gib
    for t, gib in series.peak_memory(timeline.units):
        args = {"compiles' peaks summed": gib}
        if budget is not None:
            args["budget"] = budget
        events.append(
            {"ph": "C", "pid": SLOTS_PID, "name": "memory GiB", "ts": _us(t, t0), "args": args}
        )
    for t, gib in timeline.memory:
        args = {"in use (sampled)": gib}
        if budget is not None:
            args["budget"] = budget
        events.append(
            {
                "ph": "C",
                "pid": SLOTS_PID,
                "name": "memory in use GiB",
                "ts": _us(t, t0),
                "args": args,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "release": timeline.title,
            "t0_epoch": t0,
            "cpus": timeline.cpus,
            "mem_budget_gib": budget,
            "critical": timeline.critical,
            "reused": timeline.reused,
            "notes": timeline.notes,
        },
    }
