"""The patch series: presence and hash checks, then all-or-nothing application.

Application is two-phase: every patch of a target is first applied, in order,
to a scratch copy of just the files the series touches; only if all succeed is
the real tree changed. So a conflict names the patch and the file, and leaves
the tree exactly as it was. A patch whose reverse applies cleanly (and whose
forward does not) is already in the tree: it is reported and skipped.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kiln.config.models import PatchEntry
from kiln.errors import PatchError
from kiln.fsutil import sha256_file
from kiln.sources.git import git

log = logging.getLogger("kiln.patches")


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
                f"run `nox -s lock` to fetch it from {entry.source}"
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
                f"patch {entry.file} changed since `nox -s lock` recorded it "
                f"(sha256 {actual[:12]}…, lock has {entry.sha256[:12]}…); building with the "
                f"edited patch, the manifest records it"
            )
    return warnings


def _git_apply(tree: Path, patch: Path, *flags: str) -> tuple[bool, str]:
    # GIT_CEILING_DIRECTORIES: never let git discover a repository above the tree.
    res = git(
        "apply",
        "--whitespace=nowarn",
        *flags,
        patch,
        cwd=tree,
        check=False,
        env={"GIT_CEILING_DIRECTORIES": str(tree.parent)},
    )
    return res.returncode == 0, res.output


def _touched(patch: Path, tree: Path) -> set[str]:
    ok, out = _git_apply(tree, patch, "--numstat", "-z")
    if not ok:
        raise PatchError(f"patch {patch.name} is not a valid patch: {_first_error(out)}")
    paths: set[str] = set()
    fields = out.split("\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        if not entry:
            i += 1
            continue
        counts = entry.split("\t")
        if len(counts) == 3 and counts[2] == "":  # rename: old and new follow
            paths.update(fields[i + 1 : i + 3])
            i += 3
        else:
            paths.add(counts[-1])
            i += 1
    return paths


def _escape(tree: Path, rel: str) -> str | None:
    """Why a patch writing ``rel`` would land outside ``tree`` (an absolute path, ``..``,
    or a folder that is a symbolic link in the tree), or None."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts:
        return f"writes {rel!r}, outside its tree"
    for i in range(1, len(path.parts)):
        if tree.joinpath(*path.parts[:i]).is_symlink():
            return f"writes {rel!r} through the symbolic link {'/'.join(path.parts[:i])!r}"
    return None


def _link_escape(root: Path, rel: str) -> str | None:
    """Why ``root/rel``, a symbolic link a patch made, points outside the tree, or None."""
    target = os.readlink(root / rel)
    resolved = os.path.normpath(str(PurePosixPath(rel).parent / target))
    if os.path.isabs(target) or resolved == ".." or resolved.startswith("../"):
        return f"makes {rel!r} a link to {target!r}, outside its tree"
    return None


def _refuse(entry: PatchEntry, problem: str, what: str) -> PatchError:
    return PatchError(
        f"{what}: patch {entry.file} {problem}; refusing it (the tree was left unchanged)"
    )


def _first_error(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    return lines[0].removeprefix("error: ") if lines else (output.strip().splitlines() or ["?"])[0]


def _failed_file(output: str) -> str:
    for pattern in (
        r"error: patch failed: (.+?):\d+",
        r"error: (.+?): (?:patch does not apply|"
        r"does not exist in index|No such file or directory|already exists)",
    ):
        m = re.search(pattern, output)
        if m:
            return m.group(1)
    return _first_error(output)


def apply_series(
    tree: Path, entries: list[PatchEntry], patches_dir: Path, what: str
) -> list[AppliedPatch]:
    """Apply ``entries`` to ``tree``: all of them, or (on any conflict) none."""
    if not entries:
        return []
    require_present(entries, patches_dir)
    plan: list[tuple[PatchEntry, Path, str]] = []
    touched: set[str] = set()
    for entry in entries:
        path = (patches_dir / entry.file).resolve()
        paths = _touched(path, tree)
        for rel in sorted(paths):
            problem = _escape(tree, rel)
            if problem:
                raise _refuse(entry, problem, what)
        touched |= paths
        plan.append((entry, path, sha256_file(path)))

    statuses = _check_in_scratch(tree, plan, touched, what)

    results = []
    for (entry, path, digest), status in zip(plan, statuses, strict=True):
        if status == "applied":
            ok, out = _git_apply(tree, path)
            if not ok:  # the scratch check passed, so this means the tree changed under us
                raise PatchError(
                    f"{what}: patch {entry.file} failed on {_failed_file(out)} "
                    f"after passing its check; the tree changed during the run"
                )
            log.info("%s: applied %s", what, entry.file)
        else:
            log.warning("%s: %s is already applied; not applying it twice", what, entry.file)
        results.append(AppliedPatch(entry.file, digest, entry.sha256, status))
    return results


def _check_in_scratch(
    tree: Path, plan: list[tuple[PatchEntry, Path, str]], touched: set[str], what: str
) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="kiln-patch-check-") as tmp:
        scratch = Path(tmp) / "tree"
        scratch.mkdir()
        for rel in touched:
            src = tree / rel
            if src.is_file() or src.is_symlink():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, scratch / rel, follow_symlinks=False)
        statuses = []
        for entry, path, _ in plan:
            ok, out = _git_apply(scratch, path)
            if ok:
                for rel in sorted(_touched(path, scratch)):
                    if (scratch / rel).is_symlink() and (problem := _link_escape(scratch, rel)):
                        raise _refuse(entry, problem, what)
                statuses.append("applied")
                continue
            reverse_ok, _ = _git_apply(scratch, path, "--reverse", "--check")
            if reverse_ok:
                statuses.append("already-applied")
                continue
            raise PatchError(
                f"{what}: patch {entry.file} does not apply: {_failed_file(out)} conflicts; "
                f"the tree was left unchanged (refresh the patch against the pinned commit)"
            )
        return statuses
