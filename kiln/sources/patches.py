"""The patch series: presence and hash checks, then all-or-nothing application.

Application is two-phase (``kiln/inside/kit/patchapply.py``, the engine the shipped
``rebuild.py`` uses too): every patch of a target is first applied, in order, to a
scratch copy of just the files the series touches; only if all succeed is the real tree
changed. So a conflict names the patch and the file, and leaves the tree exactly as it
was. A patch whose reverse applies cleanly (and whose forward does not) is already in
the tree: it is reported and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.config.models import PatchEntry
from kiln.errors import PatchError
from kiln.fsutil import sha256_file
from kiln.inside.kit import patchapply
from kiln.sources.git import git

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedPatch:
    file: str
    sha256: str
    locked_sha256: str | None
    status: str  # "applied" | "already-applied"

    @property
    def matches_lock(self) -> bool | None:
        return None if self.locked_sha256 is None else self.locked_sha256 == self.sha256


def require_present(
    entries: list[PatchEntry], patches_dir: Path, belongs: Path | None = None
) -> None:
    """Stop before any work when the series names a patch that is not on disk.
    ``belongs``: the folder the message tells the user to put it in, where ``patches_dir``
    is a build's snapshot of it (kiln.inputs)."""
    for entry in entries:
        path = patches_dir / entry.file
        if not path.is_file():
            how = (
                f"run `kiln lock` to fetch it from {entry.source}"
                if entry.source
                else "get it from the patch's maintainers"
            )
            raise PatchError(
                f"patch {entry.file} (for {entry.target}) is listed in the series but absent: "
                f"put it at {(belongs or patches_dir) / entry.file} ({how})"
            )


def hash_report(entries: list[PatchEntry], patches_dir: Path) -> list[str]:
    """Warnings for patches whose content no longer matches the hash the lock recorded."""
    warnings = []
    for entry in entries:
        actual = sha256_file(patches_dir / entry.file)
        if entry.sha256 and entry.sha256 != actual:
            warnings.append(
                f"patch {entry.file} changed since `kiln lock` recorded it "
                f"(sha256 {actual[:12]}…, lock has {entry.sha256[:12]}…); building with the "
                f"edited patch, the manifest records it"
            )
    return warnings


def _run(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """The patch engine's commands through kiln's git helper (logged, non-interactive)."""
    res = git(*argv[1:], cwd=cwd, check=False, env=env)
    return res.returncode, res.output


def _refuse(entry: PatchEntry, problem: str, what: str) -> PatchError:
    return PatchError(
        f"{what}: patch {entry.file} {problem}; refusing it (the tree was left unchanged)"
    )


def apply_series(
    tree: Path,
    entries: list[PatchEntry],
    patches_dir: Path,
    what: str,
    log_file: Path | None = None,
) -> list[AppliedPatch]:
    """Apply ``entries`` to ``tree``: all of them, or (on any conflict) none. A conflict
    says git's hunk line, and git's whole output goes to ``log_file``."""
    if not entries:
        return []
    require_present(entries, patches_dir)
    paths = [(patches_dir / e.file).resolve() for e in entries]
    by_name = {p.name: e for p, e in zip(paths, entries, strict=True)}
    try:
        statuses = patchapply.apply(
            tree, [patchapply.Step(p) for p in paths], allow_already=True, run=_run
        )
    except patchapply.Refused as exc:
        entry = by_name[exc.step.name]
        if exc.kind == "invalid":
            raise PatchError(f"patch {entry.file} {exc.detail}") from None
        if exc.kind == "escape":
            raise _refuse(entry, exc.detail, what) from None
        if exc.kind == "changed":
            raise PatchError(
                f"{what}: patch {entry.file} failed on {exc.detail} after passing its check; "
                f"the tree changed during the run"
            ) from None
        hunk = patchapply.failed_hunk(exc.output)
        logged = ""
        if log_file is not None and exc.output:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            log_file.write_text(
                f"$ git apply {entry.file} (in a scratch copy of {tree})\n{exc.output}"
            )
            logged = f"; git's output: {log_file}"
        raise PatchError(
            f"{what}: patch {entry.file} does not apply: {exc.detail} conflicts"
            + (f" (git: {hunk})" if hunk else "")
            + "; the tree was left unchanged (refresh the patch against the pinned commit)"
            + logged
        ) from None
    results = []
    for entry, path, status in zip(entries, paths, statuses, strict=True):
        if status == patchapply.APPLIED:
            log.info("%s: applied %s", what, entry.file)
        else:
            log.warning("%s: %s is already applied; not applying it twice", what, entry.file)
        results.append(AppliedPatch(entry.file, sha256_file(path), entry.sha256, status))
    return results
