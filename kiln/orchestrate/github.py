"""GitHub Actions' own faces for a build: the summary table in the job's step summary
(``$GITHUB_STEP_SUMMARY``, Markdown) and errors as ``::error::`` workflow commands, so a
failed job shows its cause on the run's page. Outside Actions both do nothing."""

from __future__ import annotations

import os
from collections.abc import Sequence

from kiln.inside import say

in_actions = say.in_actions


def _escape(text: str) -> str:
    """Workflow-command data escaping (``%``, CR and LF), as the runner expects."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape(text).replace(":", "%3A").replace(",", "%2C")


def annotate_error(
    message: str, title: str = "kiln", file: str | None = None, line: int | None = None
) -> None:
    """An ``::error::`` annotation; with ``file`` (and ``line``) GitHub puts it on that
    line of that file."""
    props = [f"file={_escape_property(file)}"] if file else []
    props += [f"line={line}"] if file and line else []
    props.append(f"title={_escape_property(title)}")
    say.command(f"::error {','.join(props)}::{_escape(message)}")


def write_step_summary(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    details: Sequence[str] = (),
    note: str = "",
) -> None:
    """Append a Markdown table to the step summary (one per build; a job may run several),
    then ``note`` (the build's bound) and each of ``details`` (a failed step's
    explanation) as a code block."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = [f"### {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    if note:
        lines += ["", note]
    for text in details:
        lines += ["", "```text", text.replace("```", "` ` `"), "```"]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
