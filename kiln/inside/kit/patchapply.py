"""The one two-phase patch engine (stdlib only): kiln's build applies a series with it,
and the shipped ``rebuild.py`` swaps an edited patch into an installed tree with it.

A change is a list of steps (a patch, forward or reversed). Every step is first applied,
in order, to a scratch copy of just the files the steps touch; only if all succeed is the
real tree changed, so a conflict names the patch and the file and leaves the tree
exactly as it was. A step that writes outside its tree (an absolute path, ``..``, a path
through a symbolic link in the tree) or makes a link pointing outside is refused before
anything is written. Where allowed, a forward step whose reverse applies cleanly is
already in the tree: it is reported as such and skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

APPLIED = "applied"
ALREADY = "already-applied"

# (argv, cwd, extra environment) -> (exit code, combined output). kiln passes its
# logging subprocess helper; the shipped kit runs git directly.
Runner = Callable[[Sequence[str], Path, dict[str, str]], tuple[int, str]]


def _subprocess(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    res = subprocess.run(
        list(argv), cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, check=False
    )
    return res.returncode, res.stdout + res.stderr


@dataclass(frozen=True)
class Step:
    patch: Path
    reverse: bool = False

    @property
    def name(self) -> str:
        return self.patch.name


class Refused(Exception):
    """A step that cannot be applied; ``kind``: "invalid", "escape", "conflict" or
    "changed" (the tree changed between the check and the change)."""

    def __init__(self, kind: str, step: Step, detail: str, output: str = "") -> None:
        super().__init__(f"{step.name}: {detail}")
        self.kind, self.step, self.detail = kind, step, detail
        self.output = output  # git's own words (a conflict's hunk line), for the log


def _git_apply(run: Runner, tree: Path, step: Step, *flags: str) -> tuple[bool, str]:
    # GIT_CEILING_DIRECTORIES: never let git discover a repository above the tree.
    argv = ["git", "apply", "--whitespace=nowarn", *(["--reverse"] if step.reverse else []), *flags]
    rc, out = run([*argv, str(step.patch)], tree, {"GIT_CEILING_DIRECTORIES": str(tree.parent)})
    return rc == 0, out


def first_error(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    return lines[0].removeprefix("error: ") if lines else (output.strip().splitlines() or ["?"])[0]


def failed_hunk(output: str) -> str | None:
    """git's line for the hunk that failed (``error: patch failed: src/a.txt:12``)."""
    m = re.search(r"^error: patch failed: .+:\d+$", output, re.MULTILINE)
    return m.group(0) if m else None


def failed_file(output: str) -> str:
    """The file git's output says a patch failed on."""
    for pattern in (
        r"error: patch failed: (.+?):\d+",
        r"error: (.+?): (?:patch does not apply|"
        r"does not exist in index|No such file or directory|already exists)",
    ):
        m = re.search(pattern, output)
        if m:
            return m.group(1)
    return first_error(output)


def touched(run: Runner, tree: Path, step: Step) -> set[str]:
    """Every path the patch writes (both names of a rename), from ``--numstat -z``."""
    ok, out = _git_apply(run, tree, step, "--numstat", "-z")
    if not ok:
        raise Refused("invalid", step, f"is not a valid patch: {first_error(out)}")
    paths: set[str] = set()
    fields = out.split("\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        if not entry:
            i += 1
            continue
        counts = entry.split("\t")
        if len(counts) == 3 and counts[2] == "":  # a rename: old and new follow
            paths.update(fields[i + 1 : i + 3])
            i += 3
        else:
            paths.add(counts[-1])
            i += 1
    return paths


def escape(tree: Path, rel: str) -> str | None:
    """Why writing ``rel`` would land outside ``tree`` (an absolute path, ``..``, or a
    folder that is a symbolic link in the tree), or None."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts:
        return f"writes {rel!r}, outside its tree"
    for i in range(1, len(path.parts)):
        if tree.joinpath(*path.parts[:i]).is_symlink():
            return f"writes {rel!r} through the symbolic link {'/'.join(path.parts[:i])!r}"
    return None


def link_escape(root: Path, rel: str) -> str | None:
    """Why ``root/rel``, a symbolic link a patch made, points outside the tree, or None."""
    target = os.readlink(root / rel)
    resolved = os.path.normpath(str(PurePosixPath(rel).parent / target))
    if os.path.isabs(target) or resolved == ".." or resolved.startswith("../"):
        return f"makes {rel!r} a link to {target!r}, outside its tree"
    return None


def _check_in_scratch(
    run: Runner, tree: Path, steps: list[Step], paths: set[str], allow_already: bool
) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="kiln-patch-check-") as tmp:
        scratch = Path(tmp) / "tree"
        scratch.mkdir()
        for rel in paths:
            src = tree / rel
            if src.is_file() or src.is_symlink():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, scratch / rel, follow_symlinks=False)
        statuses = []
        for step in steps:
            ok, out = _git_apply(run, scratch, step)
            if ok:
                for rel in sorted(touched(run, scratch, step)):
                    if (scratch / rel).is_symlink() and (problem := link_escape(scratch, rel)):
                        raise Refused("escape", step, problem)
                statuses.append(APPLIED)
                continue
            if allow_already and not step.reverse:
                back = Step(step.patch, reverse=True)
                if _git_apply(run, scratch, back, "--check")[0]:
                    statuses.append(ALREADY)
                    continue
            raise Refused("conflict", step, failed_file(out), out)
        return statuses


def apply(
    tree: Path, steps: list[Step], *, allow_already: bool = False, run: Runner = _subprocess
) -> list[str]:
    """Apply ``steps`` to ``tree``: all of them, or (on any problem) none. Returns each
    step's status (``applied``, or ``already-applied`` where ``allow_already``)."""
    paths: set[str] = set()
    for step in steps:
        found = touched(run, tree, step)
        for rel in sorted(found):
            problem = escape(tree, rel)
            if problem:
                raise Refused("escape", step, problem)
        paths |= found
    statuses = _check_in_scratch(run, tree, steps, paths, allow_already)
    for step, status in zip(steps, statuses, strict=True):
        if status == APPLIED:
            ok, out = _git_apply(run, tree, step)
            if not ok:  # the scratch check passed: the tree changed under us
                raise Refused("changed", step, failed_file(out), out)
    return statuses
