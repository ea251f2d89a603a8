"""The public upstreams (examples/public) for tests: the git bundles of ../shared/upstreams
turned into bare mirrors, and copies of the workspace to edit.

The bundles are the upstreams' real histories (DeepGEMM, DeepEP, FlashMLA, CUTLASS, fmt).
Where they are missing the tests that need them skip, unless ``KILN_REQUIRE_BUNDLES=1``
or ``KILN_REQUIRE_ALL=1`` (CI sets it), which makes that a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import tomlkit

from kiln.sources import bundles
from tests import require

REPO = Path(__file__).resolve().parents[1]
WORKSPACE = REPO / "examples" / "public"
BUNDLES = Path(os.environ.get("KILN_BUNDLES", REPO.parent / "shared" / "upstreams"))


def require_bundles() -> Path:
    if not (BUNDLES / "FlashMLA.bundle").is_file():
        require.missing("BUNDLES", f"no upstream bundles in {BUNDLES} (set KILN_BUNDLES)")
    return BUNDLES


def mirrors(dest: Path, workspace: Path = WORKSPACE) -> Path:
    """Bare mirrors of every bundle ``workspace`` names under ``dest``, and the mirrors
    file naming them."""
    return bundles.mirrors_from_bundles(workspace, require_bundles(), dest)


def copy_workspace(dest: Path) -> Path:
    shutil.copytree(WORKSPACE, dest)
    return dest


def edit_vendor(ws: Path, name: str, **build: object) -> None:
    """Change keys of ``vendors/<name>.toml``: ``source__commit="..."`` for source keys."""
    path = ws / "vendors" / f"{name}.toml"
    doc = tomlkit.parse(path.read_text())
    for key, value in build.items():
        table, _, field = key.rpartition("__")
        doc[table or "build"][field] = value
    path.write_text(tomlkit.dumps(doc))
