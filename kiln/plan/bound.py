"""What bounds a build's wall time, from what it measured: the critical path (the longest
unit, then its step's links and packaging: no number of CPUs makes that step shorter)
and the CPU floor (the compile CPU-seconds spread over the CPU slots: no schedule on
this machine compiles faster). The larger of the two is what the build is up against;
its wall time over that says how much the schedule lost (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypedDict

from kiln.plan.jobs import JobLine


class PathFigures(TypedDict, total=False):
    """One step's critical path as the manifest's schedule records it (a step built before
    these were recorded has only some)."""

    longest_unit: str | None
    longest_unit_s: float
    link_s: float
    critical_path_s: float


class BoundFigures(TypedDict):
    """A build's bound: the manifest's ``scheduler.bound`` (kiln.release.manifest.Bound)."""

    critical_path_s: float
    critical_vendor: str | None
    critical_unit: str | None
    cpu_floor_s: float
    compile_cpu_s: float
    cpus: int
    wall_s: float
    provision_s: float
    bound_by: Literal["critical path", "CPU floor"]
    wall_over_bound: float


@dataclass(frozen=True)
class StepPath:
    """One step's share of the critical path: its longest unit, links and packaging."""

    unit: str | None
    unit_s: float
    link_s: float
    package_s: float

    @property
    def total_s(self) -> float:
        return round(self.unit_s + self.link_s + self.package_s, 3)

    def to_json(self) -> PathFigures:
        return {
            "longest_unit": self.unit,
            "longest_unit_s": round(self.unit_s, 3),
            "link_s": round(self.link_s, 3),
            "critical_path_s": self.total_s,
        }


def step_path(stats: list[JobLine], timings: dict[str, float]) -> StepPath:
    """From one step's compiler records (``KILN_JOB_STATS``) and its timings: the unit
    that took the longest here (wall time: with its nvcc threads), the wall time of its
    compiler runs that are not compiles (the links) and its packaging and verification."""
    compiled = [s for s in stats if s.get("result") == "compiled" and s.get("rc") == 0]
    longest = max(compiled, key=lambda s: float(s.get("wall_s", 0.0)), default=None)
    links = sum(
        float(s.get("wall_s", 0.0))
        for s in stats
        if s.get("result") == "other" and s.get("rc") == 0
    )
    return StepPath(
        unit=longest.get("source") or None if longest else None,
        unit_s=float(longest.get("wall_s", 0.0)) if longest else 0.0,
        link_s=links,
        package_s=float(timings.get("package", 0.0)) + float(timings.get("verify", 0.0)),
    )


def bound(
    paths: Mapping[str, PathFigures],
    compile_cpu_s: float,
    cpus: int,
    wall_s: float,
    provision_s: float = 0.0,
) -> BoundFigures | None:
    """The run's bound (the manifest's ``scheduler.bound``) from each built step's
    ``StepPath.to_json()`` and the compile CPU-seconds of the steps built; None where
    nothing compiled. ``provision_s``: the part of ``wall_s`` before the first step
    (loading, the toolchain, the build venv): no schedule of the steps shortens it, so
    ``wall_over_bound`` is the steps' wall against the bound."""
    if compile_cpu_s <= 0 and not any(p.get("critical_path_s") for p in paths.values()):
        return None
    empty: PathFigures = {}
    vendor, worst = max(
        paths.items(), key=lambda kv: kv[1].get("critical_path_s") or 0.0, default=(None, empty)
    )
    critical = float(worst.get("critical_path_s") or 0.0)
    floor = compile_cpu_s / max(cpus, 1)
    limit = max(critical, floor)
    return {
        "critical_path_s": round(critical, 3),
        "critical_vendor": vendor,
        "critical_unit": worst.get("longest_unit"),
        "cpu_floor_s": round(floor, 3),
        "compile_cpu_s": round(compile_cpu_s, 3),
        "cpus": cpus,
        "wall_s": round(wall_s, 3),
        "provision_s": round(provision_s, 3),
        "bound_by": "critical path" if critical >= floor else "CPU floor",
        "wall_over_bound": round((wall_s - provision_s) / limit, 3) if limit > 0 else 0.0,
    }


def describe(b: BoundFigures | None, paths: Mapping[str, PathFigures]) -> str:
    """The summary's line: both bounds, what makes each, and the wall time against them."""
    if b is None:
        return "bound: nothing compiled in this build (every vendor reused)"
    step = paths.get(b["critical_vendor"] or "") or PathFigures()
    parts = (
        f"{b['critical_vendor']}: {b['critical_unit']} {step.get('longest_unit_s', 0.0):.1f} s"
        f" + links {step.get('link_s', 0.0):.1f} s + packaging "
        f"{b['critical_path_s'] - step.get('longest_unit_s', 0.0) - step.get('link_s', 0.0):.1f} s"
    )
    return (
        f"bound: critical path {b['critical_path_s']:.1f} s ({parts}); CPU floor "
        f"{b['cpu_floor_s']:.1f} s ({b['compile_cpu_s']:.0f} compile CPU-s / {b['cpus']} "
        f"CPU slots); wall {b['wall_s']:.1f} s{_steps(b)} = {b['wall_over_bound']:.2f} x the "
        f"{b['bound_by']}"
    )


def _steps(b: BoundFigures) -> str:
    """The provisioning before the first step, where there was any, and the steps' wall."""
    before = float(b.get("provision_s") or 0.0)
    if before < 0.05:
        return ""
    return f": provisioning {before:.1f} s, then the steps {b['wall_s'] - before:.1f} s"
