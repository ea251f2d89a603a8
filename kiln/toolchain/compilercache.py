"""ccache in front of every compile of every build kind.

kiln's compiler wrapper (``kiln/inside/kit/objcache.py``) runs ccache before the real
g++ or nvcc when ``KILN_CCACHE`` names it. Settings make hits reproducible across
work-tree paths: ``base_dir`` is the tree (absolute paths in it become relative),
the working directory is not hashed (kiln's prefix maps keep paths out of the
objects anyway) and the compiler is identified by its content, not its mtime.
A per-step stats log gives the hit and miss counts the manifest records.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kiln.compilercache")


@dataclass(frozen=True)
class CompilerCache:
    directory: Path | None  # None: builds run without a compiler cache
    binary: str | None
    note: str  # why it is off, or "ccache"

    @property
    def enabled(self) -> bool:
        return self.directory is not None and self.binary is not None


def setup(directory: Path | None, binary: str | None) -> CompilerCache:
    """The cache to use, or a disabled one with a single warning saying why."""
    if directory is None:
        return CompilerCache(None, None, "disabled (--no-compiler-cache)")
    if not binary:
        note = "ccache not found where builds run"
        log.warning("%s: building without a compiler cache (install ccache to enable it)", note)
        return CompilerCache(None, None, note)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".kiln-probe-"):
            pass
    except OSError as exc:
        note = f"compiler cache {directory} is not writable ({exc.strerror})"
        log.warning(
            "%s: building without a compiler cache; fix its permissions or pass "
            "--compiler-cache DIR",
            note,
        )
        return CompilerCache(None, None, note)
    return CompilerCache(directory, binary, "ccache")


def environment(cache: CompilerCache, tree: Path, stats_log: Path) -> dict[str, str]:
    if not cache.enabled:
        return {}
    assert cache.directory is not None and cache.binary is not None
    return {
        "KILN_CCACHE": cache.binary,
        "CCACHE_DIR": str(cache.directory),
        "CCACHE_BASEDIR": str(tree),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
        # Depend mode: on a miss ccache takes the dependencies from the compiler's own -MD
        # output (kiln's wrapper adds -MD where a build asks for none) instead of running
        # the preprocessor once more first: a cold build costs what it costs without it.
        "CCACHE_DEPEND": "1",
        # kiln sets every source's mtime to the commit time; generated headers are new.
        "CCACHE_SLOPPINESS": "include_file_mtime,include_file_ctime",
        "CCACHE_STATSLOG": str(stats_log),
        # The wrapper's nvcc --keep-dir is a fresh temp dir per compile: not an input.
        "CCACHE_IGNOREOPTIONS": "--keep-dir=*",
    }


def read_stats(stats_log: Path) -> dict[str, int]:
    """Hits and misses of one step, from ccache's stats log (one block per call)."""
    hits = misses = 0
    if stats_log.is_file():
        for line in stats_log.read_text(errors="replace").splitlines():
            if line in ("direct_cache_hit", "preprocessed_cache_hit"):
                hits += 1
            elif line == "cache_miss":
                misses += 1
    return {"hits": hits, "misses": misses}
