"""Counters over time from the compiler runs: compiles at once, CPU slots held, the CPU
they really used (each run's CPU seconds spread over its wall), compiles waiting at the
gate, and the memory their peaks add up to (an upper bound: each run counted at its peak
for its whole run; the sampled series, where the build recorded one, is what was really
in use)."""

from __future__ import annotations

from kiln.timings.records import Unit


def _steps(events: list[tuple[float, tuple[float, ...]]]) -> list[tuple[float, tuple[float, ...]]]:
    """Sum +/- deltas into values after each moment (one point per distinct time)."""
    out: list[tuple[float, tuple[float, ...]]] = []
    now: tuple[float, ...] = ()
    for t, delta in sorted(events, key=lambda e: e[0]):
        now = tuple(a + b for a, b in zip(now or (0.0,) * len(delta), delta, strict=True))
        if out and out[-1][0] == t:
            out[-1] = (t, now)
        else:
            out.append((t, now))
    return out


def at_once(units: list[Unit]) -> list[tuple[float, int, int]]:
    """(time, compiles running here, CPU slots held here) after each change: a compile
    with nvcc ``--threads N`` holds N slots; links hold their slot too."""
    events: list[tuple[float, tuple[float, ...]]] = []
    for u in units:
        if u.where == "remote" or u.kind == "hit":
            continue
        d = (1.0 if u.kind == "compile" else 0.0, float(u.threads))
        events += [(u.start, d), (u.end, (-d[0], -d[1]))]
    return [(t, round(v[0]), round(v[1])) for t, v in _steps(events)]


def peak_memory(units: list[Unit]) -> list[tuple[float, float]]:
    """(time, GiB) after each change: the peaks of the runs here summed while they ran."""
    events: list[tuple[float, tuple[float, ...]]] = []
    for u in units:
        if u.where == "remote" or u.kind == "hit":
            continue
        events += [(u.start, (u.rss_gib,)), (u.end, (-u.rss_gib,))]
    return [(t, max(round(v[0], 4), 0.0)) for t, v in _steps(events)]


def waiting(units: list[Unit]) -> list[tuple[float, int]]:
    """(time, compiles waiting at the gate) after each change: a run waited from its
    wrapper's start (``start - waited_s``) until its compiler started."""
    events: list[tuple[float, tuple[float, ...]]] = []
    for u in units:
        if u.waited_s > 0:
            events += [(u.start - u.waited_s, (1.0,)), (u.start, (-1.0,))]
    return [(t, round(v[0])) for t, v in _steps(events)]


def cpu_used(units: list[Unit]) -> list[tuple[float, float]]:
    """(time, CPUs in use) after each change: each local run's CPU seconds over its wall
    (an average per run: what the slots it held were really given)."""
    events: list[tuple[float, tuple[float, ...]]] = []
    for u in units:
        if u.where == "remote" or u.kind == "hit" or u.wall_s <= 0:
            continue
        rate = u.cpu_s / u.wall_s
        events += [(u.start, (rate,)), (u.end, (-rate,))]
    return [(t, max(round(v[0], 3), 0.0)) for t, v in _steps(events)]
