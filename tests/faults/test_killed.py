"""Fault 3: kiln is SIGKILLed mid-build; the next run cleans up and finishes the job."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from kiln.release import manifest
from tests.conftest import start_kiln_until, step_marker
from tests.faults.conftest import (
    FAULT_PROFILE,
    build_cli,
    make_tiny,
    mirrors_file,
    tiny_build_args,
    tiny_vendor,
)
from tests.releases import manifest_json
from tests.workspace import write

# The slow vendor's build: say it started (its pid, its namespace's), then compile "forever".
SLOW = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:  # a zombie is gone for our purpose
            return fh.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone between the two looks (ESRCH)
        return False


def _running(marker: Path) -> list[int]:
    """The host's pids of the step's command (found by its arguments, which name
    ``marker``): a local step runs in a pid namespace of its own (bubblewrap), so the
    pid it writes is its own namespace's, not the host's."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(marker).encode() in argv and b"-c" in argv and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_sigkill_mid_build_then_a_rerun_cleans_up_and_reuses_what_finished(
    tmp_path: Path,
) -> None:
    up = tmp_path / "up"
    commit = make_tiny(up)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    marker = step_marker(tmp_path, "compiling")
    slow = tiny_vendor(commit, command=[sys.executable, "-c", SLOW, str(marker)], after=["fast"])
    ws = write(tmp_path / "ws", {"fast": tiny_vendor(commit), "slow": slow}, profile=FAULT_PROFILE)

    kiln = start_kiln_until(marker, *tiny_build_args(ws, tmp_path, mirrors, "--offline"))
    deadline = time.monotonic() + 60
    while not marker.read_text():  # the command writes its pid just after creating it
        assert time.monotonic() < deadline, "the step never wrote its pid"
        time.sleep(0.05)
    steps = _running(marker)
    assert steps, "the step's command is not among the host's processes"
    kiln.send_signal(signal.SIGKILL)  # no handler, no cleanup
    kiln.communicate(timeout=30)

    # The step's processes do not outlive kiln: they noticed and were killed.
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in steps):
        assert time.monotonic() < deadline, "the orphaned build step is still running"
        time.sleep(0.1)
    artifacts = tmp_path / "artifacts"
    assert not (artifacts / "test-release").exists()  # nothing half-published
    assert list((artifacts / ".staging").iterdir())  # the killed run's staging is left...
    lock = artifacts / "logs" / ".kiln.sources.lock"
    assert json.loads(lock.read_text())["pid"] == kiln.pid  # ...and its lock's note

    # The rerun: the slow vendor now builds normally; the fast one is unchanged.
    write(
        tmp_path / "ws",
        {"fast": tiny_vendor(commit), "slow": tiny_vendor(commit)},
        profile=FAULT_PROFILE,
    )
    res = build_cli(ws, tmp_path, mirrors, "--offline")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "did not finish" in res.stderr and f"pid {kiln.pid}" in res.stderr
    release = artifacts / "test-release"
    data = manifest_json(release)
    status = {n: v["caches"]["artifact"]["status"] for n, v in data["vendors"].items()}
    assert status == {"fast": "hit", "slow": "miss"}  # what finished before the kill is reused
    assert not (artifacts / ".staging").exists()
    assert lock.read_text() == ""  # a clean end leaves no holder note
    assert manifest.check(release / "manifest.json") == []
