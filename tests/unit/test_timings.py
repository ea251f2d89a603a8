"""The timings report's pieces (kiln/timings/) on records written here: a .jobs file's bad
lines skipped and said, slot lanes that never overlap, the trace checked against the
records (and corrupted traces caught), the page's parts, and kiln timings' one-line
refusal of a folder without records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln import timings
from kiln.errors import TimingsError
from kiln.timings import html, records, series, slots, trace
from tests.conftest import run_kiln
from tests.timingscheck import problems

T0 = 1_800_000_000.0


def job(source: str, start: float, wall: float, **extra: object) -> dict[str, object]:
    return {
        "compiler": "nvcc",
        "source": source,
        "result": "compiled",
        "rc": 0,
        "rss_kib": 1_048_576,
        "cpu_s": wall,
        "wall_s": wall,
        "start": T0 + start,
        "waited_s": 0.5,
        "where": "local",
        **extra,
    }


def write_logs(logs: Path, with_phases: bool = True, with_memory: bool = True) -> Path:
    """Two steps: a (three units, two at once, one of them 2 nvcc threads, then a link)
    and b (one unit, a remote one, an object-cache hit)."""
    logs.mkdir(parents=True)
    a = [
        job("csrc/a1.cu", 10, 20, threads=2),
        job("csrc/a2.cu", 10, 5),
        job("csrc/a3.cu", 15.2, 10),
        {**job("", 31, 2), "compiler": "g++", "result": "other"},
    ]
    b = [
        job("b/long.cu", 12, 25),
        job("b/far.cu", 12, 8, where="remote"),
        {**job("b/hit.cu", 13, 0), "result": "objcache-hit"},
    ]
    for name, lines in (("a", a), ("b", b)):
        (logs / f"{name}.jobs").write_text("".join(json.dumps(x) + "\n" for x in lines))
        if with_phases:
            spans = [("fetch", 0, 3), ("patch", 3, 4), ("build", 5, 40), ("package", 40, 42)]
            (logs / f"{name}.phases").write_text(
                "".join(
                    json.dumps({"phase": p, "start": T0 + s, "end": T0 + e}) + "\n"
                    for p, s, e in spans
                )
            )
    if with_memory:
        (logs / records.MEMORY_SERIES).write_text(
            "".join(json.dumps({"t": T0 + t, "rss_gib": t / 10}) + "\n" for t in range(0, 44, 2))
        )
    return logs


def made(logs: Path) -> tuple[records.Timeline, dict]:
    timeline = records.load(logs, vendors=["a", "b"], mem_budget_gib=8.0, cpus=3)
    return timeline, trace.build(timeline, slots.assign(timeline.units))


def test_the_trace_holds_every_compile_once_on_a_slot_inside_its_step(tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs")
    timeline, data = made(logs)
    assert timeline.notes == []
    assert problems(data, logs, ["a", "b"]) == []
    lanes = {
        e["args"]["name"]
        for e in data["traceEvents"]
        if e["name"] == "thread_name" and e["pid"] == trace.SLOTS_PID
    }
    # a1 and a2 at once, then a3 where a2 ended; b's long unit beside them: 3 slots
    assert lanes == {"slot 1", "slot 2", "slot 3", "remote 1", "cache hits"}
    counters = {e["name"] for e in data["traceEvents"] if e["ph"] == "C"}
    assert counters == {
        "compiles at once",
        "CPUs used",
        "waiting at the gate",
        "memory GiB",
        "memory in use GiB",
    }
    # every wait at the gate a slice of its own (issue 35): each run waited 0.5 s
    waits = [e for e in data["traceEvents"] if e["ph"] == "X" and e["pid"] == trace.GATE_PID]
    assert len(waits) == len(timeline.units) and {e["dur"] for e in waits} == {500_000}
    held = max(
        e["args"]["CPU slots held"]
        for e in data["traceEvents"]
        if e["ph"] == "C" and e["name"] == "compiles at once"
    )
    assert held == 4  # a1 (2 threads) + a2 + b/long: the remote one holds no local slot


@pytest.mark.parametrize("corrupt", ["drop", "twice", "outside", "overlap", "counter"])
def test_the_trace_check_catches_a_corrupted_trace(tmp_path: Path, corrupt: str) -> None:
    logs = write_logs(tmp_path / "logs")
    _, data = made(logs)
    events = data["traceEvents"]
    i = next(
        i for i, e in enumerate(events) if e["ph"] == "X" and e["args"].get("unit") == "csrc/a3.cu"
    )
    if corrupt == "drop":
        del events[i]
    elif corrupt == "twice":
        events.append(dict(events[i]))
    elif corrupt == "outside":
        events[i] = {**events[i], "ts": events[i]["ts"] + 30_000_000}
    elif corrupt == "overlap":
        other = next(e for e in events if e["ph"] == "X" and e["args"].get("unit") == "csrc/a1.cu")
        events[i] = {**events[i], "tid": other["tid"]}
    else:
        data["traceEvents"] = [e for e in events if e["name"] != "compiles at once"]
    assert problems(data, logs, ["a", "b"]) != []


def test_bad_lines_are_skipped_and_said(tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs")
    with (logs / "a.jobs").open("a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps(job("csrc/neg.cu", 12, -3)) + "\n")
        fh.write(json.dumps({**job("csrc/nostart.cu", 12, 3), "start": None}) + "\n")
        fh.write("[1, 2]\n")
    timeline, _ = made(logs)
    assert not any(u.source in ("csrc/neg.cu", "csrc/nostart.cu") for u in timeline.units)
    assert timeline.notes == [
        "a.jobs: 4 line(s) skipped, not a compiler run (first: wall_s: -3.0 is negative)"
    ]
    with pytest.raises(ValueError, match="threads: 0"):
        records.unit("a", job("x.cu", 1, 1, threads=0))


def test_an_earlier_builds_records_are_left_out(tmp_path: Path) -> None:
    """A vendor this run did not build keeps an older .jobs: its runs all ended before
    this run's memory sampler started."""
    logs = write_logs(tmp_path / "logs")
    stale = [job("old/x.cu", -5000, 10)]
    (logs / "old.jobs").write_text(json.dumps(stale[0]) + "\n")
    timeline = records.load(logs, vendors=["a", "b", "old"], mem_budget_gib=8.0, cpus=3)
    assert "old" not in timeline.vendors and not any(u.vendor == "old" for u in timeline.units)
    assert timeline.notes == ["old: its records are an earlier build's: left out"]


