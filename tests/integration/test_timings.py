"""The timings report of a real build (issue 25): three steps built at once with
``--timings`` (each a build.ninja of C units and a link, no CUDA: compiles of a second or
less), its trace checked against the build's own records (every compile once, on a slot,
no two at once on one, inside its step's build phase; the counters), ``kiln timings`` on
the same logs making the same trace, and the page opened in headless Chromium (Debian's
``chromium``): one bar per compile recorded, no console errors, a screenshot kept in
``build/test-output/timings/``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kiln import timings
from kiln.errors import BuildError
from kiln.sources.gitrepo import CommitSpec, make_repo
from tests import ninjafix, timingscheck
from tests.conftest import REPO, build_args, run_kiln, shared_cache
from tests.require import missing
from tests.upstreams import BASE_URL
from tests.workspace import write

VENDORS = ("alpha", "beta", "gamma")
SHOTS = REPO / "build" / "test-output" / "timings"


def _build(
    root: Path, build_python: Path, names: tuple[str, ...], fails: str = ""
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Build fixture upstreams ``names`` (``fails``: its build exits 3 after compiling)
    with --timings; (the finished kiln, its logs folder)."""
    vendors = {}
    for k, name in enumerate(names):
        files = ninjafix.files("libfix.so", ninjafix.heavy(10 + 10 * k, deep=False), name, k, "-O1")
        files["build.sh"] += "exit 3\n" if name == fails else ""
        (commit,) = make_repo(root / "up" / f"{name}.git", [CommitSpec(name, files)])
        vendors[name] = ninjafix.vendor(f"{BASE_URL}{name}.git", commit, "libfix.so", 0.5)
    (root / "up" / "mirrors.toml").write_text(f'[mirrors]\n"{BASE_URL}" = "{root}/up/"\n')
    ws = write(root / "ws", vendors)
    res = run_kiln(
        *build_args(
            ws,
            root,
            *("--jobs", "2", "--mem-budget", "4"),
            *("--no-compiler-cache", "--no-artifact-cache", "--timings"),
            mirrors=root / "up" / "mirrors.toml",
            python=build_python,
            toolchain="pypi",
            cache=shared_cache(root / "cache"),
        )
    )
    return res, root / "artifacts" / "logs" / "test-release"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_python: Path) -> Path:
    """One build of three steps with --timings; its logs folder."""
    res, logs = _build(tmp_path_factory.mktemp("timings"), build_python, VENDORS)
    assert res.returncode == 0, res.stderr
    return logs


def test_the_trace_matches_the_builds_records(built: Path) -> None:
    data = json.loads((built / timings.TRACE_NAME).read_text())
    records = timingscheck.compiled_records(built, list(VENDORS))
    assert len(records) == 12  # four units in each of three steps
    assert timingscheck.problems(data, built, list(VENDORS)) == []
    # the phases are the steps' own records, and the memory was sampled
    for vendor in VENDORS:
        recorded = [json.loads(x) for x in (built / f"{vendor}.phases").read_text().splitlines()]
        assert {"fetch", "patch", "build", "package", "verify"} <= {p["phase"] for p in recorded}
    # issue 41: the build's own time before its first step, a phase of its own row
    (before,) = [json.loads(x) for x in (built / "provision.phases").read_text().splitlines()]
    assert before["phase"] == "provision" and before["end"] >= before["start"]
    assert any(
        e.get("ph") == "X" and e["name"] == "provision" and e["args"]["vendor"] == "(provisioning)"
        for e in data["traceEvents"]
    )
    counters = {e["name"] for e in data["traceEvents"] if e["ph"] == "C"}
    assert "memory in use GiB" in counters and data["otherData"]["notes"] == []
    # two CPU slots (--jobs 2), and compiles of the three steps shared them
    lanes = {
        e["args"]["name"]
        for e in data["traceEvents"]
        if e.get("name") == "thread_name" and e["pid"] == 1
    }
    assert lanes == {"slot 1", "slot 2"}

    # a corrupted copy goes red: one compile dropped, one moved out of its step
    events = data["traceEvents"]
    first = next(i for i, e in enumerate(events) if e["ph"] == "X" and e["args"].get("unit"))
    dropped = {**data, "traceEvents": events[:first] + events[first + 1 :]}
    assert timingscheck.problems(dropped, built, list(VENDORS))
    moved = {**data, "traceEvents": list(events)}
    moved["traceEvents"][first] = {**events[first], "ts": events[first]["ts"] + 10**9}
    assert timingscheck.problems(moved, built, list(VENDORS))


