"""``kiln build --fix``: the fixes a failed build printed, applied as the structured edits
they are, as ``cargo fix`` and ``ruff --fix`` do (issue 41).

A cause row whose fix is mechanical carries it as an edit (``Cause.edit``, kept in the
step's failure record: ``kiln/inside/causes/``): one key of a vendor's TOML set, or
values appended to a list there; or lines appended to ``runtime-requirements.txt``.
Fixes that need judgement (a patch, a reason to skip a module, a version to choose) stay
text. Each edit is applied with tomlkit (comments and layout kept), shown as a unified
diff, and the build runs again once.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Table

from kiln.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Edit:
    vendor: str
    row: str
    file: str  # relative to the workspace
    keys: tuple[str, ...] = ()
    value: Any = None  # "set"
    append: tuple[Any, ...] = ()  # to a TOML list
    lines: tuple[str, ...] = ()  # to a text file


@dataclass(frozen=True)
class Pending:
    """What ``--fix`` found after a failed build: the edits it may apply, and why each
    other failure of this run has none (the lines ``--fix`` says when it applies
    nothing)."""

    edits: list[Edit]
    skipped: list[str]


def pending(logs: Path, workspace: Path, since: float, vendors: set[str] | None = None) -> Pending:
    """The edits of the failure records this run wrote (modified at or after ``since``)
    for vendors of this run (``vendors``; None: any), in vendor order. A record of an
    earlier run, or of another vendor, is never applied: its fix may no longer hold (the
    recipe changed since) or its vendor may be gone; an edit of a vendor file that does
    not exist is not applied either (``--fix`` never creates one)."""
    edits: list[Edit] = []
    skipped: list[str] = []
    for path in sorted(logs.glob("*.failure.json")):
        try:
            if path.stat().st_mtime < since:
                continue  # an earlier run's
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        vendor = str(record.get("vendor") or path.name.removesuffix(".failure.json"))
        if vendors is not None and vendor not in vendors:
            continue
        cause = record.get("cause") or {}
        edit = cause.get("edit") if isinstance(cause, dict) else None
        if not isinstance(edit, dict) or not edit.get("file"):
            row = cause.get("row") if isinstance(cause, dict) else None
            skipped.append(
                f"{vendor}: its fix ({row}) is not a mechanical edit: apply it by hand"
                if row
                else f"{vendor}: no cause row knew its failure: nothing to apply"
            )
            continue
        target = workspace / str(edit["file"])
        if str(edit["file"]).startswith("vendors/") and not target.is_file():
            skipped.append(f"{vendor}: {edit['file']} does not exist: --fix creates no vendor file")
            continue
        edits.append(
            Edit(
                vendor=str(record.get("vendor") or path.name.removesuffix(".failure.json")),
                row=str(cause.get("row", "")),
                file=str(edit["file"]),
                keys=tuple(edit.get("keys") or ()),
                value=edit.get("set"),
                append=tuple(edit.get("append") or ()),
                lines=tuple(edit.get("append_lines") or ()),
            )
        )
    return Pending(edits, skipped)


def _edited_toml(text: str, edit: Edit) -> str:
    doc = tomlkit.parse(text)
    table: Any = doc
    for key in edit.keys[:-1]:
        if key not in table:
            table[key] = tomlkit.table(is_super_table=False)
        table = table[key]
        if not isinstance(table, Table | dict):
            raise ConfigError(f"{edit.file}: {'.'.join(edit.keys)}: {key} is not a table")
    last = edit.keys[-1]
    if edit.append:
        have = list(table.get(last, []))
        table[last] = have + [v for v in edit.append if v not in have]
    else:
        table[last] = edit.value
    return tomlkit.dumps(doc)


def apply(workspace: Path, edit: Edit) -> str:
    """Apply ``edit`` in ``workspace``; the unified diff of what changed ("" if nothing)."""
    path = workspace / edit.file
    before = path.read_text() if path.is_file() else ""
    if edit.lines:
        named = {ln.strip() for ln in before.splitlines()}
        new = [ln for ln in edit.lines if ln not in named]
        head = "" if not before or before.endswith("\n") else "\n"
        after = before + (head + "".join(f"{ln}\n" for ln in new) if new else "")
    else:
        after = _edited_toml(before, edit)
    if after == before:
        return ""
    path.write_text(after)
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{edit.file}",
            f"b/{edit.file}",
        )
    )
