"""Small real releases for the CI, merge and publish tests (fixture upstreams, real builds)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kiln.orchestrate import stages
from kiln.orchestrate.options import Options
from kiln.release import manifest
from tests.conftest import shared_cache
from tests.upstreams import Upstreams
from tests.workspace import PATCH, plain_vendor, write


def workspace(root: Path, upstreams: Upstreams) -> Path:
    """Two vendors: ``alpha`` (sm_100a + sm_103a kernels, a patch) and ``beta`` (host only)."""
    beta = plain_vendor(upstreams.plain[0], archs=[], env={"PLAIN_DIST_NAME": "plainbeta"})
    return write(
        root,
        {"alpha": plain_vendor(upstreams.plain[2]), "beta": beta},
        patches={"greeting.patch": PATCH},
        series=[{"file": "greeting.patch", "target": "alpha"}],
    )


def options(
    ws: Path, root: Path, upstreams: Upstreams, build_python: Path, artifacts: str
) -> Options:
    return Options(
        workspace=ws,
        artifacts=root / artifacts,
        cache=shared_cache(root / "cache"),
        work=root / "work",
        mirrors=upstreams.mirrors,
        offline=True,
        python=str(build_python),
        toolchain="pypi",
    )


def build(
    ws: Path,
    root: Path,
    upstreams: Upstreams,
    build_python: Path,
    artifacts: str,
    vendors: list[str] | None = None,
) -> Path:
    opts = options(ws, root, upstreams, build_python, artifacts)
    return stages.build(replace(opts, vendors=tuple(vendors) if vendors else None))


def copy(release: Path, dest: Path) -> Path:
    shutil.copytree(release, dest)
    return dest


def edit_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change a release's manifest.json in place (its listed files stay as they are)."""
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def tiny_release(folder: Path, name: str = "tiny", profile: dict[str, Any] | None = None) -> Path:
    """A release folder of one file and its manifest, made without a build: what
    ``manifest check``, ``publish``, ``gpu-test`` and ``manifest merge`` read first."""
    folder.mkdir(parents=True)
    readme = folder / "README.md"
    readme.write_text("# tiny\n")
    data = {
        "schema": "kiln.manifest/1",
        "kiln_version": "0",
        "kiln_commit": None,
        "release": {"name": name},
        "profile": profile
        or {"cuda": "13.2", "python": "3.12", "torch": None, "archs": ["sm_100a"]},
        "toolchain": {
            "cuda_home": "/usr/local/cuda",
            "nvcc_version": "13.2.86",
            "gcc_version": "13",
            "python_version": "3.12.0",
            "torch_version": None,
            "torch_cuda": None,
            "torch_cxx11_abi": None,
        },
        "runner": {"kind": "local", "image": None},
        "vendors": {},
        "files": [
            {
                "path": "README.md",
                "sha256": hashlib.sha256(readme.read_bytes()).hexdigest(),
                "size": readme.stat().st_size,
                "kind": "readme",
            }
        ],
    }
    manifest.write(folder / manifest.FILE_NAME, manifest.parse(data, "test"))
    return folder


def manifest_json(release: Path) -> dict[str, Any]:
    """A release's manifest as kiln reads it: ``manifest.json`` with its run's figures
    (timings, schedules, caches) put back from the run record in the build's logs."""
    return manifest.read(release / manifest.FILE_NAME).data()
