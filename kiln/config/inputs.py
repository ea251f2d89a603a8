"""The workspace's inputs as a build read them when it started.

A build runs for hours; people edit patches and vendor TOMLs meanwhile. kiln parses
the TOMLs once, at the start, and copies ``patches/`` to a snapshot that every
later step (cache keys, ``git apply``, the release's ``patches/``) reads, so one run
never mixes two versions of an input. At the end, inputs that changed on disk are
named in a warning (and in the manifest's warnings): the release holds the versions
the run started with, recorded by their hashes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.config.workspace import Workspace
from kiln.fsutil import sha256_file


def _inputs(root: Path, read: list[str]) -> dict[str, str]:
    """The hash of each input of ``read`` (paths in the workspace) that exists."""
    files = [root / rel for rel in read]
    return {str(p.relative_to(root)): sha256_file(p) for p in files if p.is_file()}


def read_by(ws: Workspace, vendors: list[str]) -> list[str]:
    """What a build of ``vendors`` reads: kiln.toml, their TOMLs, the series and their
    patches (a vendor TOML added meanwhile, or another vendor's patch, is none of its
    business: editing it is no reason to warn about this release)."""
    patches = sorted({f"patches/{p.file}" for v in vendors for p in ws.patches_for(v)})
    return ["kiln.toml", *(f"vendors/{v}.toml" for v in vendors), "patches/series.toml", *patches]


class Snapshot:
    def __init__(self, ws: Workspace, dest: Path, vendors: list[str] | None = None) -> None:
        """Copy ``ws``'s patches to ``dest`` and point ``ws`` at the copy; ``vendors``: the
        ones this build makes (default: all of the workspace's)."""
        self.root = ws.root
        self.read = read_by(ws, vendors if vendors is not None else list(ws.vendors))
        self.started = _inputs(ws.root, self.read)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if ws.patches_dir.is_dir():
            shutil.copytree(ws.patches_dir, dest)
        else:
            dest.mkdir()
        ws.use_patches_from(dest)

    def changed(self) -> list[str]:
        """Inputs whose bytes on disk differ from what this run read (or that came or went)."""
        now = _inputs(self.root, self.read)
        return sorted(k for k in set(now) | set(self.started) if now.get(k) != self.started.get(k))

    def warnings(self) -> list[str]:
        return [
            f"{rel} changed while this build ran: the release was built from the version "
            f"read at its start"
            + (f" (sha256 {self.started[rel][:12]})" if rel in self.started else " (absent then)")
            + "; rerun to build the new one"
            for rel in self.changed()
        ]
