"""Two checkouts building at once with one kiln cache (issue: "the cache in the user's
cache folder, shared safely by checkouts and builds at once"): two copies of a workspace
in different folders, each with its own work/ and artifacts/, started together on one
empty cache. Each cache entry they both need is made once, by one of them, while the
other waits and reuses it: the bare clone and its fetch, the build Python's facts, the
vendor's artifact-cache entry (its step runs once); both succeed, with identical outputs.
The tiny upstream's step sleeps, so the two builds surely overlap."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.faults.conftest import BUILD_PY, build_args, make_tiny, mirrors_file, tiny_workspace

# The tiny upstream's build, slowed down: the second build reaches the artifact cache
# while the first is still building (without the entry's lock it would build it too).
SLOW_BUILD_PY = "import time\ntime.sleep(4)\n" + BUILD_PY


def test_two_checkouts_build_at_once_with_one_cache(tmp_path: Path) -> None:
    up = tmp_path / "up"
    commit = make_tiny(up, files={"build.py": SLOW_BUILD_PY})
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    first = tiny_workspace(tmp_path / "one" / "ws", commit)
    second = tmp_path / "two" / "ws"
    shutil.copytree(first, second)
    cache = tmp_path / "cache"  # one cache, empty: no clone, no facts, no artifacts
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kiln",
                *build_args(ws, ws.parent, mirrors, "--offline", "--cache", cache),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ws in (first, second)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-3000:]
    logs = "\n".join(err for _out, err in results)

    manifests = [
        json.loads((ws.parent / "artifacts" / "test-release" / "manifest.json").read_text())
        for ws in (first, second)
    ]
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
    assert "waiting for another kiln making tiny's artifact cache entry" in logs, logs
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
