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
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import BuildError, KilnError

log = logging.getLogger("kiln.proc")

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
) -> Result:
    """Run ``cmd``; return its combined stdout+stderr.

    ``log_file`` receives the command line and the full output (appended).
    ``echo`` also streams the output to stderr, line by line (long builds).
    With ``check`` a non-zero exit raises ``error`` naming ``what`` (or the
    command), the exit code, the output's last lines and the log path.
    ``idle_timeout``: a command that prints nothing for that long is stalled: it is
    killed and ``error`` raised, whatever ``check`` says (a fetch whose server accepted
    the connection and then went silent would otherwise wait for ever).
    """
    line = _render(cmd)
    log.debug("$ %s%s", line, f"  (in {cwd})" if cwd else "")
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    chunks: list[str] = []
    sink = None
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        sink = log_file.open("a", encoding="utf-8", errors="replace")
        sink.write(f"$ {line}\n")
        sink.flush()
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
                chunks.append(out_line)
                tail.append(out_line.rstrip("\n"))
                if sink is not None:
                    sink.write(out_line)
                if echo:
                    sys.stderr.write(out_line)
                    sys.stderr.flush()
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
            raise subprocess.TimeoutExpired([str(c) for c in cmd], timeout or 0)
        if stalled.is_set():
            raise error(
                f"{what or line} stalled: no data for {idle_timeout:g} s, so kiln stopped it"
            )
    finally:
        if sink is not None:
            sink.close()
    output = "".join(chunks)
    if check and rc != 0:
        where = f"; full log: {log_file}" if log_file else ""
        tail_text = "\n".join(f"    {t}" for t in tail)
        raise error(f"{what or line} failed with exit code {rc}{where}\n{tail_text}")
    return Result(rc, output)


def output(cmd: Sequence[str | os.PathLike[str]], **kwargs: object) -> str:
    """Run a short query command and return its stripped output."""
    return run(cmd, **kwargs).output.strip()  # type: ignore[arg-type]
