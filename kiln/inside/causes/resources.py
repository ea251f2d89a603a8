"""The rows of what the machine ran out of: memory (killed), disk, a writable
temporary folder."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from kiln.inside.causes.cause import Cause, Failure
from kiln.inside.kit import contract

# What a step killed for memory is told (the runners' out-of-memory error and this row):
# a compile killed while others ran beside it was compiled again alone already (the
# compiler wrapper), so what is left to do is give the step more memory.
OOM_FIX = (
    "raise --mem-limit (the step's limit; without it, the memory budget: --mem-budget) "
    "or build where there is more memory"
)


def killed(f: Failure) -> Cause | None:
    text = f.output
    if re.search(r"died due to signal 9|signal 9 \(Kill|\bKilled\b", text):
        return Cause(
            "killed",
            "a compiler was killed (signal 9): most likely out of memory, also when compiled alone",
            OOM_FIX,
        )
    return None


_CANNOT_WRITE = re.compile(
    r"(?:when writing output to|cannot open output file|can't open output file|can't create|"
    r"error writing to|could not write to|cannot write)\s+(?P<path>/\S+?):?\s*:\s*"
    r"(?P<why>[^\n]+)"
    # nvcc's own: "nvcc fatal   : Could not open output file '/tmp/tmpxft_...'" (no reason)
    r"|Could not open output file '(?P<nvcc>/[^']+)'"
)
_NO_SPACE = re.compile(r"^.*No space left on device.*$", re.M)


def _free_at(path: Path) -> str:
    """``N MiB free of M`` on the file system that holds ``path`` (its nearest folder
    that exists)."""
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return "its free space could not be read"
    return f"{usage.free // 2**20} MiB free of {usage.total // 2**20} MiB"


def cannot_write(f: Failure) -> Cause | None:
    """A compiler that could not write its output or its temporary files (the disk filled
    during a long build, a temporary folder gone or not writable): the compiler's own
    fatal error, with the free space where it wrote."""
    m = _CANNOT_WRITE.search(f.output)
    if not m:
        return None
    path = Path(m["path"] or m["nvcc"])
    tmpdir = f.env.get("TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    temporary = path.name.startswith("tmpxft") or path.suffix in (
        ".ii", ".i", ".s", ".ptx", ".cubin", ".fatbin", ".c"
    ) or str(path).startswith(("/tmp/", tmpdir.rstrip("/") + "/"))  # fmt: skip
    where = f"its temporary files (TMPDIR: {tmpdir})" if temporary else "its output"
    why = (m["why"] or "").strip() or _state(path)
    kept = (
        ": what compiled is kept by the compiler cache"
        if f.env.get(contract.CCACHE) or f.env.get(contract.SCCACHE)
        else ""
    )
    fix = (
        "point TMPDIR at a writable folder with room (the compilers' temporary files), "
        f"or free space in {tmpdir}, and rerun{kept}"
        if temporary
        else f"free space there, or point --work at a disk with room, and rerun{kept}"
    )
    return Cause(
        "compiler-cannot-write",
        f"the compiler could not write {where}: {path} ({why}); the file system there "
        f"has {_free_at(path)}",
        fix,
    )


def _state(path: Path) -> str:
    """Why nothing can be written at ``path``: its folder read-only, full, or absent."""
    where = path.parent
    if not where.is_dir():
        return f"{where} does not exist"
    try:
        st = os.statvfs(where)
    except OSError as exc:
        return str(exc)
    if st.f_flag & os.ST_RDONLY:
        return "a read-only file system"
    if st.f_bavail * st.f_frsize < 2**20:
        return "no space left"
    return "not writable"


def disk_full(f: Failure) -> Cause | None:
    m = _NO_SPACE.search(f.output)
    if m is None:
        return None
    usage = shutil.disk_usage(f.tree)
    said = m.group(0).strip()
    return Cause(
        "disk-full",
        f"the disk filled while building ({said}): the file system of {f.tree} has "
        f"{usage.free // 2**20} MiB free",
        "free space there (or point --work/--cache at a larger disk) and rerun",
    )
