"""``kiln build --fix`` applies this run's fixes only (issue 55 (3)): a failure record of
an earlier run, or of a vendor not in this run, is never applied (it edited a vendor not
in the run, and created ``vendors/<name>.toml`` holding one key after that vendor was
deleted); a vendor file that does not exist is not created; a failure with no mechanical
fix is said, with why."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from kiln.orchestrate import fixes


def _record(
    logs: Path, vendor: str, edit: Mapping[str, object] | None, row: str, age: float
) -> None:
    path = logs / f"{vendor}.failure.json"
    cause: dict[str, object] = {"row": row}
    if edit is not None:
        cause["edit"] = dict(edit)
    path.write_text(json.dumps({"vendor": vendor, "cause": cause}))
    then = time.time() - age
    os.utime(path, (then, then))


def test_only_this_runs_records_of_its_vendors_with_existing_files_are_applied(
    tmp_path: Path,
) -> None:
    ws, logs = tmp_path / "ws", tmp_path / "logs"
    (ws / "vendors").mkdir(parents=True)
    logs.mkdir()
    for name in ("a", "old", "other", "patched"):
        (ws / "vendors" / f"{name}.toml").write_text("[build]\n")
    flag = {"file": "vendors/a.toml", "keys": ["build", "nvcc_append_flags"], "append": ["-x"]}
    _record(logs, "a", flag, "cxx-standard", 0)
    _record(logs, "old", {**flag, "file": "vendors/old.toml"}, "cxx-standard", 3600)
    _record(logs, "other", {**flag, "file": "vendors/other.toml"}, "cxx-standard", 0)
    _record(logs, "gone", {**flag, "file": "vendors/gone.toml"}, "cxx-standard", 0)
    _record(logs, "patched", None, "ptx-instruction", 0)
    _record(logs, "unknown", None, "", 0)
    since = time.time() - 60
    found = fixes.pending(logs, ws, since, {"a", "old", "gone", "patched", "unknown"})
    assert [(e.vendor, e.file) for e in found.edits] == [("a", "vendors/a.toml")]
    assert found.skipped == [
        "gone: vendors/gone.toml does not exist: --fix creates no vendor file",
        "patched: its fix (ptx-instruction) is not a mechanical edit: apply it by hand",
        "unknown: no cause row knew its failure: nothing to apply",
    ]
    # without the filters (as before): the old record and the other vendor's applied too
    every = fixes.pending(logs, ws, 0.0, None)
    assert {e.vendor for e in every.edits} == {"a", "old", "other"}
    assert not (ws / "vendors" / "gone.toml").exists()
