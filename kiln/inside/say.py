"""kiln's own words, one channel: a command's result on stdout (what scripts read), a
report for people on stderr (kiln's log lines, ``kiln: ...``, go there through
:class:`Handler`), a command's output echoed as it comes (:func:`raw`), and, under GitHub
Actions, workflow commands and fold groups (``::group::``/``::endgroup::``: each build
step's output folded under its name, as cibuildwheel folds each build).

Every write is whole under one lock, so lines of threads (the vendors build at once) never
cut into each other, and a fold group printed at once is never split. Standard library
only: the build step's own process says its words here too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

_lock = threading.RLock()


def in_actions() -> bool:
    """Under GitHub Actions (workflow commands and fold groups are read there)."""
    return os.environ.get("GITHUB_ACTIONS") == "true"


def _write(stream: TextIO, text: str) -> None:
    with _lock:
        stream.write(text)
        stream.flush()


def result(text: object) -> None:
    """A command's result, on stdout (what scripts read: a path, a table, JSON)."""
    _write(sys.stdout, f"{text}\n")


def report(text: object) -> None:
    """A report for people, on stderr (a verify's differences, an error, a log line)."""
    _write(sys.stderr, f"{text}\n")


def raw(text: str) -> None:
    """A command's output as it comes (``--echo``: one step at a time), on stderr."""
    _write(sys.stderr, text)


def reports() -> TextIO:
    """Where reports go, for a writer that draws its own (the live table, the summary)."""
    return sys.stderr


def command(line: str) -> None:
    """A GitHub Actions workflow command (``::error ...::``), on stdout, where the runner
    reads it; nothing outside Actions."""
    if in_actions():
        _write(sys.stdout, f"{line}\n")


@contextlib.contextmanager
def group(title: str) -> Iterator[None]:
    """Under Actions, what is said inside folded under ``title`` (one at a time: a step
    whose output is echoed as it comes). Outside Actions, nothing added."""
    if not in_actions():
        yield
        return
    _write(sys.stderr, f"::group::{title}\n")
    try:
        yield
    finally:
        _write(sys.stderr, "::endgroup::\n")


def folded(title: str, text: str) -> None:
    """Under Actions, ``text`` (a finished step's output) printed at once, folded under
    ``title``; outside Actions, nothing (the step's log holds it)."""
    if not in_actions():
        return
    body = text if text.endswith("\n") or not text else text + "\n"
    _write(sys.stderr, f"::group::{title}\n{body}::endgroup::\n")


class Handler(logging.Handler):
    """kiln's log records as reports: ``kiln: MESSAGE``."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("kiln: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            report(self.format(record))
        except Exception:  # logging's own rule: a record that cannot be said is dropped
            self.handleError(record)


def configure_logging(level: int) -> None:
    """The root logger says its records through this channel, from ``level`` up."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(Handler())
    root.setLevel(level)
