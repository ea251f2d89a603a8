"""Which license a license file holds, as an SPDX id.

Two rules, in order:

1. an ``SPDX-License-Identifier:`` line in the file (CUTLASS writes one above its
   BSD-3-Clause text), checked against the SPDX license list ``packaging`` ships
   (:mod:`kiln.config.spdx`, as a recipe's ``license_id`` is);
2. the license's own distinctive clauses: each id below names the sentences every copy
   of it carries and the sentences that would make it another license (BSD-2-Clause is
   BSD-3-Clause without "neither the name of"). A file may say more than the license
   (fmt's MIT text is followed by an optional exception that only grants more).

A whole-text comparison (pre-commit's ``identify.license_id``: an edit distance against
the SPDX texts) was tried first and left out: it names neither fmt's MIT with its
exception nor CUTLASS's tagged BSD-3-Clause, the two licenses the public upstreams'
submodules carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kiln.config.spdx import canonical

# Where a tree's (or a submodule's) license file is looked for, in this order.
CANDIDATES = (
    "LICENSE",
    "LICENSE.txt",
    "LICENSE.md",
    "LICENSE.rst",
    "LICENCE",
    "COPYING",
    "COPYING.txt",
    "LICENSE-MIT",
    "LICENSE-APACHE",
)

# id -> (clauses every copy carries, clauses that make it another license); checked in
# this order, the first whose clauses all appear and none of whose exclusions does wins.
CLAUSES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Apache-2.0", ("apache license", "version 2.0", "terms and conditions for use"), ()),
    ("MPL-2.0", ("mozilla public license version 2.0",), ()),
    (
        "BSD-3-Clause",
        (
            "redistribution and use in source and binary forms",
            "redistributions of source code must retain",
            "neither the name of",
        ),
        ("all advertising materials",),
    ),
    (
        "BSD-2-Clause",
        (
            "redistribution and use in source and binary forms",
            "redistributions of source code must retain",
            "redistributions in binary form must reproduce",
        ),
        ("neither the name of", "all advertising materials", "the names of its contributors"),
    ),
    (
        "MIT",
        (
            "permission is hereby granted, free of charge",
            "the above copyright notice and this permission notice shall be included",
        ),
        (),
    ),
    ("MIT-0", ("permission is hereby granted, free of charge",), ()),
    ("ISC", ("permission to use, copy, modify, and/or distribute this software for any",), ()),
    ("BSL-1.0", ("boost software license - version 1.0",), ()),
    ("Zlib", ("altered source versions must be plainly marked as such",), ()),
    ("Unlicense", ("this is free and unencumbered software released into the public domain",), ()),
)

_TAG = re.compile(r"SPDX-License-Identifier:\s*([^\n*]+?)\s*(?:\*/|-->)?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class LicenseFile:
    path: str  # relative to the tree (or submodule) it belongs to
    spdx: str | None
    how: str  # the evidence: the tag's line, or the clauses that matched


def find(root: Path) -> str | None:
    """The first license file of ``root`` (a regular file, not a link out of the tree)."""
    for name in CANDIDATES:
        path = root / name
        if path.is_file() and not path.is_symlink():
            return name
    return None


def identify(root: Path, rel: str) -> LicenseFile:
    text = (root / rel).read_text(errors="replace")
    tag = _TAG.search(text[:4000])
    if tag:
        expression = canonical(tag.group(1).strip())
        line = text[: tag.start()].count("\n") + 1
        if expression is not None:
            return LicenseFile(rel, expression, f"{rel}:{line}: SPDX-License-Identifier tag")
    flat = " ".join(text.lower().replace("\u2019", "'").split())
    matched = [
        (spdx, must[0])
        for spdx, must, never in CLAUSES
        if all(c in flat for c in must) and not any(c in flat for c in never)
    ]
    if not matched:
        return LicenseFile(rel, None, f"{rel}: reads like none of {', '.join(_ids())}")
    spdx, clause = matched[0]
    return LicenseFile(rel, spdx, f"{rel}: reads like {spdx} ({clause!r} ...)")


def _ids() -> list[str]:
    return [c[0] for c in CLAUSES]
