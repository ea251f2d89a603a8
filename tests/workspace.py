"""Write kiln workspaces (kiln.toml, vendors/, patches/) for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit

from tests.upstreams import BASE_URL

# A patch against the plain fixture upstream (tests/upstreams.py) that changes its greeting.
PATCH = """\
--- a/plainext/__init__.py
+++ b/plainext/__init__.py
@@ -1,2 +1,2 @@
 VERSION = "1.2.0"
-GREETING = "hello from plainext"
+GREETING = "hello from patched plainext"
"""

# The tests' profile: CUDA 13.2 as the release (from NVIDIA's hash-pinned PyPI wheels,
# --toolchain pypi), Python 3.11 and torch 2.14.1 (its CUDA 13.0 build) as on this machine.
PROFILE: dict[str, Any] = {
    "cuda": "13.2",
    "python": "3.11",
    "torch": "2.14.1+cu130",
    "archs": ["sm_100a", "sm_103a"],
    # examples/public's build tools (torch brings this NVSHMEM anyway): the tests' build
    # venv and the public upstreams' are then one venv, provisioned once (100 s in CI)
    "build_tools": [
        "setuptools==80.9.0",
        "wheel==0.45.1",
        "ninja==1.13.0",
        "packaging==26.4",
        "nvidia-nvshmem-cu13==3.4.5",
    ],
}


def plain_vendor(commit: str, archs: list[str] | None = None, **build: Any) -> dict[str, Any]:
    archs = ["sm_100a", "sm_103a"] if archs is None else archs
    return {
        "source": {"url": f"{BASE_URL}plain.git", "commit": commit},
        "build": {
            "kind": "wheel",
            "archs": archs,
            "arch_control": "hardcoded" if archs else "none",
            **build,
        },
    }


def write(
    root: Path,
    vendors: dict[str, dict[str, Any]],
    patches: dict[str, str] | None = None,
    series: list[dict[str, Any]] | None = None,
    profile: dict[str, Any] | None = None,
    name: str = "test-release",
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "kiln.toml").write_text(
        tomlkit.dumps({"release": {"name": name}, "profile": profile or PROFILE})
    )
    (root / "vendors").mkdir(exist_ok=True)
    for vname, data in vendors.items():
        (root / "vendors" / f"{vname}.toml").write_text(tomlkit.dumps(data))
    (root / "patches").mkdir(exist_ok=True)
    for fname, text in (patches or {}).items():
        (root / "patches" / fname).write_text(text)
    if series is not None:
        (root / "patches" / "series.toml").write_text(tomlkit.dumps({"patch": series}))
    return root
