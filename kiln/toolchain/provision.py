"""What a build would provision before it compiles, and about how large each part is
(``kiln build --dry-run`` says it instead of doing it).

Sizes are estimates, always said as "about": measured from an entry of the same kind
already in the cache (another build venv with the same torch) where there is one, else
the figures below, measured on Linux x86_64 and documented here:

- a build venv with a CUDA build of torch (``torch==2.14.1`` with its ``nvidia-*``
  wheels, setuptools, wheel, ninja): 5.3 GiB;
- one with a CPU-only torch (``+cpu``): 1.0 GiB; one without torch: 0.05 GiB;
- the CUDA 13.x toolkit from NVIDIA's PyPI wheels (``--toolchain pypi``): 0.33 GiB.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kiln.errors import KilnError

GIB = 2**30
VENV_TORCH_CUDA_GIB = 5.3
VENV_TORCH_CPU_GIB = 1.0
VENV_NO_TORCH_GIB = 0.05
PYPI_CUDA_GIB = 0.33


@dataclass(frozen=True)
class Provision:
    """One thing a build makes before its first compile."""

    what: str  # "the build venv (torch 2.14.1+cu130, ...)"
    where: str  # its folder (or image tag)
    size: str  # "about 5.3 GiB (...)"; "" once made
    made: bool = False  # already there: reused
    # The checks where builds run need it first (the Docker runner's builder image):
    # until it exists, preflight cannot ask for nvcc or the recipes' system files.
    before_checks: bool = False
    # What making it would raise, known without making it (no base Python to make a venv
    # from): the build stops there, with this error.
    error: KilnError | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["error"] = str(self.error) if self.error else None
        return data


def tree_bytes(root: Path) -> int:
    """The bytes of every file under ``root`` (links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_size
    return total


def about(gib: float, how: str) -> str:
    return f"about {gib:.2g} GiB ({how})" if gib < 1 else f"about {gib:.1f} GiB ({how})"
