"""One ``python -m kiln`` run of a benchmark: its output kept in a log, its wall timed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(args: list[str], log: Path) -> tuple[int, float, str]:
    """(exit code, wall seconds, stderr) of ``kiln ARGS``, run from the repository with
    this Python; stdout and stderr both written to ``log``."""
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    wall = time.monotonic() - started
    log.write_text(res.stdout + res.stderr)
    return res.returncode, wall, res.stderr
