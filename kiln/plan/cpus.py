"""How many CPUs this process may really use: the affinity mask and the cgroup's CPU
quota (v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, v2 ``cpu.max``), not
``os.cpu_count()``, which counts the host's cores (a 4-CPU pod on a 64-core host).

The quota is the smallest along the cgroup's path up to the mount's root (a parent's
limit binds its children); a fractional quota rounds down, never below one slot."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuSlots:
    count: int
    source: str  # what bound it: "--jobs", "affinity", "cgroup v2 cpu.max 150000/100000", ...


def _mounts(mountinfo: Path) -> list[tuple[str, str, str, list[str]]]:
    """(root, mount point, fstype, super options) of each cgroup mount."""
    found = []
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or not tail[0].startswith("cgroup"):
            continue
        found.append((fields[3], fields[4], tail[0], tail[2].split(",")))
    return found


def _groups(cgroup_file: Path) -> dict[str, str]:
    """Controller -> path in /proc/<pid>/cgroup; the v2 unified line under ""."""
    groups: dict[str, str] = {}
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return groups
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                groups[controller] = parts[2]
    return groups


def _dirs_up(mount_root: str, mount_point: str, group: str) -> list[Path]:
    """The cgroup's own folder and each parent's, up to the mount point."""
    rel = os.path.relpath(group, mount_root) if group.startswith(mount_root) else group
    rel = "" if rel in (".", "/") else rel.strip("/")
    parts = [p for p in rel.split("/") if p and p != ".."]
    return [Path(mount_point, *parts[:n]) for n in range(len(parts), -1, -1)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v2_quota(folder: Path) -> tuple[float, str] | None:
    text = _read(folder / "cpu.max")
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period), f"cgroup v2 cpu.max {quota}/{period}"


def _v1_quota(folder: Path) -> tuple[float, str] | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if not quota or not period or not period.isdigit() or int(period) == 0:
        return None
    if quota.startswith("-") or not quota.isdigit():
        return None
    return int(quota) / int(period), f"cgroup v1 cpu.cfs_quota_us {quota}/{period}"


def cgroup_quota(proc: Path = Path("/proc/self")) -> tuple[float, str] | None:
    """The tightest CPU quota over this process's cgroups, as CPUs, and where it is set."""
    groups = _groups(proc / "cgroup")
    best: tuple[float, str] | None = None
    for root, point, fstype, opts in _mounts(proc / "mountinfo"):
        if fstype == "cgroup2":
            group, reader = groups.get(""), _v2_quota
        elif "cpu" in opts:
            group, reader = groups.get("cpu"), _v1_quota
        else:
            continue
        if group is None:
            continue
        for folder in _dirs_up(root, point, group):
            found = reader(folder)
            if found and (best is None or found[0] < best[0]):
                best = found
    return best


def cpu_slots(jobs: int | None = None, proc: Path = Path("/proc/self")) -> CpuSlots:
    """``--jobs`` when given; else the affinity mask, lowered to the cgroup's quota."""
    if jobs:
        return CpuSlots(jobs, "--jobs")
    try:
        count, source = len(os.sched_getaffinity(0)), "affinity"
    except (AttributeError, OSError):
        count, source = os.cpu_count() or 1, "os.cpu_count()"
    quota = cgroup_quota(proc)
    if quota is not None and max(1, math.floor(quota[0])) < count:
        count, source = max(1, math.floor(quota[0])), quota[1]
    return CpuSlots(count, source)
