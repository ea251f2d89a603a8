"""The benchmarks behind the performance figures cannot rot unseen (issue 42 (4)): each
parses its arguments (``--help``: the module imports, its parser builds), and the report
code of the one whose report crashed after a whole run (manycore: a local name shadowed
``kiln.plan.jobs``) runs on a tiny workload of records."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCHMARKS = sorted(
    p.name
    for p in (REPO / "benchmarks").glob("*.py")
    if "__main__" in p.read_text()  # the scripts (kilnrun.py is their helper)
)


@pytest.mark.parametrize("script", BENCHMARKS)
def test_each_benchmark_parses_its_arguments(script: str) -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage:" in res.stdout


def test_manycore_reports_a_tiny_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kiln_timeline over a step's compiler records, then the report's table, as after a
    real run (both went unrun by every check while the timeline raised NameError)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import manycore

    began = time.time()
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        {"source": "a.cu", "result": "compiled", "start": began + 1, "wall_s": 4.0, "cpu_s": 4},
        {"source": "b.cu", "result": "compiled", "start": began + 2, "wall_s": 9.0, "cpu_s": 8},
        {"source": None, "result": "other", "start": began + 11, "wall_s": 1.0, "cpu_s": 1},
    ]
    (logs / "v.jobs").write_text("".join(json.dumps(x) + "\n" for x in lines))
    timeline = manycore.kiln_timeline(logs, began, 13.0)
    assert timeline["longest_unit"] == "b.cu" and timeline["last_compiler_end_s"] == 12.0
    results = {
        "machine": {"cores": 2, "threads_per_core": 1, "mem_gib": 24, "python": "3.11"},
        "flashmla": {
            "naive": {"wall_s": 20.0, "cpu_s": 30},
            "cold": {
                "wall_s": 13.0,
                "cpu_s": 14,
                "bound": {"critical_path_s": 10.0, "cpu_floor_s": 7.0},
                "timeline": timeline,
                "bound_line": "bound: critical path",
            },
        },
    }
    table = manycore.report(results)
    assert "| flashmla |" in table and "1.30" in table  # 13 s against a 10 s bound
