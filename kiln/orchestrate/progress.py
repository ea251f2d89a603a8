"""What a build is doing, for people: a live table on a terminal, plain lines in CI.

Each step (one vendor) moves through states (queued, fetching, building,
verifying, done, cached, failed); its elapsed time and memory (read from the
step's memory file, written by :mod:`kiln.memwatch` where the step runs) are
shown live with rich when stderr is a terminal. Off a terminal every state
change is one log line. Either way a summary table ends the run, and under it the
build's bound (``kiln/plan/bound.py``: the critical path, the CPU floor, the wall time
against both).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kiln.inside import memwatch, say
from kiln.orchestrate import github

log = logging.getLogger(__name__)


@dataclass
class StepView:
    name: str
    state: str = "queued"
    detail: str = ""
    started: float | None = None
    ended: float | None = None
    mem_file: Path | None = None
    peak_kib: int = 0
    runner: str = ""
    cache: str = ""
    error: BaseException | None = None  # a failed step's error (its explained message)

    def elapsed(self) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.started

    def memory(self) -> tuple[int, int]:
        if self.mem_file is None:
            return 0, self.peak_kib
        m = memwatch.read(self.mem_file)
        self.peak_kib = max(self.peak_kib, m["peak_kib"])
        current = m["current_kib"] if self.ended is None else 0
        return current, self.peak_kib


def _gib(kib: int) -> str:
    return f"{kib / 2**20:.2f} GiB" if kib else "-"


class Display:
    """Thread-safe: build threads call :meth:`update`; the live view refreshes itself."""

    def __init__(self, names: list[str], live: bool | None = None) -> None:
        self.console = Console(file=say.reports())  # kiln's one channel's stream
        self.live = self.console.is_terminal if live is None else live
        self.steps = {n: StepView(n) for n in names}
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __enter__(self) -> Display:
        if self.live:
            # transient: the live table goes when the run ends, and the summary takes its
            # place (left on screen, its title and border stood stale above the summary)
            self._live = Live(
                get_renderable=self._table,
                console=self.console,
                refresh_per_second=2,
                transient=True,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def refresh(self) -> None:
        """Draw the live table now (it also redraws itself twice a second)."""
        if self._live is not None:
            self._live.refresh()

    def update(self, name: str, state: str, detail: str = "", **fields: Any) -> None:
        with self._lock:
            step = self.steps[name]
            if step.started is None and state not in ("queued",):
                step.started = time.monotonic()
            if state in ("done", "cached", "failed"):
                step.ended = time.monotonic()
            step.state, step.detail = state, detail
            for key, value in fields.items():
                setattr(step, key, value)
        if not self.live:
            log.info("%s: %s%s", name, state, f" ({detail})" if detail else "")

    def _table(self) -> Table:
        table = Table(title="kiln build", expand=False)
        for col in ("step", "state", "elapsed", "memory", "detail"):
            table.add_column(col)
        with self._lock:
            for s in self.steps.values():
                current, peak = s.memory()
                table.add_row(
                    s.name, s.state, f"{s.elapsed():.0f} s", _gib(current or peak), Text(s.detail)
                )
        return table

    SUMMARY_COLUMNS = ("step", "runner", "cache", "state", "time", "peak memory", "result")

    def summary_rows(self) -> list[tuple[str, ...]]:
        with self._lock:
            return [
                (
                    s.name,
                    s.runner,
                    s.cache,
                    s.state,
                    f"{s.elapsed():.1f} s",
                    _gib(s.memory()[1]),
                    s.detail,
                )
                for s in self.steps.values()
            ]

    def failures(self) -> list[str]:
        """Each failed step's whole explanation (first errors, cause, fix, full log)."""
        with self._lock:
            return [str(s.error) for s in self.steps.values() if s.error is not None]

    def summary(self) -> Table:
        table = Table(title="kiln build summary")
        for col in self.SUMMARY_COLUMNS:
            # nothing cut: a failed step's first error and paths wrap, whole
            table.add_column(col, overflow="fold")
        for row in self.summary_rows():
            table.add_row(*(Text(cell) for cell in row))  # text, not rich markup
        return table

    def print_summary(self, *lines: str) -> None:
        """The summary table, and below it ``lines`` (a build that released has what
        bounded it, and what the compiler cache answered), each one line for grep."""
        console = self.console if self.live else Console(file=say.reports(), width=100)
        console.print(self.summary())
        for line in lines:
            console.print(Text(line), soft_wrap=True)
        github.write_step_summary(
            "kiln build summary",
            self.SUMMARY_COLUMNS,
            self.summary_rows(),
            self.failures(),
            "\n\n".join(lines),
        )
