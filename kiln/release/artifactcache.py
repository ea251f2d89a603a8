"""Content-addressed cache of verified vendor outputs.

The key (``kiln/plan/cachekey.py``) is a hash of everything that determines a vendor's
outputs. With an unchanged key a build reuses the cached files instead of rebuilding, after
re-hashing every one of them against the entry; an entry that does not match is
discarded (and the vendor rebuilt), never used.

Layout: ``<root>/<key>/entry.json`` (the vendor's manifest entry, the key's
material, each file's sha256) and ``<root>/<key>/files/<release path>``. Entries
are written to a temporary folder and renamed into place, and removed by a rename aside:
a reader sees a whole entry or none. Builds sharing the cache build one key one at a
time (:meth:`ArtifactCache.making`, held from the miss to the store): the second waits,
then reuses the first's entry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from kiln import fsutil
from kiln.fsutil import sha256_file
from kiln.release.manifest import VendorEntry

log = logging.getLogger(__name__)


class ArtifactCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, key: str) -> Path:
        return self.root / key

    def making(self, key: str, vendor: str) -> contextlib.AbstractContextManager[None]:
        """The lock of ``key``'s entry: held by a build from its miss to its store, so
        that another build of the same inputs waits and then finds the entry."""
        return fsutil.making(self._dir(key), f"{vendor}'s artifact cache entry {key[:12]}")

    def lookup(self, key: str, vendor: str) -> tuple[VendorEntry, Path] | None:
        """(the vendor's manifest entry, the folder of its files) when the entry is
        whole; a damaged entry is removed and reported."""
        folder = self._dir(key)
        try:
            entry = json.loads((folder / "entry.json").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._discard(folder, vendor, f"unreadable entry.json ({exc})")
            return None
        files = folder / "files"
        for rel, digest in sorted(entry.get("files", {}).items()):
            path = files / rel
            if not path.is_file():
                self._discard(folder, vendor, f"{rel} is missing")
                return None
            actual = sha256_file(path)
            if actual != digest:
                self._discard(
                    folder, vendor, f"{rel} has sha256 {actual[:12]}, expected {digest[:12]}"
                )
                return None
        try:
            found = VendorEntry.model_validate(entry["vendor_entry"])
        except (ValidationError, KeyError, TypeError) as exc:
            self._discard(folder, vendor, f"not a vendor entry of this kiln ({exc})")
            return None
        return found, files

    def update_entry(self, key: str, vendor_entry: VendorEntry) -> None:
        """Replace the stored entry's record, its files unchanged (the import proof added
        to an entry kept before it); written whole or not at all."""
        path = self._dir(key) / "entry.json"
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # gone or damaged: the next build rebuilds it
        if {o.path: o.sha256 for o in vendor_entry.outputs} != stored.get("files"):
            raise AssertionError(f"artifact cache {key[:12]}: an update may not change files")
        stored["vendor_entry"] = vendor_entry.data()
        fsutil.write_atomic(path, json.dumps(stored, indent=1, sort_keys=True))

    def latest_material(self, vendor: str) -> tuple[str, dict[str, object]] | None:
        """(key, material) of the newest entry stored for ``vendor``: what a miss is
        compared with to say what changed (``kiln build --dry-run``)."""
        best: tuple[float, str, dict[str, object]] | None = None
        for path in self.root.glob("*/entry.json") if self.root.is_dir() else []:
            if path.parent.name.startswith("."):  # being written or removed
                continue
            try:
                entry = json.loads(path.read_text())
                mtime = path.stat().st_mtime
            except (OSError, ValueError):
                continue
            material = entry.get("material") if isinstance(entry, dict) else None
            if not isinstance(material, dict) or material.get("vendor") != vendor:
                continue
            if best is None or mtime > best[0]:
                best = (mtime, path.parent.name, material)
        return (best[1], best[2]) if best else None

    def _discard(self, folder: Path, vendor: str, why: str) -> None:
        log.warning(
            "%s: artifact cache entry %s is damaged (%s): discarded, rebuilding",
            vendor,
            folder.name[:16],
            why,
        )
        _remove(folder)
        return None

    def store(
        self,
        key: str,
        material: Mapping[str, object],
        vendor_entry: VendorEntry,
        stage: Path,
    ) -> None:
        """Copy the vendor's outputs (paths relative to the release ``stage``) in."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=self.root))
        try:
            hashes = {}
            for out in vendor_entry.outputs:
                dest = tmp / "files" / out.path
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(stage / out.path, dest)
                hashes[out.path] = out.sha256
            entry = {"key": key, "material": material, "vendor_entry": vendor_entry.data()}
            (tmp / "entry.json").write_text(
                json.dumps({**entry, "files": hashes}, indent=1, sort_keys=True)
            )
            final = self._dir(key)
            if final.exists():
                _remove(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _remove(folder: Path) -> None:
    """Remove an entry: renamed aside first (atomic), so no reader sees half of it."""
    aside = folder.with_name(f".gone-{folder.name[:16]}-{os.getpid()}-{id(folder)}")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:  # another kiln removed it first
        return
    shutil.rmtree(aside, ignore_errors=True)


def place(files: Path, vendor_entry: VendorEntry, stage: Path) -> None:
    """Copy a cached vendor's files into the release being staged (copies, not hard
    links: an edit to a released file must not reach the cache, nor the reverse)."""
    for out in vendor_entry.outputs:
        dest = stage / out.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(files / out.path, dest)
