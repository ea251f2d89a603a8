"""The patch series: absent patches stop early, conflicts leave the tree clean,
already-applied patches are detected, a series is applied all or nothing."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from kiln.config.models import PatchEntry
from kiln.errors import PatchError
from kiln.sources.git import git, git_out
from kiln.sources.gitrepo import CommitSpec, make_repo
from kiln.sources.patches import apply_series, hash_report, require_present

ORIGINAL = "line one\nline two\nline three\n"


def diff(old: str, new: str, path: str = "src/a.txt") -> str:
    return "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}")
    )


GOOD = diff(ORIGINAL, "line one\nline 2\nline three\n")
SECOND = (
    "--- a/src/a.txt\n+++ b/src/a.txt\n@@ -1,3 +1,4 @@\n line one\n line 2\n"
    " line three\n+line four\n"
)
CONFLICT = diff("line one\nsomething else\nline three\n", "x\ny\nz\n")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    repo = tmp_path / "tree"
    make_repo(repo, [CommitSpec("base", {"src/a.txt": ORIGINAL, "src/b.txt": "b\n"})])
    return repo


def series(tmp_path: Path, **patches: str) -> tuple[list[PatchEntry], Path]:
    d = tmp_path / "patches"
    d.mkdir(exist_ok=True)
    for name, text in patches.items():
        (d / f"{name}.patch").write_text(text)
    return [PatchEntry(file=f"{n}.patch", target="t") for n in patches], d


def test_series_applies_in_order(tmp_path: Path, tree: Path) -> None:
    entries, d = series(tmp_path, first=GOOD, second=SECOND)
    results = apply_series(tree, entries, d, "t")
    assert [r.status for r in results] == ["applied", "applied"]
    assert (tree / "src/a.txt").read_text() == "line one\nline 2\nline three\nline four\n"


def test_conflict_names_patch_and_file_and_leaves_tree_clean(tmp_path: Path, tree: Path) -> None:
    entries, d = series(tmp_path, first=GOOD, second=CONFLICT)
    log = tmp_path / "logs" / "t-patch.log"
    with pytest.raises(PatchError) as info:
        apply_series(tree, entries, d, "t", log)
    msg = str(info.value)
    # git's own hunk line and where git's whole output is (issue 35)
    assert msg.startswith(
        "t: patch second.patch does not apply: src/a.txt conflicts (git: error: patch failed: "
        "src/a.txt:"
    ), msg
    assert msg.endswith(f"; git's output: {log}")
    assert "error: patch failed: src/a.txt:" in log.read_text()
    # all or nothing: the first patch, which would apply, was not applied either
    assert git_out("status", "--porcelain", cwd=tree) == ""
    assert (tree / "src/a.txt").read_text() == ORIGINAL


def test_patch_on_missing_file(tmp_path: Path, tree: Path) -> None:
    entries, d = series(tmp_path, bad=diff(ORIGINAL, "x\n", path="src/nosuch.txt"))
    with pytest.raises(PatchError, match="bad.patch does not apply: src/nosuch.txt"):
        apply_series(tree, entries, d, "t")
    assert git_out("status", "--porcelain", cwd=tree) == ""


def test_already_applied_is_detected_not_applied_twice(tmp_path: Path, tree: Path) -> None:
    entries, d = series(tmp_path, first=GOOD)
    apply_series(tree, entries, d, "t")
    git(
        "commit",
        "-qam",
        "upstream merged it",
        cwd=tree,
        env={
            "GIT_AUTHOR_NAME": "a",
            "GIT_AUTHOR_EMAIL": "a@b",
            "GIT_COMMITTER_NAME": "a",
            "GIT_COMMITTER_EMAIL": "a@b",
        },
    )
    results = apply_series(tree, entries, d, "t")
    assert [r.status for r in results] == ["already-applied"]
    assert (tree / "src/a.txt").read_text() == "line one\nline 2\nline three\n"


def test_absent_patch_names_file_and_how_to_fetch(tmp_path: Path) -> None:
    entry = PatchEntry(
        file="deepinfer-prefix-cache.patch",
        target="deepinfer",
        source="hf://inferencekey/deepinfer-sm100-cu132/patches/deepinfer-prefix-cache.patch",
    )
    with pytest.raises(PatchError) as info:
        require_present([entry], tmp_path)
    msg = str(info.value)
    assert "deepinfer-prefix-cache.patch (for deepinfer) is listed in the series but absent" in msg
    assert f"put it at {tmp_path}/deepinfer-prefix-cache.patch" in msg
    assert "kiln lock" in msg and "hf://inferencekey/deepinfer-sm100-cu132" in msg


def test_edited_patch_is_reported_not_refused(tmp_path: Path, tree: Path) -> None:
    entries, d = series(tmp_path, first=GOOD)
    locked = entries[0].model_copy(update={"sha256": "0" * 64})
    warnings = hash_report([locked], d)
    assert len(warnings) == 1 and "first.patch changed since `kiln lock`" in warnings[0]
    results = apply_series(tree, [locked], d, "t")
    assert results[0].status == "applied" and results[0].matches_lock is False


def test_patch_escaping_the_tree_is_refused(tmp_path: Path, tree: Path) -> None:
    evil = "--- a/../evil.txt\n+++ b/../evil.txt\n@@ -0,0 +1 @@\n+pwned\n"
    entries, d = series(tmp_path, evil=evil)
    with pytest.raises(PatchError):
        apply_series(tree, entries, d, "t")
    assert not (tmp_path / "evil.txt").exists()
