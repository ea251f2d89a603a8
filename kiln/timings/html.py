"""The timeline as one self-contained HTML page: SVG drawn here, CSS inline, no script
and nothing fetched, so it opens offline from a CI artifact or a mail attachment.

The page: what the build was up against (the critical path) and what the records show
(``findings``); a Gantt chart (each step's phases, then every compiler run on its slot
lane, coloured by step, the critical path outlined in red, remote runs outlined,
object-cache hits hatched, links pale); compiles and CPU slots held over time against
the slots; memory against the budget; the slowest units. Every bar has an SVG
``<title>`` (the browser's tooltip) with its record.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Sequence
from typing import Any

from kiln.timings import records, series, slots
from kiln.timings.records import Timeline, Unit
from kiln.timings.trace import is_critical

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#edc948",
    "#76b7b2",
    "#ff9da7",
    "#9c755f",
    "#e15759",
    "#bab0ac",
)
PHASE_SHADE = {"fetch": 0.35, "patch": 0.5, "build": 0.8, "package": 0.6, "verify": 0.45}
PROVISION_COLOUR = "#9c9c9c"  # the build's own row: no step's colour
WIDTH, LEFT, RIGHT = 1340, 180, 16
PLOT = WIDTH - LEFT - RIGHT
ROW, STEP_ROW = 15, 18
SLOWEST = 25


def plural(n: int, word: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def clock(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    m, s = divmod(round(seconds), 60)
    return f"{m}:{s:02d}" if m < 60 else f"{m // 60}:{m % 60:02d}:{s:02d}"


class Scale:
    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.span = t0, max(t1 - t0, 1e-3)

    def x(self, t: float) -> float:
        return round(LEFT + (t - self.t0) / self.span * PLOT, 2)

    def w(self, a: float, b: float, least: float = 0.0) -> float:
        return round(max((b - a) / self.span * PLOT, least), 2)

    def ticks(self) -> list[float]:
        for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200):
            if self.span / step <= 14:
                break
        n = int(self.span // step)
        return [self.t0 + i * step for i in range(n + 1)]


def colours(timeline: Timeline) -> dict[str, str]:
    names = timeline.vendors + [v for v in timeline.reused if v not in timeline.vendors]
    out = {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(names)}
    if any(p.vendor == records.PROVISION_ROW for p in timeline.phases):
        out[records.PROVISION_ROW] = PROVISION_COLOUR
    return out


def _axis(scale: Scale, y0: float, y1: float) -> list[str]:
    out = []
    for t in scale.ticks():
        x = scale.x(t)
        out.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{y0}" y2="{y1}"/>')
        out.append(
            f'<text class="tick" x="{x}" y="{y0 - 4}" text-anchor="middle">'
            f"{clock(t - scale.t0)}</text>"
        )
    return out


def _tooltip(u: Unit, lane: slots.Lane, t0: float) -> str:
    lines = [
        f"{u.label} ({u.vendor})",
        f"{u.kind}, {u.where}, {lane.name}"
        + (f", {u.threads} nvcc threads" if u.threads > 1 else ""),
        f"start +{u.start - t0:.1f} s, wall {u.wall_s:.1f} s, CPU {u.cpu_s:.1f} s",
        f"peak {u.rss_gib:.2f} GiB, waited at the gate {u.waited_s:.1f} s"
        + ("" if u.rc == 0 else f", exit {u.rc}"),
    ]
    return esc("\n".join(lines))


def gantt(timeline: Timeline, assigned: list[tuple[Unit, slots.Lane]], scale: Scale) -> str:
    col = colours(timeline)
    steps = timeline.vendors + [v for v in timeline.reused if v not in timeline.vendors]
    if any(p.vendor == records.PROVISION_ROW for p in timeline.phases):
        steps.insert(0, records.PROVISION_ROW)
    lanes = slots.lanes(assigned)
    top = 22
    lane_top = top + len(steps) * STEP_ROW + 14
    height = lane_top + len(lanes) * ROW + 8
    out = [
        f'<svg id="gantt" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" role="img" aria-label="compiles per slot over time">',
        '<defs><pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="2" height="4" fill="#333"/></pattern></defs>',
        *_axis(scale, top, height),
    ]
    for i, vendor in enumerate(steps):
        y = top + i * STEP_ROW
        out.append(
            f'<text class="lane" x="{LEFT - 6}" y="{y + 13}" text-anchor="end">{esc(vendor)}</text>'
        )
        for p in (p for p in timeline.phases if p.vendor == vendor):
            x, w = scale.x(p.start), scale.w(p.start, p.end, 1.0)
            shade = PHASE_SHADE.get(p.name, 0.5)
            crit = (
                " critical"
                if timeline.critical
                and vendor == timeline.critical.get("critical_vendor")
                and p.name in ("package", "verify")
                else ""
            )
            est = " estimated" if p.estimated else ""
            title = esc(
                f"{vendor}: {p.name} +{p.start - scale.t0:.1f} s, {p.end - p.start:.1f} s"
                + (" (estimated from the manifest's durations)" if p.estimated else "")
            )
            out.append(
                f'<rect class="phase{crit}{est}" data-vendor="{esc(vendor)}" '
                f'data-phase="{esc(p.name)}" '
                f'x="{x}" y="{y + 2}" width="{w}" height="{STEP_ROW - 4}" fill="{col[vendor]}" '
                f'fill-opacity="{shade}"><title>{title}</title></rect>'
            )
            if w > 7 * len(p.name):
                out.append(f'<text class="inbar" x="{x + 3}" y="{y + 13}">{esc(p.name)}</text>')
    for j, lane in enumerate(lanes):
        y = lane_top + j * ROW
        out.append(
            f'<rect class="lanebg" x="{LEFT}" y="{y + 1}" width="{PLOT}" height="{ROW - 2}"/>'
        )
        out.append(
            f'<text class="lane" x="{LEFT - 6}" y="{y + 11}" text-anchor="end">'
            f"{esc(lane.name)}</text>"
        )
    row = {lane: lane_top + j * ROW for j, lane in enumerate(lanes)}
    for u, lane in assigned:
        y = row[lane] + 2
        x, w = scale.x(u.start), scale.w(u.start, u.end, 1.5)
        classes = ["unit", u.kind, u.where] + (["critical"] if is_critical(u, timeline) else [])
        if u.rc != 0:
            classes.append("failed")
        fill = (
            "url(#hatch)" if u.kind == "hit" else ("#fff" if u.where == "remote" else col[u.vendor])
        )
        opacity = ' fill-opacity="0.45"' if u.kind == "link" else ""
        # every unit its own edge: a filled unit is outlined in white, so back-to-back
        # units of one step on one lane stay apart (outlined in their step's colour, they
        # read as one band); a remote one (white) keeps its step's colour
        edge = col[u.vendor] if u.where == "remote" or u.kind == "hit" else "#fff"
        out.append(
            f'<rect class="{" ".join(classes)}" data-vendor="{esc(u.vendor)}" '
            f'data-unit="{esc(u.source)}" x="{x}" y="{y}" width="{w}" height="{ROW - 4}" '
            f'fill="{fill}" stroke="{edge}"{opacity}>'
            f"<title>{_tooltip(u, lane, scale.t0)}</title></rect>"
        )
        if u.kind == "compile" and w > 24:  # a label where it fits; the tooltip always
            name = u.source.rsplit("/", 1)[-1]
            room = int(w // 6)
            label = name if len(name) <= room else name[: max(room - 1, 1)] + "…"
            if u.threads > 1 and len(label) + 4 <= room:
                label += f" ×{u.threads}"
            out.append(f'<text class="inbar" x="{x + 3}" y="{y + 9}">{esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _path(points: Sequence[tuple[float, float]], scale: Scale, y: Any, end: float) -> str:
    """A step path: each value held until the next point."""
    if not points:
        return ""
    d = [f"M{scale.x(points[0][0])},{y(points[0][1])}"]
    for (_, _v), (t2, v2) in itertools.pairwise(points):
        d.append(f"H{scale.x(t2)}V{y(v2)}")
    d.append(f"H{scale.x(end)}")
    return "".join(d)


def _line(points: Sequence[tuple[float, float]], scale: Scale, y: Any) -> str:
    return "M" + "L".join(f"{scale.x(t)},{y(v)}" for t, v in points) if points else ""


def chart(
    ident: str,
    label: str,
    curves: Sequence[tuple[str, str, str, Sequence[tuple[float, float]], bool]],
    limit: tuple[str, float] | None,
    scale: Scale,
    unit: str,
) -> str:
    """A small chart: ``curves`` (class, colour, name, points, stepped) and a limit line."""
    height, top, bottom = 190, 34, 22
    top_value = max(
        [v for *_, pts, _s in curves for _, v in pts] + ([limit[1]] if limit else []) + [1e-9]
    )
    top_value *= 1.1

    def y(v: float) -> float:
        return round(height - bottom - v / top_value * (height - top - bottom), 2)

    out = [
        f'<svg id="{ident}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'role="img" aria-label="{esc(label)}">',
        *_axis(scale, top, height - bottom),
        f'<line class="axis" x1="{LEFT}" x2="{LEFT + PLOT}" y1="{y(0)}" y2="{y(0)}"/>',
    ]
    for frac in (0.25, 0.5, 0.75, 1.0):
        v = top_value / 1.1 * frac
        out.append(
            f'<text class="tick" x="{LEFT - 6}" y="{y(v) + 4}" text-anchor="end">'
            f"{v:.3g} {unit}</text>"
        )
    if limit:
        out.append(
            f'<line class="limit" x1="{LEFT}" x2="{LEFT + PLOT}" y1="{y(limit[1])}" '
            f'y2="{y(limit[1])}"><title>{esc(limit[0])}: {limit[1]:g} {unit}</title></line>'
        )
        out.append(
            f'<text class="limitlabel" x="{LEFT + PLOT - 4}" y="{y(limit[1]) - 4}" '
            f'text-anchor="end">{esc(limit[0])} {limit[1]:g} {unit}</text>'
        )
    legend_x = LEFT + 8
    for cls, colour, name, pts, stepped in curves:
        d = _path(pts, scale, y, scale.t0 + scale.span) if stepped else _line(pts, scale, y)
        if d:
            out.append(
                f'<path class="curve {cls}" d="{d}" stroke="{colour}" fill="none">'
                f"<title>{esc(name)}</title></path>"
            )
        out.append(f'<rect x="{legend_x}" y="4" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text class="tick" x="{legend_x + 14}" y="13">{esc(name)}</text>')
        legend_x += 24 + 7 * len(name)
    out.append("</svg>")
    return "\n".join(out)


def findings(timeline: Timeline) -> list[str]:
    """What the records show, in sentences: slot use, idle slots while compiles waited,
    the longest unit and when it started, memory against the budget."""
    out = [
        f"Failed: {vendor}: {error}" + (f" (cause: {cause})" if cause else "")
        for vendor, error, cause in timeline.failures
    ]
    local = [u for u in timeline.units if u.where == "local" and u.kind != "hit"]
    counts = series.at_once(timeline.units)
    if timeline.failures and not any(u.rc == 0 for u in timeline.compiles()):
        out.append("No compile of this build finished: nothing to say of its slots or path.")
        return out
    if local and timeline.cpus:
        a, b = min(u.start for u in local), max(u.end for u in local)
        held = sum(u.wall_s * u.threads for u in local)
        cap = timeline.cpus * (b - a)
        out.append(
            f"CPU slots held {held / cap:.0%} of the time from the first compiler run to the "
            f"last ({held:.0f} of {cap:.0f} slot-seconds, {timeline.cpus} slots)."
            if cap > 0
            else "every run took no time"
        )
        idle = _idle_while_waiting(local, counts, timeline.cpus)
        if idle > 0.5:
            out.append(
                f"Slots idle while compiles waited at the gate: {idle:.0f} slot-seconds "
                f"(memory or the gate held them back, not the CPUs)."
            )
        alone = sum(t2 - t for (t, _c, h), (t2, _c2, _h2) in itertools.pairwise(counts) if h == 1)
        if timeline.cpus > 1 and alone > 1:
            out.append(
                f"{alone:.0f} s with one CPU slot held and {timeline.cpus - 1} idle "
                f"({alone / max(b - a, 1e-9):.0%} of the compile span)."
            )
    compiles = timeline.compiles()
    if compiles:
        longest = max(compiles, key=lambda u: u.wall_s)
        span = timeline.end - timeline.start
        began = longest.start - timeline.start
        out.append(
            f"Longest unit: {longest.source} ({longest.vendor}) {longest.wall_s:.1f} s, started "
            f"at {clock(began)} ({began / max(span, 1e-9):.0%} into the build), ended "
            f"{clock(timeline.end - longest.end)} before the build did."
        )
    c = timeline.critical
    if c and c.get("critical_unit"):
        vendor = c["critical_vendor"]
        ran = any(p.vendor == vendor and p.name in ("package", "verify") for p in timeline.phases)
        failed = vendor in {f[0] for f in timeline.failures}
        # only what ran: a step that failed never linked or packaged
        rest = (
            ", its links and packaging"
            if ran
            else " (the step failed before its links and packaging)"
            if failed
            else ""
        )
        wall = float(c.get("wall_s") or timeline.end - timeline.start)
        before = float(c.get("provision_s") or 0.0)
        of = (
            f"of the steps' {wall - before:.0f} s (the build's {wall:.0f} s, the first "
            f"{before:.0f} s provisioning before its first step)"
            if before >= 0.5
            else f"of the build's {wall:.0f} s"
        )
        out.append(
            f"Critical path: {vendor}: {c['critical_unit']}{rest}: "
            f"{c['critical_path_s']:.1f} s {of}; the steps took "
            f"{c['wall_over_bound']:.2f} x the {c['bound_by']}."
        )
    budget = timeline.mem_budget_gib
    peaks = max((v for _, v in series.peak_memory(timeline.units)), default=0.0)
    sampled = max((v for _, v in timeline.memory), default=None)
    if budget:
        what = (
            f"sampled peak {sampled:.1f} GiB ({sampled / budget:.0%} of the {budget:g} GiB budget)"
            if sampled is not None
            else f"no sampled series; the compiles' peaks summed reach {peaks:.1f} GiB "
            f"({peaks / budget:.0%} of the {budget:g} GiB budget)"
        )
        out.append(f"Memory: {what}.")
    return out


def _idle_while_waiting(
    local: list[Unit], counts: list[tuple[float, int, int]], cpus: int
) -> float:
    """Slot-seconds with a slot free while a compile waited at the gate (its wrapper had
    started, its compiler had not)."""
    marks = sorted({t for t, *_ in counts} | {u.start - u.waited_s for u in local})
    total = 0.0
    for t, t2 in itertools.pairwise(marks):
        mid = (t + t2) / 2
        held = sum(u.threads for u in local if u.start <= mid < u.end)
        waiting = sum(1 for u in local if u.start - u.waited_s <= mid < u.start)
        total += min(max(cpus - held, 0), waiting) * (t2 - t)
    return total


def slowest(timeline: Timeline) -> str:
    rows = sorted(
        (u for u in timeline.units if u.kind != "hit"), key=lambda u: u.wall_s, reverse=True
    )[:SLOWEST]
    body = "\n".join(
        f'<tr class="{"critical" if is_critical(u, timeline) else ""}"><td>{esc(u.vendor)}</td>'
        f"<td>{esc(u.label)}</td><td>{u.kind}</td><td>{u.where}</td>"
        f'<td class="n">{u.wall_s:.1f}</td><td class="n">{u.cpu_s:.1f}</td>'
        f'<td class="n">{u.rss_gib:.2f}</td><td class="n">{u.waited_s:.1f}</td>'
        f'<td class="n">{u.threads}</td><td class="n">+{u.start - timeline.start:.0f}</td></tr>'
        for u in rows
    )
    return (
        '<table id="slowest"><thead><tr><th>step</th><th>unit</th><th>kind</th><th>where</th>'
        "<th>wall s</th><th>CPU s</th><th>peak GiB</th><th>waited s</th><th>threads</th>"
        f"<th>start s</th></tr></thead><tbody>\n{body}\n</tbody></table>"
    )


def legend(timeline: Timeline) -> str:
    col = colours(timeline)
    items = [
        f'<span class="key"><span class="sw" style="background:{c}"></span>{esc(v)}</span>'
        for v, c in col.items()
    ]
    items += [
        '<span class="key"><span class="sw"></span>compile (local)</span>',
        '<span class="key"><span class="sw pale"></span>link / other compiler run</span>',
        '<span class="key"><span class="sw remote"></span>remote (build server)</span>',
        '<span class="key"><span class="sw hatch"></span>object-cache hit</span>',
        '<span class="key"><span class="sw crit"></span>critical path</span>',
    ]
    if any(u.rc != 0 for u in timeline.units):
        items.append('<span class="key"><span class="sw failed"></span>failed (exit code)</span>')
    return '<div class="legend">' + " ".join(items) + "</div>"


CSS = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}
h2{font-size:15px;margin:18px 0 4px}
.meta{color:#555}
.notes{background:#fff6d5;border:1px solid #e8d27a;padding:6px 10px}
svg text{font:11px system-ui,sans-serif;fill:#333}
svg .inbar{font-size:10px;fill:#000;pointer-events:none}
.grid{stroke:#e4e4e4}
.lanebg{fill:#f6f6f6}
.axis{stroke:#999}
rect.unit{stroke-width:.6}
rect.unit.remote{stroke-dasharray:3 2;stroke-width:1.2}
rect.critical{stroke:#d00 !important;stroke-width:2.2}
rect.failed{stroke:#000;stroke-width:2}
.sw.failed{border:2px solid #000}
rect.unit:hover,rect.phase:hover{stroke:#000;stroke-width:1.5}
rect.phase.estimated{stroke:#888;stroke-dasharray:2 2}
.curve{stroke-width:1.6}
.curve.slots{stroke-width:3.5;stroke-opacity:.6}
.limit{stroke:#d00;stroke-dasharray:6 3;stroke-width:1.4}
.limitlabel{fill:#d00}
.legend{margin:6px 0}
.key{margin-right:14px;white-space:nowrap}
.sw{display:inline-block;width:14px;height:10px;margin-right:4px;border:1px solid #555;
  background:#999;vertical-align:middle}
.sw.pale{opacity:.45}
.sw.remote{background:#fff;border-style:dashed}
.sw.hatch{background:repeating-linear-gradient(45deg,#333 0 2px,#fff 2px 4px)}
.sw.crit{background:#fff;border:2px solid #d00}
table{border-collapse:collapse;margin-top:6px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.critical td{background:#fde4e4}
"""


def _whole(timeline: Timeline) -> str:
    """The build's own wall (its manifest's), where it had provisioning before its first
    step that no record of the steps covers."""
    c = timeline.critical
    before = c["provision_s"] if c is not None else 0.0
    if c is None or before < 0.5:
        return ""
    return (
        f" (the build's wall {clock(float(c['wall_s']))}: {clock(before)} provisioning "
        f"before its first step, then the steps)"
    )


def render(timeline: Timeline, assigned: list[tuple[Unit, slots.Lane]]) -> str:
    scale = Scale(timeline.start, timeline.end)
    counts = series.at_once(timeline.units)
    conc = chart(
        "concurrency",
        "at once",
        [
            ("slots", "#f28e2b", "CPU slots held", [(t, h) for t, _, h in counts], True),
            ("cpu", "#e15759", "CPUs used", series.cpu_used(timeline.units), True),
            ("compiles", "#4e79a7", "compiles at once", [(t, c) for t, c, _ in counts], True),
            ("waiting", "#76b7b2", "waiting at the gate", series.waiting(timeline.units), True),
        ],
        ("CPU slots", float(timeline.cpus)) if timeline.cpus else None,
        scale,
        "",
    )
    curves = [
        ("peaks", "#b07aa1", "compiles' peaks summed", series.peak_memory(timeline.units), True)
    ]
    if timeline.memory:
        curves.insert(
            0, ("sampled", "#59a14f", "kiln's process tree (sampled)", timeline.memory, False)
        )
    mem = chart(
        "memory",
        "memory",
        curves,
        ("budget", timeline.mem_budget_gib) if timeline.mem_budget_gib else None,
        scale,
        "GiB",
    )
    compiles = timeline.compiles()
    head = (
        f"{plural(len(compiles), 'compile')}, "
        f"{plural(len(timeline.units) - len(compiles), 'other compiler run')}, "
        f"{plural(len(timeline.vendors), 'step')} built"
        + (
            f" ({', '.join(timeline.reused)} reused from the artifact cache)"
            if timeline.reused
            else ""
        )
        + f"; {clock(timeline.end - timeline.start)} from first record to last"
        + _whole(timeline)
        + (f"; {timeline.cpus} CPU slots" if timeline.cpus else "")
        + (f", memory budget {timeline.mem_budget_gib:g} GiB" if timeline.mem_budget_gib else "")
    )
    notes = (
        '<div class="notes"><b>Degraded:</b><ul>'
        + "".join(f"<li>{esc(n)}</li>" for n in timeline.notes)
        + "</ul></div>"
        if timeline.notes
        else ""
    )
    found = "".join(f"<li>{esc(f)}</li>" for f in findings(timeline))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>kiln build timings: {esc(timeline.title)}</title>
<style>{CSS}</style></head>
<body>
<h1>kiln build timings: {esc(timeline.title)}</h1>
<div class="meta">{esc(head)}</div>
{notes}
<h2>What it shows</h2><ul id="findings">{found}</ul>
<h2>Steps and compile slots</h2>
{legend(timeline)}
{gantt(timeline, assigned, scale)}
<h2>Compiles at once</h2>
{conc}
<h2>Memory against the budget</h2>
{mem}
<h2>Slowest units</h2>
{slowest(timeline)}
<p class="meta">Made by kiln from the build's records (docs/timings.md); the same data as a
trace for ui.perfetto.dev or chrome://tracing: timings.trace.json beside this page.</p>
</body></html>
"""
