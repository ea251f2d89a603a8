"""Learned data that travels (issue 24): the workspace's learned.json and a release
manifest's ``learned`` records, which one wins, a bad file as one line; and the bound a
build prints (the critical path, the CPU floor)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kiln.errors import ConfigError
from kiln.orchestrate import learned
from kiln.plan import bound, schedule
from kiln.plan.jobs import JobLine
from tests.conftest import artifacts_files, build_args, run_kiln
from tests.unit.test_schedule import _vendor
from tests.workspace import plain_vendor, write

UNIT: JobLine = {"result": "compiled", "rc": 0}


def _learn(store: schedule.PeakStore, vendor, cpu: float, rss_gib: float) -> None:
    stats: list[JobLine] = [
        {**UNIT, "source": "csrc/k.cu", "cpu_s": cpu, "rss_kib": int(rss_gib * 2**20)}
    ]
    store.remember(vendor, rss_gib, schedule.learned_units(stats), 4.0)


def test_learned_json_round_trips_and_fills_what_the_cache_does_not_know(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    v, other = _vendor("v"), _vendor("w")
    elsewhere = schedule.PeakStore(tmp_path / "elsewhere" / "peaks.json")
    _learn(elsewhere, v, 170.0, 5.0)
    _learn(elsewhere, other, 10.0, 1.0)
    ws = tmp_path / "ws"
    ws.mkdir()
    written = learned.save(ws, elsewhere, [v, other])
    data = json.loads(written.read_text())
    assert data["schema"] == learned.SCHEMA_ID
    assert data["vendors"]["v"]["units"] == {"csrc/k.cu": {"cpu_s": 170.0, "rss_gib": 5.0}}
    assert data["vendors"]["v"]["archs"] == ["sm_100a", "sm_103a"]

    # A fresh cache: everything from the workspace's file.
    fresh = learned.open_store(tmp_path / "fresh", ws, None, [v, other])
    assert fresh.units(v) == {"csrc/k.cu": {"cpu_s": 170.0, "rss_gib": 5.0}}
    assert schedule.estimate(v, fresh) == (6.25, "learned")

    # This cache's own figures win over the workspace's ...
    mine = schedule.PeakStore(tmp_path / "mine" / "peaks.json")
    _learn(mine, v, 150.0, 4.0)
    mine.save()
    kept = learned.open_store(tmp_path / "mine", ws, None, [v, other])
    assert kept.units(v)["csrc/k.cu"]["cpu_s"] == 150.0
    assert kept.units(other)["csrc/k.cu"]["cpu_s"] == 10.0  # ... filled where it knew none
    # ... and --learned-from, named, wins over both.
    named = learned.open_store(tmp_path / "mine", tmp_path / "none", written, [v, other])
    assert named.units(v)["csrc/k.cu"]["cpu_s"] == 170.0

    # Another recipe (other archs): its figures are not used, and the build says so.
    narrowed = _vendor("v", archs=["sm_100a"])

    def warned() -> list[str]:
        """What kiln's learned module warned (other tests may leave kiln's INFO on)."""
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "kiln.orchestrate.learned" and r.levelno >= logging.WARNING
        ]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kiln.orchestrate.learned"):
        assert learned.open_store(tmp_path / "fresh2", ws, None, [narrowed]).units(narrowed) == {}
    (said,) = warned()
    assert said.startswith(f"{written}: the figures of v were learned with another recipe")
    assert "kiln build --save-learned" in said
    caplog.clear()
    learned.open_store(tmp_path / "fresh3", ws, None, [v, other])
    assert warned() == []  # current figures: nothing said
    # nor where --learned-from brings the figures of the recipe as it is now
    ws_narrowed = tmp_path / "ws-narrowed"
    ws_narrowed.mkdir()
    narrowed_store = schedule.PeakStore(tmp_path / "narrowed" / "peaks.json")
    _learn(narrowed_store, narrowed, 90.0, 2.0)
    now = learned.save(ws_narrowed, narrowed_store, [narrowed])
    with caplog.at_level(logging.WARNING, logger="kiln.orchestrate.learned"):
        given = learned.open_store(tmp_path / "fresh4", ws, now, [narrowed])
    assert given.units(narrowed)["csrc/k.cu"]["cpu_s"] == 90.0
    assert warned() == []


def test_examples_public_learned_json_is_for_the_recipes_ci_builds() -> None:
    """.ci/run builds examples/public with --profile sm100 and a cold cache: its
    committed learned.json is all the schedule knows there (the longest units first, each
    unit's own memory at the gate). A recipe changed since it was saved leaves it unused
    (it was, silently: FlashMLA's 24 units one at a time at the recipe's 10 GiB each, a
    DeepGEMM unit waiting 954 s behind them): refresh it from a run of the changed recipe
    (`kiln build --profile sm100 --save-learned`, or from CI's run.json)."""
    from kiln.config.workspace import Workspace
    from tests import public

    vendors = list(Workspace(public.WORKSPACE, "sm100").vendors.values())
    entries = learned.read(public.WORKSPACE / learned.FILE_NAME, "learned data")
    empty = schedule.PeakStore(Path("/nonexistent/peaks.json"))
    assert learned.stale_entries(entries, empty, vendors) == []
    assert sorted(entries) == sorted(v.name for v in vendors)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "no such file"),
        ("{not json", "not JSON (Expecting property name enclosed in double quotes, line 1)"),
        ('{"schema": "kiln.other/3"}', "neither a kiln manifest nor kiln's learned data"),
        (
            '{"schema": "kiln.learned/1", "vendors": {"v": {"recipe": "x", "units": {}}}}',
            "vendors/v/peak_job_gib: Field required",
        ),
        ('{"schema": "kiln.manifest/1", "vendors": {}}', "kiln_version: Field required"),
    ],
)
def test_a_bad_learned_file_is_one_line_naming_it_and_the_fix(
    tmp_path: Path, text: str | None, problem: str
) -> None:
    path = tmp_path / "learned.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        learned.read(path, "--learned-from")
    message = str(err.value)
    assert message.startswith(f"--learned-from {path}") and problem in message, message
    assert message.endswith(learned.FIX) and "\n" not in message


