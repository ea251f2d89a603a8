"""``kiln pack-jit-cache``: the JIT kernel caches of a GPU run, packed deterministically
into ``<release>/jit-cache/jit-cache-<label>.tar.zst`` and added to the release's
manifest and README.

Which caches a release carries is the workspace's to say (``kiln.toml``:
``[[release.jit_caches]]``, a folder name and the variable that points the upstream at
it). The archive holds ``jit-cache/<name>/`` for each, so unpacking it into the
release's ``install_root`` (the release README says how, safely) gives the folders
those variables point at.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.config.fields import NAME_RE
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, ManifestError
from kiln.release import archive, manifest
from kiln.release import files as release_files


def pack_into_release(cache_dir: Path, label: str, release_dir: Path | None) -> Path:
    if not NAME_RE.match(label):
        raise ConfigError(f"--name {label!r}: use lowercase letters, digits, '-' and '_'")
    if release_dir is None:
        release_dir = Path("artifacts") / Workspace(Path(".")).release.name
    manifest_file = release_dir / manifest.FILE_NAME
    caches = [c.name for c in manifest.read(manifest_file).release.jit_caches]
    if not caches:
        raise ConfigError(
            f"{release_dir}: its release declares no JIT caches: name them in kiln.toml "
            f'([[release.jit_caches]] name = "...", variable = "..."), then build again'
        )
    sources = [(cache_dir / c, f"jit-cache/{c}") for c in caches if (cache_dir / c).is_dir()]
    if not sources:
        raise ConfigError(
            f"{cache_dir}: holds none of {', '.join(c + '/' for c in caches)} (the folders "
            f"a GPU run filled; kiln.toml's jit_caches)"
        )
    problems = manifest.check(manifest_file)
    if problems:
        raise ManifestError(
            f"{manifest_file}: {problems[0].path}: {problems[0].problem}; "
            f"refusing to add to a release that fails its manifest check"
        )
    dest = release_dir / "jit-cache" / f"jit-cache-{label}.tar.zst"
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    archive.pack(sources, dest, mtime)
    m = manifest.read(manifest_file)
    files = [f for f in m.files if f.path != str(dest.relative_to(release_dir))]
    files.append(release_files.file_entry(dest, release_dir, "jit-cache"))
    listed = release_files.finish_readme(release_dir, m.model_copy(update={"files": files}))
    manifest.write(manifest_file, m.model_copy(update={"files": listed}))
    return dest
