"""CPU slots from the affinity mask and the cgroup CPU quota (v1 and v2), on made-up
/proc/self trees (the real quota is tested in tests/integration/test_cli_plan.py)."""

from __future__ import annotations

import os
from pathlib import Path

from kiln.plan.cpus import cgroup_quota, cpu_slots

AFFINITY = len(os.sched_getaffinity(0))


def _proc(tmp: Path, cgroup: str, mounts: list[tuple[str, str, str, str]]) -> Path:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    lines = [
        f"{30 + i} 25 0:{i} {root} {point} rw,relatime shared:{i} - {fstype} cgroup {opts}"
        for i, (root, point, fstype, opts) in enumerate(mounts)
    ]
    (proc / "mountinfo").write_text("\n".join(lines) + "\n")
    return proc


def test_v2_quota_of_the_process_group(tmp_path: Path) -> None:
    fs = tmp_path / "cg2"
    (fs / "pod" / "job").mkdir(parents=True)
    (fs / "pod" / "job" / "cpu.max").write_text("150000 100000\n")
    proc = _proc(tmp_path, "0::/pod/job\n", [("/", str(fs), "cgroup2", "rw")])
    assert cgroup_quota(proc) == (1.5, "cgroup v2 cpu.max 150000/100000")
    slots = cpu_slots(None, proc)
    assert slots.count == 1 and slots.source.startswith("cgroup v2")


def test_v2_a_parents_tighter_quota_binds(tmp_path: Path) -> None:
    fs = tmp_path / "cg2"
    (fs / "pod" / "job").mkdir(parents=True)
    (fs / "pod" / "cpu.max").write_text("100000 100000\n")
    (fs / "pod" / "job" / "cpu.max").write_text("max 100000\n")
    proc = _proc(tmp_path, "0::/pod/job\n", [("/", str(fs), "cgroup2", "rw")])
    assert cgroup_quota(proc) == (1.0, "cgroup v2 cpu.max 100000/100000")


def test_v1_cfs_quota(tmp_path: Path) -> None:
    fs = tmp_path / "cpu"
    (fs / "docker" / "abc").mkdir(parents=True)
    (fs / "docker" / "abc" / "cpu.cfs_quota_us").write_text("50000\n")
    (fs / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    (fs / "cpu.cfs_quota_us").write_text("-1\n")
    (fs / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc(
        tmp_path,
        "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        [
            ("/", str(fs), "cgroup", "rw,cpu,cpuacct"),
            ("/", str(tmp_path / "m"), "cgroup", "rw,memory"),
        ],
    )
    assert cgroup_quota(proc) == (0.5, "cgroup v1 cpu.cfs_quota_us 50000/100000")
    assert cpu_slots(None, proc).count == 1  # never below one slot


def test_v1_inside_a_container_the_mount_root_is_its_group(tmp_path: Path) -> None:
    fs = tmp_path / "cpu"
    fs.mkdir()
    (fs / "cpu.cfs_quota_us").write_text("200000\n")
    (fs / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc(tmp_path, "3:cpu:/docker/abc\n", [("/docker/abc", str(fs), "cgroup", "rw,cpu")])
    assert cgroup_quota(proc) == (2.0, "cgroup v1 cpu.cfs_quota_us 200000/100000")


def test_no_quota_leaves_the_affinity_mask(tmp_path: Path) -> None:
    fs = tmp_path / "cg2"
    fs.mkdir()
    (fs / "cpu.max").write_text("max 100000\n")
    proc = _proc(tmp_path, "0::/\n", [("/", str(fs), "cgroup2", "rw")])
    assert cgroup_quota(proc) is None
    assert cpu_slots(None, proc).count == AFFINITY
    assert cpu_slots(None, proc).source == "affinity"


def test_jobs_wins(tmp_path: Path) -> None:
    assert cpu_slots(7, tmp_path).count == 7
    assert cpu_slots(7, tmp_path).source == "--jobs"