def test_lanes_never_overlap_and_an_overlap_is_found() -> None:
    units = [
        records.unit("v", job(f"u{i}.cu", start=(i * 7) % 13, wall=3 + i % 5)) for i in range(30)
    ]
    assigned = slots.assign(units)
    assert slots.overlaps(assigned) == []
    most = max(c for _, c, _ in series.at_once(units))
    assert len(slots.lanes(assigned)) == most  # as few lanes as ever ran at once
    (u0, lane0), (u1, _) = assigned[0], assigned[1]
    assert u0.start <= u1.start < u0.end  # the first two ran at once...
    bad = [(u0, lane0), (u1, lane0), *assigned[2:]]
    assert slots.overlaps(bad) != []  # ...so on one lane they are an overlap


def test_an_older_build_degrades_and_says_so(tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs", with_phases=False, with_memory=False)
    timeline, _ = made(logs)
    assert timeline.phases == []
    assert timeline.notes == [
        "no phase records and no manifest: phases omitted",
        "no memory series (memory.jsonl: a build before it): memory over time is estimated "
        "from each compile's peak (summed while it ran), not sampled",
    ]
    page = html.render(timeline, slots.assign(timeline.units))
    assert "phases omitted" in page and 'id="memory"' in page
    est = records.estimated_phases(
        "a", {"fetch": 2, "patch": 1, "build": 40, "package": 3}, timeline.units
    )
    build = next(p for p in est if p.name == "build")
    mine = [u for u in timeline.units if u.vendor == "a"]
    assert build.estimated and all(build.start <= u.start and u.end <= build.end for u in mine)
    assert [p.name for p in est] == ["fetch", "patch", "build", "package", "verify"]


def test_the_page_draws_every_compile_and_marks_the_critical_path(tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs")
    timeline, _ = made(logs)
    assert timeline.critical is not None
    assert (timeline.critical["critical_vendor"], timeline.critical["critical_unit"]) == (
        "b",
        "b/long.cu",
    )
    page_file, trace_file = timings.write(timeline, tmp_path / "out")
    page = page_file.read_text()
    assert page.count('class="unit compile') == len(timeline.compiles()) == 5
    assert page.count('class="unit compile remote') == 1
    assert page.count('class="unit hit') == 1
    assert 'class="unit compile local critical"' in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")
    assert (
        json.loads(trace_file.read_text())["otherData"]["critical"]["critical_unit"] == "b/long.cu"
    )


def test_kiln_timings_refuses_a_folder_without_records_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "logs" / "rel"
    empty.mkdir(parents=True)
    (empty / "x-build.log").write_text("nothing\n")
    res = run_kiln("timings", empty)
    assert res.returncode == TimingsError.exit_code, res.stderr
    assert res.stderr.strip().count("\n") == 0 and "no compiler records" in res.stderr
    assert sorted(p.name for p in empty.iterdir()) == ["x-build.log"]  # nothing written
    res = run_kiln("timings", tmp_path / "absent")
    assert res.returncode == TimingsError.exit_code and "no such folder" in res.stderr


def test_kiln_timings_writes_both_files_where_asked(tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs")
    res = run_kiln("timings", logs, "--out", tmp_path / "report")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [
        str(tmp_path / "report" / timings.HTML_NAME),
        str(tmp_path / "report" / timings.TRACE_NAME),
    ]


class _Clock:
    """A clock that moves only when told (time.monotonic and time.time together)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


def test_a_step_records_its_phases_and_the_sampler_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import time

    from kiln.inside import memwatch
    from kiln.orchestrate import context
    from kiln.orchestrate.context import Timings, timed

    clock = _Clock()
    monkeypatch.setattr(context, "time", clock)
    spent = Timings(tmp_path / "v.phases")
    for took in (1.5, 2.25):
        with timed(spent, "build"):
            clock.now += took
        clock.now += 10  # between the two parts
    lines = [json.loads(x) for x in (tmp_path / "v.phases").read_text().splitlines()]
    assert [(x["phase"], x["end"] - x["start"]) for x in lines] == [("build", 1.5), ("build", 2.25)]
    assert lines[1]["start"] - lines[0]["end"] == 10
    assert dict(spent) == {"build": 3.75}  # the manifest's: the parts added up
    plain: dict[str, float] = {}
    with timed(plain, "fetch"):  # a plain dict: durations only, no file
        pass
    assert set(plain) == {"fetch"}
    with memwatch.Watcher(os.getpid(), interval=0.05, series=tmp_path / "m.jsonl"):
        deadline = time.monotonic() + 30  # a deadline, not the expected time: samples are awaited
        while len(records.memory_of(tmp_path / "m.jsonl")) < 3:
            assert time.monotonic() < deadline, "the sampler wrote fewer than 3 samples in 30 s"
            time.sleep(0.05)
    samples = records.memory_of(tmp_path / "m.jsonl")
    assert len(samples) >= 3 and all(gib > 0 for _, gib in samples)


def test_only_the_chain_that_decides_the_wall_is_critical(tmp_path: Path) -> None:
    """Issue 35: the critical step's quick compiler runs before its longest unit (a g++
    probe of 3 ms) are not on the critical path; the longest unit and the links after it
    are."""
    logs = write_logs(tmp_path / "logs")
    probe = {**job("", 12.001, 0.003), "compiler": "g++", "result": "other"}
    link = {**job("", 38, 1.5), "compiler": "g++", "result": "other"}
    with (logs / "b.jobs").open("a") as fh:
        fh.write(json.dumps(probe) + "\n" + json.dumps(link) + "\n")
    timeline, built = made(logs)
    marked = {
        (e["args"]["unit"] or "link", round(e["ts"] / 1e6, 3))
        for e in built["traceEvents"]
        if e["ph"] == "X" and e["pid"] == trace.SLOTS_PID and e["args"]["critical"]
    }
    start = timeline.start - T0
    assert marked == {("b/long.cu", round(12 - start, 3)), ("link", round(38 - start, 3))}


def test_the_traces_bound_uses_the_builds_cpus_and_wall(tmp_path: Path) -> None:
    """Issue 35: the bound was computed with 1 CPU and a wall of 0: a build bound by its
    critical path could read "CPU floor"."""
    logs = write_logs(tmp_path / "logs")
    timeline, built = made(logs)  # 3 CPU slots
    bound = built["otherData"]["critical"]
    assert bound["cpus"] == 3
    assert bound["wall_s"] == pytest.approx(timeline.end - timeline.start, abs=0.01)
    # 68 CPU-s of compiles on 3 slots: a floor of 22.7 s, under b's 25 s unit and its
    # packaging: the critical path bounds it
    assert bound["cpu_floor_s"] == pytest.approx(68 / 3, abs=0.1)
    assert bound["bound_by"] == "critical path"


def test_a_failed_build_is_drawn_as_failed(tmp_path: Path) -> None:
    """Issue 35: the page of a build whose compiles all failed says which step failed and
    why (its failure record), shows no "0 of 0 slot-seconds" or "Critical path: None",
    has a legend entry for failed runs, and `kiln timings` on its logs (no manifest) keeps
    the CPU slots and budget the build wrote beside them."""
    logs = tmp_path / "logs" / "rel"
    logs.mkdir(parents=True)
    failed = [job("csrc/k.cu", 1, 2, rc=1), job("csrc/j.cu", 1, 3, rc=1)]
    (logs / "c.jobs").write_text("".join(json.dumps(x) + "\n" for x in failed))
    (logs / "c.failure.json").write_text(
        json.dumps(
            {
                "errors": [{"text": 'csrc/k.cu:3: error: identifier "x" is undefined'}],
                "cause": {"row": "missing-identifier", "cause": "x is not declared"},
            }
        )
    )
    (logs / records.BUDGET_FILE).write_text(json.dumps({"mem_gib": 12.0, "cpus": 16}))
    timeline = records.load(logs)
    assert (timeline.cpus, timeline.mem_budget_gib) == (16, 12.0)
    assert timeline.failures == [
        ("c", 'csrc/k.cu:3: error: identifier "x" is undefined', "x is not declared")
    ]
    page = html.render(timeline, slots.assign(timeline.units))
    assert 'Failed: c: csrc/k.cu:3: error: identifier "x" is undefined' in page.replace(
        "&quot;", '"'
    )
    assert "0 of 0 slot-seconds" not in page and "Critical path: None" not in page
    assert "failed (exit code)" in page
    res = run_kiln("timings", logs, "--out", tmp_path / "out")
    assert res.returncode == 0, res.stderr


def test_a_failed_steps_critical_path_marks_only_what_ran(tmp_path: Path) -> None:
    """Issue 41: the page of a build whose step failed after compiling said its critical
    path was the unit "and its links and packaging", which never ran; and "1 steps"."""
    logs = tmp_path / "logs" / "rel"
    logs.mkdir(parents=True)
    ran = [job("csrc/k.cu", 1, 20), job("csrc/j.cu", 1, 3, rc=1)]
    (logs / "c.jobs").write_text("".join(json.dumps(x) + "\n" for x in ran))
    (logs / "c.failure.json").write_text(
        json.dumps({"errors": [{"text": "csrc/j.cu:3: error: x"}], "cause": {"cause": "x"}})
    )
    (logs / records.BUDGET_FILE).write_text(json.dumps({"mem_gib": 12.0, "cpus": 2}))
    page = html.render(records.load(logs), slots.assign(records.load(logs).units))
    assert "Critical path: c: csrc/k.cu (the step failed before its links and packaging)" in page
    assert "its links and packaging:" not in page
    assert "1 step built" in page and "1 steps" not in page and "2 compiles" in page


def test_provisioning_before_the_first_step_is_not_counted_against_the_steps(
    tmp_path: Path,
) -> None:
    """Issue 41: a cold build's page said 214 s where its summary said 370.6 s, and
    "1.94 x the critical path": the provisioning before its first step (toolchain, build
    venv) was counted against the steps' schedule. The bound now takes it out of the
    ratio and says it; the page gives the build's whole wall and that part of it."""
    from dataclasses import replace
    from html import unescape

    logs = write_logs(tmp_path / "logs")
    timeline, _built = made(logs)
    span = timeline.end - timeline.start
    args = (timeline.vendors, timeline.units, timeline.phases, 3)
    # the pipeline's record of it: drawn as a phase on a row of its own, in the trace too
    before = {"phase": "provision", "start": timeline.start - 156.0, "end": timeline.start}
    (logs / records.PROVISION_FILE).write_text(json.dumps(before) + "\n")
    drawn, built = made(logs)
    assert drawn.start == timeline.start - 156.0 and problems(built, logs, ["a", "b"]) == []
    assert any(
        e["ph"] == "X" and e["name"] == "provision" and e["dur"] == 156_000_000
        for e in built["traceEvents"]
    )
    rows = unescape(html.render(drawn, slots.assign(drawn.units)))
    assert 'data-vendor="(provisioning)" data-phase="provision"' in rows
    assert ">(provisioning)</text>" in rows
    steps_only = records.critical_path(*args, span)
    cold = records.critical_path(*args, span + 156.0, 156.0)
    assert steps_only is not None and cold is not None
    assert cold["wall_over_bound"] == pytest.approx(steps_only["wall_over_bound"], abs=0.002)
    assert cold["wall_s"] == pytest.approx(span + 156.0, abs=0.01)
    page = unescape(html.render(replace(timeline, critical=cold), slots.assign(timeline.units)))
    assert f"(the build's wall {html.clock(span + 156.0)}: 2:36 provisioning before its" in page
    assert (
        f"of the steps' {span:.0f} s (the build's {span + 156:.0f} s, the first 156 s "
        f"provisioning before its first step); the steps took "
        f"{cold['wall_over_bound']:.2f} x the {cold['bound_by']}."
    ) in page
    # without provisioning the page says the build's wall alone, as before
    plain = unescape(
        html.render(replace(timeline, critical=steps_only), slots.assign(timeline.units))
    )
    assert "provisioning" not in plain and f"of the build's {span:.0f} s;" in plain
