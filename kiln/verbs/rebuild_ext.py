"""``kiln rebuild-c``: the patch-edit loop on an installed tree, with kiln's checks.

The work itself is ``kiln/inside/kit/rebuild.py`` (the same code the release ships as
``rebuild-<vendor>-C.sh``); kiln adds the patch lookup in the workspace and verifies
the rebuilt extension's SASS archs afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from kiln.config.workspace import Workspace
from kiln.errors import RebuildError, VerifyError
from kiln.inside.kit import rebuild as shipped
from kiln.orchestrate.kinds.inplace import TREE_FILE, find_outputs
from kiln.orchestrate.kit import KIT
from kiln.toolchain import compilercache
from kiln.verify.binaries import SharedObject, check_archs, device_archs

log = logging.getLogger(__name__)


def resolve_patch(ws: Workspace, vendor: str, patch: str | None) -> Path:
    """A path as given, else a file of the workspace's patches/, else the vendor's last."""
    if patch and Path(patch).is_file():
        return Path(patch).resolve()
    if patch:
        candidate = ws.patches_dir / patch
        if candidate.is_file():
            return candidate
        raise RebuildError(f"patch {patch} not found (as a path or under {ws.patches_dir})")
    series = ws.patches_for(vendor)
    if not series:
        raise RebuildError(f"the series has no patch for {vendor}; name one")
    return ws.patches_dir / series[-1].file


def rebuild_c(
    ws: Workspace,
    tree: Path,
    patch: str | None,
    python: str | None,
    cuda_home: str,
    compiler_cache: Path | None = None,
) -> tuple[float, list[SharedObject]]:
    """``compiler_cache``: ccache's folder (shared with ``build_all``) for the files the
    tree's own object cache has not seen; None compiles without it."""
    tree = tree.resolve()
    meta_file = tree / KIT / TREE_FILE
    if not meta_file.is_file():
        raise RebuildError(
            f"{tree} is not a tree built by kiln (no {KIT}/{TREE_FILE}): "
            f"point at the folder install.sh unpacked"
        )
    meta = json.loads(meta_file.read_text())
    path = resolve_patch(ws, meta["vendor"], patch)
    py = Path(python) if python else shipped.default_python(tree)
    found = shutil.which("ccache") or compilercache.own_binary("ccache")
    cc = compilercache.setup(compiler_cache, found if compiler_cache else None)
    stats = tree / KIT / "ccache-stats.log"
    stats.unlink(missing_ok=True)
    # The shipped rebuild takes its environment from this process's.
    os.environ.update(compilercache.environment(cc, tree, stats))
    try:
        took = shipped.rebuild(tree, path, py, cuda_home)
    except shipped.RebuildError as exc:  # the kit's own (standard library only): kiln's here
        raise RebuildError(str(exc)) from None
    if cc.enabled:
        counts = compilercache.read_stats(stats)
        log.info("rebuild-c: ccache %d hits, %d misses", counts["hits"], counts["misses"])
    objects = []
    for so in find_outputs(tree, meta["outputs"], meta["vendor"]):
        sass, ptx = device_archs(so)
        objects.append(SharedObject(str(so.relative_to(tree)), sass, ptx))
    try:
        check_archs(meta["vendor"], objects, meta["archs"])
    except VerifyError as exc:
        raise RebuildError(f"after the rebuild: {exc}") from None
    return took, objects
