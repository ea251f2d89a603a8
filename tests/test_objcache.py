"""The shipped object cache: its entries are the same bytes wherever the tree lies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kiln.shipped import objcache

WRAPPER = Path(objcache.__file__)


def _compile(tree: Path, include: Path, cache: Path) -> list[bytes]:
    env = {
        **os.environ,
        "KILN_OBJCACHE_DIR": str(cache),
        "KILN_OBJCACHE_ROOTS": f"TREE={tree}",
    }
    subprocess.run(
        [sys.executable, str(WRAPPER), "gcc", "-c", "src/a.c", "-o", "a.o", f"-I{include}"],
        cwd=tree,
        env=env,
        check=True,
    )
    return sorted(p.read_bytes() for p in (cache / "entries").iterdir())


def _tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "local.h").write_text("#define LOCAL 1\n")
    (root / "src" / "a.c").write_text(
        '#include "local.h"\n#include <outside.h>\nint f(void) { return LOCAL + OUTSIDE; }\n'
    )
    return root


def test_entries_do_not_depend_on_where_the_tree_sorts(tmp_path: Path) -> None:
    """An outside header ("m/") sorts after a tree in "a/" and before one in "z/": the
    dependency list, and so the entry's bytes, must not follow that order."""
    include = tmp_path / "m" / "include"
    include.mkdir(parents=True)
    (include / "outside.h").write_text("#define OUTSIDE 2\n")
    before = _compile(_tree(tmp_path / "a" / "tree"), include, tmp_path / "cache-a")
    after = _compile(_tree(tmp_path / "z" / "tree"), include, tmp_path / "cache-z")
    assert before == after
    assert b"@TREE@/src/local.h" in before[0]


def test_entries_record_the_dependency_they_read(tmp_path: Path) -> None:
    """The check can fail: a different outside header gives a different entry."""
    include = tmp_path / "m" / "include"
    include.mkdir(parents=True)
    (include / "outside.h").write_text("#define OUTSIDE 2\n")
    first = _compile(_tree(tmp_path / "a" / "tree"), include, tmp_path / "cache-a")
    (include / "outside.h").write_text("#define OUTSIDE 3\n")
    second = _compile(_tree(tmp_path / "z" / "tree"), include, tmp_path / "cache-z")
    assert first != second
