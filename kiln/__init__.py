"""kiln: reproducible builds of CUDA wheels from pinned upstream sources."""

from __future__ import annotations

import functools
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def source_commit() -> str | None:
    """The git commit kiln's own code came from (``-dirty`` when its tree has changes),
    or None for an installed copy outside a git checkout."""
    from kiln.errors import KilnError
    from kiln.inside import proc

    src = Path(__file__).resolve().parent
    try:
        res = proc.run(
            ["git", "-C", src, "describe", "--always", "--dirty", "--abbrev=12"],
            check=False,
            timeout=10,
        )
    except (OSError, KilnError):
        return None
    lines = res.output.strip().splitlines()
    return lines[-1] if res.returncode == 0 and lines else None


def version_line() -> str:
    commit = source_commit()
    return f"kiln {__version__}" + (f" (git {commit})" if commit else "")
