"""The compiler runs of one step, as the compiler wrapper records them: one JSON line per
run in ``<logs>/<vendor>.jobs`` (``KILN_JOB_STATS``). The scheduler learns from them, the
bound and the timings report read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict, cast


class JobLine(TypedDict, total=False):
    """One compiler run as the compiler wrapper records it (``KILN_JOB_STATS``, a JSON
    line each: ``kiln/inside/kit/objcache.py``, ``_record``); read from disk, so every
    key may be missing from an older or cut line."""

    compiler: str
    source: str | None  # the unit, relative to the tree (None: a link or a probe)
    out: str | None  # the file it wrote, absolute (kiln/verify/wrapped.py looks for it)
    args_sha: str  # its command line's sha256 (16 hex digits): the same unit compiled again
    # "compiled"; "cache-hit" (ccache answered: nothing compiled), "objcache-hit";
    # "oom-killed" (killed for memory beside others, then compiled again alone); "other"
    result: str
    rc: int
    rss_kib: int  # the run's peak over its process tree (nvcc's threads included)
    cpu_s: float
    wall_s: float
    start: float  # epoch seconds, after the gate wait
    waited_s: float  # at the compile gate
    where: str  # "remote": an sccache-dist server ran it
    threads: int  # nvcc --threads, where more than one
    cache: str  # the compiler cache's answer where ccache ran in front: "hit" or "miss"


def job_stats(path: Path) -> list[JobLine]:
    """The compiler wrapper's lines for one step (``KILN_JOB_STATS``)."""
    if not path.is_file():
        return []
    out: list[JobLine] = []
    for line in path.read_text().splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            out.append(cast(JobLine, parsed))
    return out
