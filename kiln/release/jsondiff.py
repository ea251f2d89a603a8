"""Where two JSON values differ, by dotted path (``vendors.alpha.outputs.0.sha256``): what
``manifest merge`` names when two partials disagree and what ``kiln verify`` lists when a
rebuild's manifest or envelope is not the release's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def differences(a: Any, b: Any, where: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Each place ``a`` and ``b`` differ: (its path, the value in ``a``, in ``b``); a key
    only one side has is a difference, a list of another length one difference."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in a or key not in b:
                yield sub, a.get(key), b.get(key)
            else:
                yield from differences(a[key], b[key], sub)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{where} (length {len(a)} vs {len(b)})", a, b
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{where}.{i}")
    elif a != b:
        yield where, a, b


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """The path of the first place ``a`` and ``b`` differ (None: equal)."""
    return next((path for path, _, _ in differences(a, b, where)), None)
