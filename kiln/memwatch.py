"""Memory of a process tree, sampled (standard library only: it runs in containers).

The resident set sizes of a process and all its descendants are summed every
``interval`` seconds; the peak and the latest sum are kept and, when a file is
given, written there as JSON so another process (kiln's progress display, the
manifest) can read them. Shared pages are counted once per process, so the sum
overstates a little: the safe side for a memory budget.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: split after the last ')'.
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children first)."""
    kids = _children_map()
    found, todo = [], list(kids.get(root, ()))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(kids.get(pid, ()))
    return found


def tree_rss_kib(root: int) -> int:
    return sum(_rss_kib(pid) for pid in [root, *descendants(root)])


class Watcher:
    """Samples ``tree_rss_kib(pid)`` in a daemon thread until :meth:`stop`."""

    def __init__(self, pid: int, out: Path | None = None, interval: float = 0.5) -> None:
        self.pid, self.out, self.interval = pid, out, interval
        self.peak_kib = self.current_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="memwatch")

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sample(self) -> None:
        self.current_kib = tree_rss_kib(self.pid)
        self.peak_kib = max(self.peak_kib, self.current_kib)
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
