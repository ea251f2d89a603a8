"""Checks of a timings trace (kiln/timings/trace.py) against the build's own records, read
here independently of kiln's timings code: every compile of every ``<vendor>.jobs``
exactly once as an ``X`` event, on a slot track, no two events of a track at once, each
inside its step's build phase; the counters there. ``problems`` lists what is wrong (the
tests feed it corrupted traces to see it go red); headless Chromium helpers beside it."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

TOLERANCE_US = 5_000  # records are rounded to the millisecond (kiln/timings/slots.py)


def compiled_records(logs: Path, vendors: list[str]) -> list[dict[str, Any]]:
    out = []
    for vendor in vendors:
        for line in (logs / f"{vendor}.jobs").read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("result") == "compiled":
                out.append({**rec, "vendor": vendor})
    return out


def problems(trace: dict[str, Any], logs: Path, vendors: list[str]) -> list[str]:
    events = trace.get("traceEvents", [])
    names = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") in ("thread_name", "process_name")
    }
    process = {pid: n for (pid, tid), n in names.items() if tid is None}
    slots_pid = next((p for p, n in process.items() if n == "compile slots"), None)
    steps_pid = next((p for p, n in process.items() if n == "steps"), None)
    found: list[str] = []
    if slots_pid is None or steps_pid is None:
        return ["no 'compile slots' or 'steps' process named"]
    runs = [e for e in events if e.get("ph") == "X" and e["pid"] == slots_pid]
    compiles = [e for e in runs if e["args"].get("kind") == "compile"]
    want = Counter(
        (r["vendor"], r["source"], round(float(r["start"]), 3))
        for r in compiled_records(logs, vendors)
    )
    have = Counter(
        (e["args"]["vendor"], e["args"]["unit"], e["args"]["start_epoch"]) for e in compiles
    )
    for key in want.keys() | have.keys():
        if want[key] != have[key]:
            found.append(f"compile {key}: {want[key]} in the records, {have[key]} in the trace")
    for e in runs:
        lane = names.get((slots_pid, e["tid"]), "")
        if e["args"].get("kind") != "hit" and not lane.startswith(("slot ", "remote ")):
            found.append(f"{e['name']}: on track {lane!r}, not a slot")
    by_tid: dict[int, list[dict[str, Any]]] = {}
    for e in runs:
        if e["args"].get("kind") != "hit":
            by_tid.setdefault(e["tid"], []).append(e)
    for tid, lane_events in by_tid.items():
        lane_events.sort(key=lambda e: e["ts"])
        for a, b in itertools.pairwise(lane_events):
            if b["ts"] < a["ts"] + a["dur"] - TOLERANCE_US:
                found.append(f"{names.get((slots_pid, tid))}: {b['name']} overlaps {a['name']}")
    builds: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        if e.get("ph") == "X" and e["pid"] == steps_pid and e["name"] == "build":
            builds.setdefault(e["args"]["vendor"], []).append((e["ts"], e["ts"] + e["dur"]))
    for e in compiles:
        spans = builds.get(e["args"]["vendor"], [])
        inside = any(
            a - TOLERANCE_US <= e["ts"] and e["ts"] + e["dur"] <= b + TOLERANCE_US for a, b in spans
        )
        if not inside:
            found.append(f"{e['args']['vendor']}: {e['name']} not inside its step's build phase")
    counters = {e["name"] for e in events if e.get("ph") == "C"}
    for name in ("compiles at once", "memory GiB"):
        if name not in counters:
            found.append(f"no {name!r} counter")
    return found


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def open_page(page: Path, screenshot: Path | None) -> tuple[str, list[str]]:
    """(the DOM headless Chromium made of ``page``, its console lines); a screenshot kept
    where ``screenshot`` names a file."""
    binary = chromium()
    assert binary is not None
    common = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1000",
    ]
    shot = subprocess.CompletedProcess([], 0, "", "")
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run(
            [*common, f"--screenshot={screenshot}", page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    dom = subprocess.run(
        [*common, "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shot.returncode == 0 and dom.returncode == 0, shot.stderr + dom.stderr
    console = [
        line
        for line in (shot.stderr + dom.stderr).splitlines()
        if ":CONSOLE" in line or "Uncaught" in line
    ]
    return dom.stdout, console
