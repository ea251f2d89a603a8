"""Compiles onto slot lanes: which slot each compiler run held, as a Gantt chart draws it.

The gate does not record which of its slots a compile took (a slot is a count, not a
place), so lanes are made from the runs' times: greedy interval colouring, runs taken
by start time, each into the lowest-numbered lane free at its start. That uses as few
lanes as ever held runs at once, so on a build that kept its budget the local lanes are
at most its CPU slots. A run with nvcc ``--threads N`` holds N CPU slots at the gate but
gets ONE lane here, its thread count shown on it (a bar split over N lanes would say
the threads ran apart); the concurrency chart counts the slots it held. Runs the gate
sent to build servers get lanes of their own (``remote N``), as do object-cache hits
(no compiler ran: ``cache hits``).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from kiln.timings.records import Unit

# Records are rounded to the millisecond: a run that starts where the last one on its
# lane ended may read up to this much before it.
TOLERANCE_S = 0.005


@dataclass(frozen=True)
class Lane:
    group: str  # "slot" | "remote" | "cache hits"
    index: int  # 1-based within its group

    @property
    def name(self) -> str:
        return self.group if self.group == "cache hits" else f"{self.group} {self.index}"


def group_of(u: Unit) -> str:
    if u.kind == "hit":
        return "cache hits"
    return "remote" if u.where == "remote" else "slot"


def assign(units: list[Unit]) -> list[tuple[Unit, Lane]]:
    """Every run with its lane, in start order."""
    out: list[tuple[Unit, Lane]] = []
    free: dict[str, list[int]] = {}  # group -> free lane numbers (heap)
    busy: dict[str, list[tuple[float, int]]] = {}  # group -> (end, lane) heap
    used: dict[str, int] = {}
    for u in sorted(units, key=lambda u: (u.start, u.end)):
        group = group_of(u)
        if group == "cache hits":
            out.append((u, Lane(group, 1)))
            continue
        ends, idle = busy.setdefault(group, []), free.setdefault(group, [])
        while ends and ends[0][0] <= u.start + TOLERANCE_S:
            heapq.heappush(idle, heapq.heappop(ends)[1])
        if idle:
            lane = heapq.heappop(idle)
        else:
            used[group] = used.get(group, 0) + 1
            lane = used[group]
        heapq.heappush(ends, (u.end, lane))
        out.append((u, Lane(group, lane)))
    return out


def overlaps(assigned: list[tuple[Unit, Lane]]) -> list[str]:
    """Two runs on one lane at once (cache hits excepted: they take no time): each named."""
    by_lane: dict[Lane, list[Unit]] = {}
    for u, lane in assigned:
        if lane.group != "cache hits":
            by_lane.setdefault(lane, []).append(u)
    problems = []
    for lane, runs in by_lane.items():
        runs.sort(key=lambda u: u.start)
        for a, b in itertools.pairwise(runs):
            if b.start < a.end - TOLERANCE_S:
                problems.append(f"{lane.name}: {b.label} starts before {a.label} ends")
    return problems


def lanes(assigned: list[tuple[Unit, Lane]]) -> list[Lane]:
    """The lanes in drawing order: slots, then remote, then cache hits."""
    order = {"slot": 0, "remote": 1, "cache hits": 2}
    return sorted({lane for _, lane in assigned}, key=lambda lane: (order[lane.group], lane.index))
