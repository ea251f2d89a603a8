"""Shared pieces of the fault-injection suite: a tiny upstream that builds in seconds
without torch or a GPU, a workspace for it, ``kiln build`` on the local runner, and
small file systems (tmpfs with a size limit) that are always unmounted afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.sources.gitrepo import CommitSpec, make_repo
from tests import conftest, require
from tests.conftest import run_kiln
from tests.upstreams import BASE_URL, MIT
from tests.workspace import PROFILE, write

# No torch: the fault tests build a host-only shared object with the system CUDA 13.0.
FAULT_PROFILE = {**{k: v for k, v in PROFILE.items() if k != "torch"}, "cuda": "13.0"}

# build.py: the in-place build of the "tiny" upstream. It records its arguments and the
# EVIL variable (the hostile-input tests look for them as plain data) and makes a .so.
BUILD_PY = """\
import os, subprocess, sys
with open("argv.txt", "w") as fh:
    fh.write("\\n".join(sys.argv[1:]))
with open("evil.txt", "w") as fh:
    fh.write(os.environ.get("EVIL", ""))
with open("tiny.c", "w") as fh:
    fh.write("int tiny(void) { return 42; }\\n")
subprocess.check_call(["cc", "-shared", "-fPIC", "-o", "libtiny.so", "tiny.c"])
"""


def make_tiny(root: Path, name: str = "tiny", files: dict[str, bytes | str] | None = None) -> str:
    """``root/<name>.git``: an upstream built in place by build.py; returns its commit."""
    spec = CommitSpec("tiny", {"build.py": BUILD_PY, "LICENSE": MIT, **(files or {})})
    return make_repo(root / f"{name}.git", [spec])[0]


def tiny_vendor(commit: str, name: str = "tiny", **build: Any) -> dict[str, Any]:
    return {
        "source": {"url": f"{BASE_URL}{name}.git", "commit": commit},
        "build": {
            "kind": "inplace",
            "archs": [],
            "arch_control": "none",
            "command": [sys.executable, "build.py"],
            "outputs": ["libtiny.so"],
            **build,
        },
    }


def tiny_workspace(root: Path, commit: str, name: str = "tiny", **build: Any) -> Path:
    return write(root, {name: tiny_vendor(commit, name, **build)}, profile=FAULT_PROFILE)


def tiny_build_args(
    ws: Path, tmp: Path, mirrors: Path, *extra: str | Path, artifacts: Path | None = None
) -> list[str]:
    """``kiln build`` of ``ws`` on the local runner with the system CUDA and this Python
    (the fault fixtures need no torch); mirrors given, never offline (some faults are
    the network's)."""
    return conftest.build_args(
        ws,
        tmp,
        *extra,
        mirrors=mirrors,
        offline=False,
        toolchain="system",
        python=sys.executable,
        artifacts=artifacts,
    )


def build_cli(
    ws: Path, tmp: Path, mirrors: Path, *extra: str | Path, artifacts: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_kiln(*tiny_build_args(ws, tmp, mirrors, *extra, artifacts=artifacts))


def mirrors_file(path: Path, target: str) -> Path:
    path.write_text(f'[mirrors]\n"{BASE_URL}" = "{target}"\n')
    return path


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("kiln: error:")]


@pytest.fixture
def small_fs() -> Iterator[Callable[[str], Path]]:
    """Mount tmpfs file systems of a given size (``"2m"``); all unmounted at the end."""
    if os.geteuid() != 0:
        require.missing("ROOT", "mounting a size-limited tmpfs needs root")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = Path(tempfile.mkdtemp(prefix="kiln-fault-fs-"))
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
            check=True,
        )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()


# A [[build.system]] entry no machine satisfies (preflight's and the dry run's tests).
ABSENT = {"header": "kiln_no_such/absent.h", "package": "libkiln-absent-dev"}
