"""Each upstream's license file, found in its own source and shipped in ``licenses/``.

A missing license is an error: a release may not ship code whose terms it cannot
show. When the vendor TOML names the license (``source.license_id``), the file must
read like that license.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.config.models import Vendor
from kiln.errors import VerifyError

# Phrases every copy of the license carries (case-insensitive).
MARKERS = {
    "MIT": ("permission is hereby granted, free of charge",),
    "Apache-2.0": ("apache license", "version 2.0"),
    "BSD-3-Clause": ("redistribution and use in source and binary forms", "neither the name of"),
}


def collect(vendor: Vendor, tree: Path, dest: Path) -> Path:
    src = tree / vendor.source.license
    if src.is_symlink() and not src.resolve().is_relative_to(tree.resolve()):
        raise VerifyError(
            f"{vendor.name}: {vendor.source.license} is a link to {src.resolve()}, outside "
            f"its source; a release ships only the upstream's own license file"
        )
    if not src.is_file():
        raise VerifyError(
            f"{vendor.name}: no license file at {vendor.source.license} in its source; a "
            f"release cannot ship it without one (fix source.license in vendors/"
            f"{vendor.name}.toml)"
        )
    expected = vendor.source.license_id
    if expected:
        text = " ".join(src.read_text(errors="replace").lower().split())
        missing = [m for m in MARKERS[expected] if m not in text]
        if missing:
            raise VerifyError(
                f"{vendor.name}: {vendor.source.license} does not read like {expected} "
                f"(no {missing[0]!r}); check source.license_id"
            )
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest
