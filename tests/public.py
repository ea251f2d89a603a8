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

from kiln.config.models import Vendor
from kiln.config.workspace import parse, read_toml
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


# The public upstreams' pins: those of the hand-written recipes in examples/public/vendors.
PINS = {
    "deepgemm": (
        "https://github.com/deepseek-ai/DeepGEMM",
        "6c5a02aeb9268f2376500c9184470af7c09026d0",
    ),
    "deepep": ("https://github.com/deepseek-ai/DeepEP", "dd758caf451848bd150e1046af3d0a73e5fff38d"),
    "flashmla": (
        "https://github.com/deepseek-ai/FlashMLA",
        "f125991af1db71e9e961e82f43a399bbbb41d631",
    ),
}


def decisive(vendor: Vendor) -> dict[str, object]:
    """Every key of a recipe that decides what is built (what `kiln add` must get right):
    the source and its submodules with their license ids, the kind, how archs reach the
    compiler and which, the environment, the system's headers and libraries, the compiler
    flags kiln adds or drops, the caps on parallelism and an in-place build's command.
    Not here: description, mem_per_job_gib (an estimate the first build replaces),
    gpu_test, and a submodule's commit (the tree at source.commit records it)."""
    s, b = vendor.source, vendor.build
    return {
        "source.url": s.url,
        "source.commit": s.commit,
        "source.license": s.license,
        "source.license_id": s.license_id,
        "source.submodules": [(m.path, m.license, m.license_id) for m in s.submodules],
        "build.kind": b.kind,
        "build.arch_control": b.arch_control,
        "build.archs": list(b.archs),
        "build.arch_toggles": dict(b.arch_toggles),
        "build.env": dict(b.env),
        "build.system": [(x.header, x.library, x.package) for x in b.system],
        "build.cxx_append_flags": list(b.cxx_append_flags),
        "build.nvcc_append_flags": list(b.nvcc_append_flags),
        "build.nvcc_drop_flags": list(b.nvcc_drop_flags),
        "build.nvcc_threads": b.nvcc_threads,
        "build.max_jobs": b.max_jobs,
        "build.command": b.command,
        "build.outputs": list(b.outputs),
    }


def recipe(path: Path) -> Vendor:
    """A vendor TOML as written (no profile applied: toggles not yet resolved)."""
    return parse(Vendor, path, {**read_toml(path), "name": path.stem})
