"""The manifest: the single record of how every output of a release was made.

Written atomically (temp file, then rename) and validated against
``schemas/manifest.schema.json`` on every write and read.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from kiln.errors import ManifestError
from kiln.fsutil import sha256_file

SCHEMA_ID = "kiln.manifest/1"
FILE_NAME = "manifest.json"


def schema() -> dict[str, Any]:
    text = resources.files("kiln").joinpath("schemas/manifest.schema.json").read_text()
    return json.loads(text)


def validate(data: dict[str, Any], where: str) -> None:
    try:
        jsonschema.validate(data, schema())
    except jsonschema.ValidationError as exc:
        loc = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise ManifestError(f"{where}: {loc}: {exc.message}") from None


def write(path: Path, data: dict[str, Any]) -> None:
    validate(data, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest there (build first)") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not valid JSON: {exc}") from None
    validate(data, str(path))
    return data


def outputs(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every file the manifest lists: the vendors' outputs and the release-level files."""
    return [o for v in data["vendors"].values() for o in v["outputs"]] + data.get("files", [])


@dataclass(frozen=True)
class Mismatch:
    path: str
    problem: str


def check(path: Path) -> list[Mismatch]:
    """Re-hash every listed file; return each difference (empty list: all good)."""
    data = read(path)
    base = path.parent
    problems: list[Mismatch] = []
    for out in outputs(data):
        target = base / out["path"]
        if not target.is_file():
            problems.append(Mismatch(out["path"], "missing"))
            continue
        size = target.stat().st_size
        if size != out["size"]:
            problems.append(Mismatch(out["path"], f"size {size}, manifest says {out['size']}"))
            continue
        digest = sha256_file(target)
        if digest != out["sha256"]:
            problems.append(Mismatch(out["path"], f"sha256 {digest}, manifest: {out['sha256']}"))
    return problems
