"""Fault 5c: corrupt compiler-cache files are detected and never used.

Both caches kiln compiles through: ccache (shared between builds) checks each entry
against its own checksum; kiln's object cache (``.kiln/objcache`` in a tree, what
``rebuild_c`` reuses) names each object by its sha256 and re-hashes it on a hit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kiln.inside.kit import objcache
from kiln.orchestrate import stages
from tests.releases import manifest_json
from tests.upstreams import Upstreams
from tests.workspace import plain_vendor, write


def _wheel(release: Path) -> bytes:
    (wheel,) = (release / "wheels").glob("*.whl")
    return wheel.read_bytes()


def test_corrupt_ccache_entries_are_recompiled_not_used(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[1], archs=["sm_100a"])})
    ccache = tmp_path / "ccache"
    first = stages.build(options(ws, compiler_cache=ccache, artifact_cache=False))
    wheel = _wheel(first)
    damaged = 0
    for path in ccache.rglob("*"):
        if path.is_file() and path.name not in ("ccache.conf", "stats") and path.stat().st_size:
            data = bytearray(path.read_bytes())
            mid = len(data) // 2
            data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])
            path.write_bytes(bytes(data))
            damaged += 1
    assert damaged
    again = stages.build(
        options(
            ws,
            work=tmp_path / "work-2",
            artifacts=tmp_path / "artifacts-2",
            compiler_cache=ccache,
            artifact_cache=False,
        )
    )
    counts = manifest_json(again)["vendors"]["plain"]["caches"]
    assert counts["compiler"]["hits"] == 0 and counts["compiler"]["misses"] >= 1
    assert _wheel(again) == wheel  # compiled again, the same bytes


def _compile(tree: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KILN_OBJCACHE_DIR": str(cache),
        "KILN_OBJCACHE_ROOTS": f"TREE={tree}",
        "KILN_OBJCACHE_VERBOSE": "1",
    }
    return subprocess.run(
        [sys.executable, objcache.__file__, "gcc", "-c", "a.c", "-o", "a.o"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


def test_corrupt_object_in_the_tree_cache_is_recompiled(tmp_path: Path) -> None:
    tree, cache = tmp_path / "tree", tmp_path / "tree" / ".kiln" / "objcache"
    tree.mkdir()
    (tree / "a.c").write_text("int f(void) { return 7; }\n")
    assert "objcache: miss" in _compile(tree, cache).stderr
    good = (tree / "a.o").read_bytes()
    assert "objcache: hit" in _compile(tree, cache).stderr  # the control: a whole entry hits
    (obj,) = (cache / "objects").glob("*.o")
    obj.write_bytes(b"\x7fELF garbage")
    (tree / "a.o").unlink()
    assert "objcache: miss" in _compile(tree, cache).stderr
    assert (tree / "a.o").read_bytes() == good
    assert obj.read_bytes() == good  # the entry is whole again
