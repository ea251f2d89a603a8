"""A failed step, explained on the first screen: the unit, its first errors, the cause and
the fix that the step found where it ran (:mod:`kiln.inside.diagnose`), and the step's
whole log path, never cut. The same goes into the failure record beside the logs
(``<vendor>.failure.json``) and into a GitHub Actions annotation on the unit's line.

Out of memory keeps the runner's own message (its cgroup counted the kill): the record
then names that as the cause."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import cast

from kiln.errors import BuildError, FailureRecord
from kiln.inside.causes.resources import OOM_FIX
from kiln.orchestrate import fixcheck, github

log = logging.getLogger(__name__)

SHOWN_ERRORS = 5


def record_path(logs: Path, vendor: str) -> Path:
    return logs / f"{vendor}.failure.json"


def read(path: Path) -> FailureRecord | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cast(FailureRecord, data) if isinstance(data, dict) else None


def _exit_line(exc: BuildError) -> str:
    """The runner's first line (``building X failed with exit code 1; full log: ...``)
    without its log path (shown on a line of its own)."""
    first = str(exc).splitlines()[0] if str(exc) else "the build failed"
    return first.split("; full log: ")[0]


def render(record: FailureRecord, log_file: Path, headline: str) -> str:
    """The message for people: what failed and where, the first errors, cause, fix, log."""
    unit = record.get("unit")
    lines = [f"{headline}" + (f", in {unit}:" if unit else ":")]
    errors = [e["text"] for e in record.get("errors", [])][:SHOWN_ERRORS]
    lines += [f"    {text}" for text in errors] or ["    (no compiler or linker error found)"]
    cause = record.get("cause")
    if cause:
        lines.append(f"  cause: {cause['cause']}")
        lines.append(f"  fix: {cause['fix']}")
    lines.append(f"  full log: {log_file}")
    return "\n".join(lines)


def summary_line(record: FailureRecord | None) -> str:
    """One cell for the summary table: the unit and its first error (whole)."""
    if not record:
        return ""
    errors = record.get("errors") or []
    first = errors[0]["text"].splitlines()[0] if errors else ""  # without its chain
    cause = record.get("cause") or {}
    row = f" [{cause['row']}]" if cause.get("row") else ""
    return f"{first}{row}" if first else (cause.get("cause", "") + row)


def explain(
    exc: BuildError,
    vendor: str,
    logs: Path,
    log_file: Path,
    resolve_fix: Callable[[dict[str, str]], str] | None = None,
) -> BuildError:
    """The error to raise for ``vendor``'s failed step: explained from its failure record
    when the step wrote one (else ``exc`` as it is); the record gets the log's path.
    ``resolve_fix`` resolves a fix that changes the build environment (the cause's
    ``resolve``) where the index can be reached: its sentence joins the fix."""
    path = record_path(logs, vendor)
    record = read(path)
    if exc.oom:
        record = {**(record or {}), "vendor": vendor}
        record["cause"] = {
            "row": "out-of-memory",
            "cause": str(exc).splitlines()[0],
            "fix": OOM_FIX,
        }
        _write(path, record, log_file)
        return exc
    if record is None or not (record.get("errors") or record.get("cause")):
        return exc
    cause = record.get("cause") or {}
    resolve = cause.get("resolve")
    if resolve and resolve_fix is not None and "resolved" not in cause:
        cause["resolved"] = resolve_fix(resolve)
        if cause["resolved"].startswith(fixcheck.INSTEAD):  # the fix asked for the impossible
            cause["fix"] = cause["resolved"].removeprefix(fixcheck.INSTEAD)
        else:
            cause["fix"] = f"{cause['fix']}; {cause['resolved']}"
            edit = fixcheck.build_tools_edit(resolve, cause["resolved"], vendor)
            if edit and not cause.get("edit"):
                cause["edit"] = edit
    _write(path, record, log_file)
    message = render(record, log_file, _exit_line(exc))
    explained = BuildError(message, output=exc.output, record=record)
    _annotate(vendor, record)
    return explained


def _write(path: Path, record: FailureRecord, log_file: Path) -> None:
    record["log"] = str(log_file)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def _annotate(vendor: str, record: FailureRecord) -> None:
    """One ``::error file=,line=::`` annotation for the first error (GitHub Actions)."""
    errors = record.get("errors") or []
    first = errors[0] if errors else {}
    cause = record.get("cause") or {}
    text = "\n".join(
        [e["text"] for e in errors[:SHOWN_ERRORS]]
        + ([f"cause: {cause['cause']}", f"fix: {cause['fix']}"] if cause else [])
        + [f"full log: {record.get('log', '')}"]
    )
    github.annotate_error(
        text,
        f"kiln: building {vendor} failed",
        file=first.get("file") or record.get("unit"),
        line=first.get("line"),
    )