def test_kiln_timings_makes_the_same_trace_from_the_logs(built: Path, tmp_path: Path) -> None:
    res = run_kiln("timings", built, "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    again = json.loads((tmp_path / timings.TRACE_NAME).read_text())
    assert again == json.loads((built / timings.TRACE_NAME).read_text())
    # the release folder names the same build
    res = run_kiln("timings", built.parent.parent / "test-release", "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "r" / timings.TRACE_NAME).read_text()) == again


def test_the_page_renders_in_headless_chromium(built: Path, tmp_path: Path) -> None:
    if timingscheck.chromium() is None:
        missing("CHROMIUM", "no chromium (apt-get install chromium)")
    shot = SHOTS / "fixture-build.png"
    dom, console = timingscheck.open_page(built / timings.HTML_NAME, shot)
    compiles = timingscheck.compiled_records(built, list(VENDORS))
    assert dom.count('class="unit compile') == len(compiles) == 12
    assert '<svg id="gantt"' in dom and '<svg id="memory"' in dom and '<svg id="concurrency"' in dom
    assert dom.count('class="phase') >= 5 * len(VENDORS)
    assert console == []
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")

    # the console check can fail: a page whose script throws
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>throw new Error('kiln-test')</script></body></html>")
    _, console = timingscheck.open_page(bad, None)
    assert any("kiln-test" in line for line in console)


def test_a_failed_build_still_writes_its_timings(tmp_path: Path, build_python: Path) -> None:
    res, logs = _build(tmp_path, build_python, ("solo",), fails="solo")
    assert res.returncode == BuildError.exit_code, res.stderr
    data = json.loads((logs / timings.TRACE_NAME).read_text())
    assert len(timingscheck.compiled_records(logs, ["solo"])) == 4
    assert timingscheck.problems(data, logs, ["solo"]) == []
    assert (logs / timings.HTML_NAME).is_file()


def test_four_hundred_units_on_sixteen_lanes_each_stand_apart(tmp_path: Path) -> None:
    """Issue 35: back-to-back units of one step on one lane are drawn each with its own
    edge (a white outline: in the step's colour they merged into one band) and a label
    where one fits, a tooltip always; 400 units on 16 slots in headless Chromium (the
    screenshot is kept in build/test-output/timings/)."""
    if timingscheck.chromium() is None:
        missing("CHROMIUM", "no chromium (apt-get install chromium)")
    logs = tmp_path / "logs" / "many"
    logs.mkdir(parents=True)
    t0 = 1_800_000_000.0
    lines = []
    for lane in range(16):
        for k in range(25):  # back to back: each starts where the one before ended
            start = t0 + 5 + k * 10
            lines.append(
                {
                    "compiler": "nvcc", "source": f"csrc/l{lane:02d}/u{k:02d}.cu",
                    "result": "compiled", "rc": 0, "rss_kib": 1 << 20, "cpu_s": 9.0,
                    "wall_s": 10.0, "start": start, "waited_s": 0.2 if k else 5.0,
                    "where": "local",
                }
            )  # fmt: skip
    (logs / "big.jobs").write_text("".join(json.dumps(x) + "\n" for x in lines))
    phases = [("fetch", 0, 2), ("patch", 2, 4), ("build", 4, 256), ("package", 256, 260)]
    (logs / "big.phases").write_text(
        "".join(
            json.dumps({"phase": p, "start": t0 + a, "end": t0 + b}) + "\n" for p, a, b in phases
        )
    )
    (logs / "budget.json").write_text(json.dumps({"mem_gib": 64.0, "cpus": 16}))
    res = run_kiln("timings", logs, "--out", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    shot = SHOTS / "four-hundred-units.png"
    dom, console = timingscheck.open_page(tmp_path / "out" / timings.HTML_NAME, shot)
    assert console == []
    assert dom.count('class="unit compile local') == 400
    # each unit outlined in white (its own edge), each with its tooltip
    assert (
        dom.count('stroke="#fff"') >= 400
        and dom.count("<title>u") + dom.count("<title>csrc/l") >= 400
    )
    labels = dom.count('<text class="inbar"')
    assert labels >= 400, labels  # ~40 px a unit here: every one labelled
    assert "waiting at the gate" in dom and "CPUs used" in dom
    print(f"screenshot: {shot}")
