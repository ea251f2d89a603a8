"""SPDX license identifiers and expressions (``MIT``, ``BSD-2-Clause``, ``MIT OR
Apache-2.0``, ``Apache-2.0 WITH LLVM-exception``, ``LicenseRef-...``), checked against the
SPDX list that ``packaging`` ships (the one pip and PEP 639 metadata use), so kiln carries
no list of its own and a new SPDX id arrives with a ``packaging`` upgrade.

A value must be written as SPDX writes it (``MIT``, not ``mit``): the manifest, the SBOM
and the README then carry one spelling.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from difflib import get_close_matches

from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

# packaging's copy of the SPDX list; private, but its only public use is the function
# above, which says no more than "unknown" (packaging is pinned exactly in pyproject.toml).
from packaging.licenses._spdx import EXCEPTIONS, LICENSES, SPDXException, SPDXLicense

SPDX_LIST = "https://spdx.org/licenses/"

_OPERATORS = {"and", "or", "with"}
_REF = re.compile(r"^(DocumentRef-[A-Za-z0-9.-]+:)?LicenseRef-[A-Za-z0-9.-]+$", re.IGNORECASE)


def canonical(value: str) -> str | None:
    """``value`` as SPDX's list writes it (``bsd-3-clause`` -> ``BSD-3-Clause``), or None
    when it is no SPDX license expression."""
    try:
        return str(canonicalize_license_expression(value))
    except InvalidLicenseExpression:
        return None


def license_problem(value: str) -> str | None:
    """Why ``value`` is not an SPDX license expression as SPDX writes it, in one line that
    names the fix; None when it is one."""
    try:
        canonical = canonicalize_license_expression(value)
    except InvalidLicenseExpression:
        return _unknown(value)
    if canonical != value:
        return f"{value!r} is written {canonical} in SPDX's list; write {canonical}"
    return None


def _unknown(value: str) -> str:
    tokens = [t for t in re.split(r"[\s()]+", value) if t]
    if len(tokens) > 1 and not _OPERATORS & {t.lower() for t in tokens}:
        tokens = ["-".join(tokens)]  # "Apache 2.0": one id written with spaces
    after_with = False
    for token in tokens:
        low = token.lower()
        if low in _OPERATORS:
            after_with = low == "with"
            continue
        table, noun = (EXCEPTIONS, "license exception") if after_with else (LICENSES, "license")
        after_with = False
        bare = token.removesuffix("+")
        if (bare.lower() in table or _REF.match(bare)) and token in value:
            continue
        guess = _guess(bare, table)
        hint = f"; did you mean {guess}?" if guess else ""
        what = repr(value) if len(tokens) == 1 else f"{value!r}: {token}"
        return f"{what} is not an SPDX {noun} id{hint} (list: {SPDX_LIST})"
    return (
        f"{value!r} is not an SPDX license expression (like MIT, or MIT OR Apache-2.0; "
        f"list: {SPDX_LIST})"
    )


def _guess(token: str, table: Mapping[str, SPDXLicense | SPDXException]) -> str | None:
    """The id ``token`` most likely meant: the shortest current id it begins, as written
    or in letters and digits alone (``BSD-2``, ``BSD2`` -> ``BSD-2-Clause``; the latest of
    equals: ``Apache`` -> ``Apache-2.0``), else a close one."""
    ids = {k: v["id"] for k, v in table.items() if not v["deprecated"]}
    low = token.lower()
    if low in table:
        return table[low]["id"]
    for begins in (lambda k: k.startswith(low), lambda k: _alnum(k).startswith(_alnum(low))):
        begun = [k for k in ids if begins(k)]
        if begun:
            shortest = min(len(k) for k in begun)
            return ids[max(k for k in begun if len(k) == shortest)]
    close = get_close_matches(low, list(ids), n=1, cutoff=0.8)
    return ids[close[0]] if close else None


def _alnum(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text)
