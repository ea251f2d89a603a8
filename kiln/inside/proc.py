"""The one place kiln starts subprocesses.

Every command is logged (to the logger, and to a per-step log file when one is
given). On failure the error carries the tail of the output and the log's path,
so the user sees why without digging.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import BuildError, KilnError
from kiln.inside import say

log = logging.getLogger(__name__)

TAIL_LINES = 25


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


# Every command running now, so that Ctrl-C in the main thread can stop the ones that
# build threads started (their process groups do not get the terminal's SIGINT).
_live: set[subprocess.Popen[str]] = set()
_live_lock = threading.Lock()


def kill_all() -> None:
    """Kill every command this process runs now (and its children)."""
    with _live_lock:
        for proc in list(_live):
            _kill_group(proc)


def _watch_idle(
    proc: subprocess.Popen[str], last: list[float], idle: float, stalled: threading.Event
) -> None:
    while proc.poll() is None:
        if time.monotonic() - last[0] > idle:
            stalled.set()
            _kill_group(proc)
            return
        time.sleep(min(1.0, idle / 4))


def _render(cmd: Sequence[str | os.PathLike[str]]) -> str:
    return shlex.join(str(c) for c in cmd)


class Streamer:
    """One command's output on its way out, wherever it runs (a process here, a build
    container's log stream): kept whole for the caller, its last lines for the error,
    appended to the step's log file, and with ``echo`` copied to stderr line by line."""

    def __init__(self, log_file: Path | None, echo: bool, header: str) -> None:
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._chunks: list[str] = []
        self._pending = ""
        self.echo = echo
        self.sink = None
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            self.sink = log_file.open("a", encoding="utf-8", errors="replace")
            self.sink.write(f"$ {header}\n")
            self.sink.flush()

    def line(self, text: str) -> None:
        """One line of output (with or without its newline)."""
        text = text if text.endswith("\n") else text + "\n"
        self._chunks.append(text)
        self.tail.append(text.rstrip("\n"))
        if self.sink is not None:
            self.sink.write(text)
            self.sink.flush()
        if self.echo:
            say.raw(text)

    def feed(self, text: str) -> None:
        """Output in arbitrary pieces (a container's log stream): split into lines."""
        *lines, self._pending = (self._pending + text).split("\n")
        for ln in lines:
            self.line(ln)

    def close(self) -> None:
        if self._pending:
            last, self._pending = self._pending, ""
            self._chunks.append(last)
            self.tail.append(last)
            if self.sink is not None:
                self.sink.write(last)
        if self.sink is not None:
            self.sink.close()
            self.sink = None

    @property
    def output(self) -> str:
        return "".join(self._chunks)

    def failure(self, what: str, rc: int, log_file: Path | None, where: str = "") -> str:
        """The one message for a command that failed: its exit code, log and last lines."""
        logged = f"; full log: {log_file}" if log_file else ""
        tail_text = "\n".join(f"    {t}" for t in self.tail)
        return f"{what} failed with exit code {rc}{where}{logged}\n{tail_text}"


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    log_file: Path | None = None,
    check: bool = True,
    error: type[KilnError] = BuildError,
    what: str | None = None,
    echo: bool = False,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    returns: Collection[int] = (),
) -> Result:
    """Run ``cmd``; return its combined stdout+stderr.

    ``log_file`` receives the command line and the full output (appended).
    ``echo`` also streams the output to stderr, line by line (long builds).
    With ``check`` a non-zero exit (other than those in ``returns``, which the caller
    reads itself) raises ``error`` naming ``what`` (or the command), the exit code, the
    output's last lines and the log path.
    ``idle_timeout``: a command that prints nothing for that long is stalled: it is
    killed and ``error`` raised, whatever ``check`` says (a fetch whose server accepted
    the connection and then went silent would otherwise wait for ever).
    """
    line = _render(cmd)
    log.debug("$ %s%s", line, f"  (in {cwd})" if cwd else "")
    out = Streamer(log_file, echo, line)
    try:
        try:
            proc = subprocess.Popen(
                [str(c) for c in cmd],
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                # Its own process group, so an abort can stop the whole tree (pip ->
                # setup.py -> ninja -> nvcc), not just the first child.
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise error(
                f"{what or line}: command not found: {cmd[0]} (install it or fix PATH)"
            ) from exc
        assert proc.stdout is not None
        with _live_lock:
            _live.add(proc)
        timer = threading.Timer(timeout, _kill_group, (proc,)) if timeout else None
        if timer:
            timer.start()
        last = [time.monotonic()]
        stalled = threading.Event()
        if idle_timeout:
            threading.Thread(
                target=_watch_idle, args=(proc, last, idle_timeout, stalled), daemon=True
            ).start()
        try:
            for out_line in proc.stdout:
                last[0] = time.monotonic()
                out.line(out_line)
            rc = proc.wait()
        except BaseException:
            # Ctrl-C or anything else: never leave the children running.
            _kill_group(proc)
            proc.wait()
            raise
        finally:
            with _live_lock:
                _live.discard(proc)
            if timer:
                timer.cancel()
        if timer and timer.finished.is_set() and rc == -signal.SIGKILL:
            # What it printed before the kill goes with it (an import that hangs is
            # judged from its last lines).
            raise subprocess.TimeoutExpired([str(c) for c in cmd], timeout or 0, output=out.output)
        if stalled.is_set():
            raise error(
                f"{what or line} stalled: no data for {idle_timeout:g} s, so kiln stopped it"
            )
    finally:
        out.close()
    if check and rc != 0 and rc not in returns:
        raise error(out.failure(what or line, rc, log_file), output=out.output)
    return Result(rc, out.output)


def output(cmd: Sequence[str | os.PathLike[str]], **kwargs: object) -> str:
    """Run a short query command and return its stripped output."""
    return run(cmd, **kwargs).output.strip()  # type: ignore[arg-type]