def test_build_with_a_bad_learned_from_stops_before_anything_is_written(tmp_path: Path) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor("a" * 40)})
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "kiln.learned/1", "vendors": []}')
    res = run_kiln(*build_args(ws, tmp_path, "--learned-from", bad, runner=None))
    assert res.returncode == ConfigError.exit_code, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert f"--learned-from {bad}: vendors: Input should be a valid dictionary" in line
    assert artifacts_files(tmp_path / "artifacts") == []


def test_the_bound_is_the_larger_of_the_critical_path_and_the_cpu_floor() -> None:
    stats: list[JobLine] = [
        {**UNIT, "source": "csrc/fmha_bwd.cu", "wall_s": 45.0, "cpu_s": 44.0},
        {**UNIT, "source": "csrc/small.cu", "wall_s": 5.0, "cpu_s": 5.0},
        {"result": "other", "rc": 0, "wall_s": 3.0},  # the link
        {"result": "other", "rc": 1, "wall_s": 30.0},  # a failed probe: not the link
        {"result": "objcache-hit", "rc": 0, "source": "csrc/x.cu", "wall_s": 0.1},
    ]
    path = bound.step_path(stats, {"build": 60.0, "package": 2.5, "verify": 1.5}).to_json()
    assert path == {
        "longest_unit": "csrc/fmha_bwd.cu",
        "longest_unit_s": 45.0,
        "link_s": 3.0,
        "critical_path_s": 52.0,
    }
    paths: dict[str, bound.PathFigures] = {"flashmla": path, "deepgemm": {"critical_path_s": 9.0}}
    by_path = bound.bound(paths, 400.0, 16, 104.0)
    assert by_path is not None
    assert (by_path["bound_by"], by_path["cpu_floor_s"], by_path["wall_over_bound"]) == (
        "critical path",
        25.0,
        2.0,
    )
    assert by_path["critical_vendor"] == "flashmla"
    line = bound.describe(by_path, paths)
    assert line == (
        "bound: critical path 52.0 s (flashmla: csrc/fmha_bwd.cu 45.0 s + links 3.0 s + "
        "packaging 4.0 s); CPU floor 25.0 s (400 compile CPU-s / 16 CPU slots); wall 104.0 s "
        "= 2.00 x the critical path"
    )
    by_floor = bound.bound(paths, 2000.0, 16, 130.0)
    assert by_floor is not None and by_floor["bound_by"] == "CPU floor"
    assert by_floor["wall_over_bound"] == 1.04
    assert bound.bound({}, 0.0, 16, 3.0) is None  # nothing compiled (all reused)
    # issue 41: the provisioning before the first step is said, and not held against the
    # steps' schedule (a cold build read "1.94 x the critical path" for it)
    cold = bound.bound(paths, 400.0, 16, 304.0, 200.0)
    assert cold is not None and (cold["wall_over_bound"], cold["provision_s"]) == (2.0, 200.0)
    assert bound.describe(cold, paths).endswith(
        "wall 304.0 s: provisioning 200.0 s, then the steps 104.0 s = 2.00 x the critical path"
    )


def test_the_new_fields_are_in_the_committed_schema() -> None:
    """The bound and the learned records are in the manifest's JSON Schema (test_layout
    holds the committed file equal to what the models make)."""
    from kiln.release import manifest

    schema = json.loads(manifest.committed_schema_text())
    defs = schema["$defs"]
    assert "bound" in defs["Scheduler"]["properties"]
    assert set(defs["Bound"]["required"]) >= {"critical_path_s", "cpu_floor_s", "wall_s"}
    assert "learned" in defs["VendorEntry"]["properties"]
    assert set(defs["LearnedVendor"]["properties"]) == {
        "recipe",
        "archs",
        "peak_job_gib",
        "tail_cpu_s",
        "units",
        "memory",
    }
    assert "critical_path_s" in defs["Schedule"]["properties"]
