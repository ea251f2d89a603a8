"""The artifact cache's key: a hash of everything that determines a vendor's outputs.

Pure functions of explicit values: the full commit and every submodule commit, the
patches as the series lists them and as they are on disk, the patch tag, the recipe
(less what only the import proof reads),
the profile, the toolchain, the runner and its image, and kiln's own code (a change to
kiln may change what it builds).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TypedDict

from kiln.config.models import PatchEntry, Profile, Vendor

# The recipe's keys that only the import proof reads (kiln/orchestrate/importproof.py).
PROOF_ONLY: set[str] = {"import_proof", "import_check"}


class SourceMaterial(TypedDict):
    url: str
    commit: str
    submodules: dict[str, str]
    license: str | None
    license_id: str | None


class Material(TypedDict):
    """What an artifact-cache key hashes (kept in the entry, as JSON)."""

    kiln: str
    vendor: str
    source: SourceMaterial
    patches: list[dict[str, object]]
    patch_tag: str | None
    recipe: dict[str, object]
    profile: dict[str, object]
    toolchain: Mapping[str, object]
    runner: Mapping[str, object]


@cache
def kiln_code_hash() -> str:
    """kiln's own sources."""
    h = hashlib.sha256()
    root = resources.files("kiln")
    for path in sorted(Path(str(root)).rglob("*")):
        if "__pycache__" in path.parts:
            continue
        if path.is_file() and path.suffix in (".py", ".json", ".txt", ".sh", ".md", ".in"):
            h.update(str(path.relative_to(Path(str(root)))).encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()


def material(
    vendor: Vendor,
    commit: str,
    gitlinks: dict[str, str],
    patches: list[tuple[PatchEntry, str]],
    patch_tag: str | None,
    profile: Profile,
    toolchain: Mapping[str, object],
    runner: Mapping[str, object],
) -> Material:
    """What the key hashes (kept with the cache entry, to say what it was made from).
    ``patches``: each series entry with the sha256 of the file on disk; ``gitlinks``: the
    superproject's submodule commits (nested ones are fixed by their parents')."""
    src = vendor.source
    return {
        "kiln": kiln_code_hash(),
        "vendor": vendor.name,
        "source": {
            "url": src.url,
            "commit": commit,
            "submodules": gitlinks,
            "license": src.license,
            "license_id": src.license_id,
        },
        "patches": [
            {**entry.model_dump(mode="json"), "actual_sha256": digest} for entry, digest in patches
        ],
        "patch_tag": patch_tag,
        # the import proof's settings decide nothing built: a change re-runs the proof alone
        "recipe": vendor.build.model_dump(mode="json", exclude=PROOF_ONLY),
        "profile": profile.model_dump(mode="json"),
        "toolchain": toolchain,
        "runner": runner,
    }


def make_key(values: Material) -> str:
    text = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def changed(old: Mapping[str, object], new: Mapping[str, object]) -> list[str]:
    """What differs between two keys' material, as dotted names down to the first level
    inside each part ("patches", "toolchain.nvcc", "kiln": kiln's own code)."""
    out = []
    for part in sorted(set(old) | set(new)):
        a, b = old.get(part), new.get(part)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{part}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            out.append(part)
    return out
