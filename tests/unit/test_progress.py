"""The progress display: live on a terminal, plain lines elsewhere, a summary always."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from rich.console import Console

from kiln.orchestrate.progress import Display


def test_off_a_terminal_every_state_change_is_one_plain_line(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    display = Display(["alpha", "beta"])  # pytest's stderr is not a terminal
    assert not display.live
    with caplog.at_level(logging.INFO, logger="kiln"), display:
        display.update("alpha", "building", "jobs 2")
        display.update("beta", "cached", "artifact cache 0123", cache="hit")
        display.update("alpha", "done")
    assert [r.getMessage() for r in caplog.records] == [
        "alpha: building (jobs 2)",
        "beta: cached (artifact cache 0123)",
        "alpha: done",
    ]
    display.print_summary()
    err = capsys.readouterr().err
    assert "\x1b[" not in err  # no terminal control codes in CI logs
    for word in ("step", "runner", "cache", "time", "peak memory", "alpha", "beta", "hit"):
        assert word in err


def test_on_a_terminal_a_live_table_shows_state_time_and_memory(tmp_path: Path) -> None:
    mem = tmp_path / "alpha.mem"
    mem.write_text(json.dumps({"current_kib": 3 * 2**20, "peak_kib": 4 * 2**20}))
    display = Display(["alpha"], live=True)
    out = io.StringIO()
    display.console = Console(file=out, force_terminal=True, width=100)
    with display:
        display.update("alpha", "building", "jobs 2", mem_file=mem)
        display._live.refresh()  # type: ignore[union-attr]
    text = out.getvalue()
    assert "\x1b[" in text  # drawn as a live terminal view
    assert "building" in text and "3.00 GiB" in text and "jobs 2" in text
    summary = io.StringIO()
    Console(file=summary, width=100).print(display.summary())
    assert "4.00 GiB" in summary.getvalue()  # the peak, once the step has ended


def test_a_live_run_leaves_only_the_summary_on_the_terminal() -> None:
    """Issue 35: on a terminal the live table goes when the run ends; its title and
    border are not left standing above the summary. What the screen shows is read back
    through a terminal emulator (pyte), escape codes and all."""
    import io

    import pyte
    from rich.console import Console

    buf = io.StringIO()
    display = Display(["alpha", "beta"], live=True)
    display.console = Console(
        file=buf, force_terminal=True, width=100, height=40, color_system=None
    )
    with display:
        display.update("alpha", "building", "jobs 2")
        display.refresh()  # the live table is drawn (as its own refresh would)
        display.update("alpha", "done", "ok")
        display.update("beta", "done", "ok")
    display.print_summary()
    assert "kiln build" in buf.getvalue()  # the live table was on screen
    screen = pyte.Screen(100, 40)
    pyte.Stream(screen).feed(buf.getvalue().replace("\n", "\r\n"))
    shown = [line.rstrip() for line in screen.display if line.strip()]
    assert shown[0].strip() == "kiln build summary", shown
    assert sum("┏" in line for line in shown) == 1  # one table: the summary's
