"""``kiln pack-jit-cache``: DeepGEMM and TileLang kernel caches from a GPU run, packed
deterministically into ``<release>/jit-cache/jit-cache-<label>.tar.zst`` and added to
the release's manifest and README.

The archive holds ``jit-cache/deep_gemm/`` and ``jit-cache/tilelang/``, so unpacking it
into ``/workspace`` (the release README says how, safely) gives the folders that
``DG_JIT_CACHE_DIR`` and ``TILELANG_CACHE_DIR`` point at.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.config.fields import NAME_RE
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, ManifestError
from kiln.release import archive, manifest
from kiln.release import files as release

CACHES = ("deep_gemm", "tilelang")


def pack_into_release(cache_dir: Path, label: str, release_dir: Path | None) -> Path:
    if not NAME_RE.match(label):
        raise ConfigError(f"--name {label!r}: use lowercase letters, digits, '-' and '_'")
    sources = [(cache_dir / c, f"jit-cache/{c}") for c in CACHES if (cache_dir / c).is_dir()]
    if not sources:
        raise ConfigError(
            f"{cache_dir}: holds neither deep_gemm/ nor tilelang/ (the "
            f"DG_JIT_CACHE_DIR and TILELANG_CACHE_DIR of a GPU run)"
        )
    if release_dir is None:
        release_dir = Path("artifacts") / Workspace(Path(".")).release.name
    manifest_file = release_dir / manifest.FILE_NAME
    problems = manifest.check(manifest_file)
    if problems:
        raise ManifestError(
            f"{manifest_file}: {problems[0].path}: {problems[0].problem}; "
            f"refusing to add to a release that fails its manifest check"
        )
    dest = release_dir / "jit-cache" / f"jit-cache-{label}.tar.zst"
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    archive.pack(sources, dest, mtime)
    data = manifest.read(manifest_file)
    files = [f for f in data.get("files", []) if f["path"] != str(dest.relative_to(release_dir))]
    files.append(release.file_entry(dest, release_dir, "jit-cache"))
    data["files"] = release.finish_readme(release_dir, {**data, "files": files})
    manifest.write(manifest_file, data)
    return dest
