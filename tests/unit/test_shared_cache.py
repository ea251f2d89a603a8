"""A cache shared by builds at once (other checkouts, work and artifacts folders): each
entry is made under its lock by one of them while the others wait and reuse it
(``fsutil.making``/``made_once``), git fetches into one bare clone run one at a time,
and the learned compile figures of two builds are merged, not overwritten."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln import fsutil
from kiln.config.mirrors import Mirrors
from kiln.config.models import Vendor
from kiln.plan import schedule
from kiln.sources.checkout import GitCache
from kiln.sources.gitrepo import CommitSpec, make_repo
from tests.conftest import REPO

# A second process that makes ENTRY under its lock, counting its makes in COUNT: it says
# it started (STARTED) and finishes only once told to (GO), so the test's own maker surely
# finds the lock held (an event, not a sleep that hopes to be long enough).
MAKER = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from kiln import fsutil
entry, count, started, go = (Path(a) for a in sys.argv[2:6])
def make():
    started.write_text("1")
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with count.open("a") as fh:
        fh.write("made\\n")
    entry.write_text("whole")
fsutil.made_once(entry, entry.exists, make, "the test entry")
"""


def test_a_second_maker_waits_then_reuses_the_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry, count, started = tmp_path / "cache" / "entry", tmp_path / "count", tmp_path / "started"
    go = tmp_path / "go"
    other = subprocess.Popen(
        [sys.executable, "-c", MAKER, str(REPO), str(entry), str(count), str(started), str(go)]
    )
    deadline = time.monotonic() + 30
    while not started.exists():  # the other process holds the lock and is making it
        assert other.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)

    def make() -> None:
        with count.open("a") as fh:
            fh.write("made\n")
        entry.write_text("whole")

    result: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="kiln.fsutil"):
        mine = threading.Thread(
            target=lambda: result.append(
                fsutil.made_once(entry, entry.exists, make, "the test entry")
            )
        )
        mine.start()
        while not any("waiting for another kiln" in r.message for r in caplog.records):
            assert mine.is_alive() and time.monotonic() < deadline, "it never waited"
            time.sleep(0.02)
        go.write_text("1")  # this maker waits on the lock: now let the other one finish
        mine.join(timeout=30)
    assert other.wait(timeout=30) == 0
    made = result[0]
    assert not made and entry.read_text() == "whole"
    assert count.read_text() == "made\n"  # made once, by the other process
    said = [r.message for r in caplog.records]
    assert any("waiting for another kiln making the test entry" in m for m in said), said


def _three_threads_make_one_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> list[int]:
    """Three threads (three vendors' steps) make one entry; the first to make it goes on
    only once the two others have said they wait on its lock (or have made it too: no
    lock; or after 10 s): the threads surely overlap, whatever the machine's speed.
    Returns the makes."""
    entry = tmp_path / "entry"
    made: list[int] = []

    def waiting() -> int:
        return sum("waiting for another kiln making x" in r.getMessage() for r in caplog.records)

    def make() -> None:
        made.append(1)
        deadline = time.monotonic() + 10
        # (three makes at once: the lock held nothing, no thread will wait)
        while waiting() < 2 and len(made) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        entry.write_text("x")

    with caplog.at_level(logging.WARNING, logger="kiln.fsutil"):
        threads = [
            threading.Thread(target=fsutil.made_once, args=(entry, entry.exists, make, "x"))
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    return made


def test_threads_of_one_process_exclude_each_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each call opens the lock file anew: two threads (two vendors' steps) cannot both
    make one entry."""
    assert _three_threads_make_one_entry(tmp_path, caplog) == [1]


def test_the_exclusion_check_can_fail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the lock broken (a ``making`` that holds nothing), the threads overlap and
    each makes the entry: the check above sees it."""

    @contextlib.contextmanager
    def no_lock(entry: Path, what: str) -> Iterator[None]:
        yield

    monkeypatch.setattr(fsutil, "making", no_lock)
    assert _three_threads_make_one_entry(tmp_path, caplog) == [1, 1, 1]


def test_a_failed_maker_leaves_the_entry_to_the_next(tmp_path: Path) -> None:
    entry = tmp_path / "entry"

    def fail() -> None:
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        fsutil.made_once(entry, entry.exists, fail, "x")

    def make() -> None:
        entry.write_text("x")

    assert fsutil.made_once(entry, entry.exists, make, "x")


def test_write_atomic_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.json"
    fsutil.write_atomic(target, "one")
    fsutil.write_atomic(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


def test_two_fetches_of_one_commit_fetch_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two builds (threads here, each with its own GitCache as each process has) that
    need the same commit of an upstream the cache lacks: one fetches, the other waits,
    then finds the commit (git refuses two fetches updating the same refs at once)."""
    (commit,) = make_repo(tmp_path / "up" / "x.git", [CommitSpec("one", {"a": "a" * 1000})])
    mirrors = Mirrors({"https://x.invalid/": f"{tmp_path / 'up'}/"})
    found: list[str] = []
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            cache = GitCache(tmp_path / "cache", mirrors, offline=True)
            found.append(cache.resolve("https://x.invalid/x.git", commit[:10], "x"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    with caplog.at_level(logging.INFO, logger="kiln.sources.checkout"):
        threads = [threading.Thread(target=resolve) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and found == [commit] * 4
    assert [r.message for r in caplog.records if r.message.startswith("fetching")] == [
        "fetching https://x.invalid/x.git (mirror " + f"{tmp_path / 'up'}/x.git)"
    ]


def _vendor(name: str) -> Vendor:
    return Vendor.model_validate(
        {
            "name": name,
            "source": {"url": f"https://x.invalid/{name}.git", "commit": "a" * 40},
            "build": {"kind": "wheel", "archs": [], "arch_control": "none"},
        }
    )


def test_two_builds_learned_figures_are_merged(tmp_path: Path) -> None:
    """Both builds loaded the file before either saved: the later save keeps the
    earlier one's vendor (it re-reads the file under its lock)."""
    path = tmp_path / "peaks.json"
    first, second = schedule.PeakStore(path), schedule.PeakStore(path)
    first.remember(_vendor("alpha"), 1.5)
    second.remember(_vendor("beta"), 2.5)
    first.save()
    second.save()
    again = schedule.PeakStore(path)
    assert again.learned(_vendor("alpha")) == 1.5 and again.learned(_vendor("beta")) == 2.5
