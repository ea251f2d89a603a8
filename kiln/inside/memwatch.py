"""Memory of a process tree, sampled (standard library only: it runs in containers).

The resident set sizes of a process and all its descendants are summed every
``interval`` seconds; the peak and the latest sum are kept and, when a file is
given, written there as JSON so another process (kiln's progress display, the
manifest) can read them. With ``series``, each sample is also appended there as one
JSON line ``{"t": epoch seconds, "rss_gib": ...}`` (the timings report's memory over
time). Shared pages are counted once per process, so the sum overstates a little: the
safe side for a memory budget.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'.
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def _children_map(known: dict[int, int] | None = None) -> dict[int, list[int]]:
    """Parent -> children of every process. With ``known`` (pid -> ppid, kept between
    calls by a sampler), only processes not seen before are read: a sample then costs a
    directory listing, not a read of every process's stat (it runs every second)."""
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    if known is None:
        known = {}
    else:
        alive = set(pids)
        for gone in [p for p in known if p not in alive]:
            del known[gone]
    kids: dict[int, list[int]] = {}
    for pid in pids:
        ppid = known.get(pid)
        if ppid is None:
            ppid = _ppid(pid)
            if ppid is None:
                continue
            known[pid] = ppid
        kids.setdefault(ppid, []).append(pid)
    return kids


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0


def descendants(root: int, known: dict[int, int] | None = None) -> list[int]:
    """Every process below ``root`` (children first). Without ``known`` every process is
    read afresh (what killing a tree must use: a cached parent of a reused pid would
    name a stranger)."""
    kids = _children_map(known)
    found, todo = [], list(kids.get(root, ()))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(kids.get(pid, ()))
    return found


def tree_rss_kib(root: int, known: dict[int, int] | None = None) -> int:
    return sum(_rss_kib(pid) for pid in [root, *descendants(root, known)])


class Watcher:
    """Samples ``tree_rss_kib(pid)`` in a daemon thread until :meth:`stop`."""

    def __init__(
        self, pid: int, out: Path | None = None, interval: float = 1.0, series: Path | None = None
    ) -> None:
        self.pid, self.out, self.interval, self.series = pid, out, interval, series
        self.peak_kib = self.current_kib = 0
        self._known: dict[int, int] = {}  # pid -> ppid, read once per process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="memwatch")

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sample(self) -> None:
        self.current_kib = tree_rss_kib(self.pid, self._known)
        self.peak_kib = max(self.peak_kib, self.current_kib)
        if self.series is not None:
            sample = {"t": round(time.time(), 3), "rss_gib": round(self.current_kib / 2**20, 4)}
            try:
                with open(self.series, "a") as fh:
                    fh.write(json.dumps(sample) + "\n")
            except OSError:
                pass
        if self.out is not None:
            tmp = self.out.with_name(self.out.name + ".tmp")
            try:
                tmp.write_text(
                    json.dumps({"current_kib": self.current_kib, "peak_kib": self.peak_kib})
                )
                os.replace(tmp, self.out)
            except OSError:
                pass  # a full disk must not stop the build; the log will say so

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._sample()


def read(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
        return {"current_kib": int(data["current_kib"]), "peak_kib": int(data["peak_kib"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {"current_kib": 0, "peak_kib": 0}
