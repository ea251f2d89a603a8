"""Two checkouts building at once with one kiln cache (issue: "the cache in the user's
cache folder, shared safely by checkouts and builds at once"): two copies of a workspace
in different folders, each with its own work/ and artifacts/, started together on one
empty cache. Each cache entry they both need is made once, by one of them, while the
other waits and reuses it: the bare clone and its fetch, the build Python's facts, the
vendor's artifact-cache entry (its step runs once); both succeed, with identical outputs.
The tiny upstream's step waits until the test has seen the other build wait for the
artifact cache entry, so the two builds surely overlap (an event, not a long sleep)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO
from tests.faults.conftest import BUILD_PY, make_tiny, mirrors_file, tiny_build_args, tiny_workspace
from tests.releases import manifest_json

# The tiny upstream's build, held until GO exists: the second build reaches the artifact
# cache while the first is still building (without the entry's lock it would build it too).
HELD_BUILD_PY = (
    "import os, time\n"
    "deadline = time.monotonic() + 120\n"
    "while not os.path.exists({go!r}) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
)
WAITING = "waiting for another kiln making tiny's artifact cache entry"


def test_two_checkouts_build_at_once_with_one_cache(tmp_path: Path) -> None:
    up = tmp_path / "up"
    # GO's folder named in the step's environment: an isolated step has a /tmp of its
    # own, and sees what of the machine's its command or environment names
    signals = tmp_path / "signals"
    signals.mkdir()
    go = signals / "go"
    commit = make_tiny(up, files={"build.py": HELD_BUILD_PY.format(go=str(go)) + BUILD_PY})
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    first = tiny_workspace(tmp_path / "one" / "ws", commit, env={"TEST_SIGNALS": str(signals)})
    second = tmp_path / "two" / "ws"
    shutil.copytree(first, second)
    cache = tmp_path / "cache"  # one cache, empty: no clone, no facts, no artifacts
    errs = [ws.parent / "stderr.txt" for ws in (first, second)]
    procs = []
    for ws, err_file in zip((first, second), errs, strict=True):
        with err_file.open("w") as err:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "kiln",
                        *tiny_build_args(ws, ws.parent, mirrors, "--offline", "--cache", cache),
                    ],
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    text=True,
                )
            )
    # one build holds the entry (its step waits for GO), the other says it waits for it
    deadline = time.monotonic() + 120  # a deadline for a hang, not the expected time
    while not any(WAITING in e.read_text() for e in errs):
        assert all(p.poll() is None for p in procs), [e.read_text()[-2000:] for e in errs]
        assert time.monotonic() < deadline, "neither build waited for the other's entry"
        time.sleep(0.1)
    go.write_text("1")
    for p, err_file in zip(procs, errs, strict=True):
        assert p.wait(timeout=120) == 0, err_file.read_text()[-3000:]
    logs = "\n".join(e.read_text() for e in errs)

    manifests = [manifest_json(ws.parent / "artifacts" / "test-release") for ws in (first, second)]
    entries = [m["vendors"]["tiny"] for m in manifests]
    # Identical outputs; the step ran once: one build missed and stored, the other waited
    # for that entry and reused it.
    assert entries[0]["outputs"] == entries[1]["outputs"]
    libs = [ws.parent / "artifacts" / "test-release" for ws in (first, second)]
    outputs = [o["path"] for o in entries[0]["outputs"]]
    for rel in outputs:
        assert (libs[0] / rel).read_bytes() == (libs[1] / rel).read_bytes(), rel
    statuses = sorted(e["caches"]["artifact"]["status"] for e in entries)
    assert statuses == ["hit", "miss"], statuses
    assert WAITING in logs, logs
    # The upstream was fetched once, into one bare clone; one facts file; nothing
    # half-made left in the cache.
    assert logs.count("kiln: fetching https://fixtures.invalid/tiny.git") == 1, logs
    assert len(list((cache / "git").glob("*.git"))) == 1
    assert len(list((cache / "facts").glob("python-*.json"))) == 1
    assert [e.name for e in (cache / "artifacts").iterdir() if not e.name.endswith(".lock")] == [
        entries[0]["caches"]["artifact"]["key"]
    ]
    leftovers = [p for p in cache.rglob("*") if ".tmp" in p.name or p.name.startswith(".gone")]
    assert leftovers == []
