"""Each upstream's license file, and each of its submodules' (they are built into or
shipped with its wheel: a header library copied into the wheel, one compiled in), found
in their own sources and shipped in ``licenses/``.

A missing license is an error: a release may not ship code whose terms it cannot
show. When the vendor TOML names the license (``source.license_id``, a submodule's
``license_id``: any SPDX id or expression) and it is one whose wording kiln knows
(:data:`MARKERS`), the file must read like that license.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.config.fields import LicenseId
from kiln.config.models import Submodule, Vendor
from kiln.errors import VerifyError

# Phrases every copy of the license carries (case-insensitive). Other SPDX ids and
# expressions are recorded as declared, their files shipped unchecked.
MARKERS = {
    "MIT": ("permission is hereby granted, free of charge",),
    "Apache-2.0": ("apache license", "version 2.0"),
    "BSD-2-Clause": ("redistribution and use in source and binary forms",),
    "BSD-3-Clause": ("redistribution and use in source and binary forms", "neither the name of"),
}


# Where a submodule's license is looked for when its TOML entry names none.
SUBMODULE_CANDIDATES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENSE.rst", "COPYING")


def _check_reads_like(what: str, src: Path, rel: str, expected: LicenseId | None, key: str) -> None:
    if expected not in MARKERS:
        return
    text = " ".join(src.read_text(errors="replace").lower().split())
    missing = [m for m in MARKERS[expected] if m not in text]
    if missing:
        raise VerifyError(
            f"{what}: {rel} does not read like {expected} (no {missing[0]!r}); check {key}"
        )


def collect_submodule(
    vendor: Vendor, path: str, declared: Submodule | None, tree: Path, dest_dir: Path
) -> tuple[Path, str]:
    """The license of the submodule at ``path`` into ``dest_dir`` as
    ``<vendor>-<path with / as _>-<file>``; returns the copy and the file it came from."""
    what = f"{vendor.name}: submodule {path}"
    root = tree / path
    names = [declared.license] if declared and declared.license else list(SUBMODULE_CANDIDATES)
    found = [n for n in names if (root / n).is_file() and not (root / n).is_symlink()]
    if not found:
        raise VerifyError(
            f"{what} has no license file (looked for {', '.join(names)}); a release cannot "
            f"ship or build in its code without one: name it in vendors/{vendor.name}.toml "
            f'([[source.submodules]] path = "{path}", license = "...")'
        )
    src = root / found[0]
    _check_reads_like(
        what,
        src,
        found[0],
        declared.license_id if declared else None,
        f"the submodule's license_id in vendors/{vendor.name}.toml",
    )
    dest = dest_dir / f"{vendor.name}-{path.replace('/', '_')}-{Path(found[0]).name}"
    dest_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest, found[0]


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
    _check_reads_like(
        vendor.name, src, vendor.source.license, vendor.source.license_id, "source.license_id"
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest
