"""Make small git repositories with a deterministic history.

Used by ``kiln demo`` (the bundled example becomes real upstream repositories at
run time) and by the tests' fixture upstreams. Fixed identities and dates make
the commit SHAs the same on every machine, so a lock can pin them.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kiln.sources.git import git, git_out

BASE_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z


@dataclass
class CommitSpec:
    message: str
    files: Mapping[str, bytes | str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    # path -> (URL written to .gitmodules, commit recorded in the tree)
    submodules: dict[str, tuple[str, str]] = field(default_factory=dict)
    executable: set[str] = field(default_factory=set)


def _identity(epoch: int) -> dict[str, str]:
    stamp = f"{epoch} +0000"
    return {
        "GIT_AUTHOR_NAME": "kiln fixture",
        "GIT_AUTHOR_EMAIL": "fixture@kiln.invalid",
        "GIT_COMMITTER_NAME": "kiln fixture",
        "GIT_COMMITTER_EMAIL": "fixture@kiln.invalid",
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
    }


def make_repo(dest: Path, commits: list[CommitSpec], epoch: int = BASE_EPOCH) -> list[str]:
    """Create ``dest`` as a fresh repository with ``commits``; return their SHAs."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    git("init", "--quiet", "--initial-branch=main", dest)
    git("config", "core.fileMode", "true", cwd=dest)
    shas: list[str] = []
    modules: dict[str, str] = {}
    for i, spec in enumerate(commits):
        for rel, content in spec.files.items():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            target.write_bytes(data)
            target.chmod(0o755 if rel in spec.executable else 0o644)
            git("add", "--", rel, cwd=dest)
        for rel in spec.delete:
            git("rm", "--quiet", "-r", "--", rel, cwd=dest)
        for path, (url, sha) in spec.submodules.items():
            modules[path] = url
            git("update-index", "--add", "--cacheinfo", f"160000,{sha},{path}", cwd=dest)
        if spec.submodules:
            text = "".join(
                f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n'
                for p, u in sorted(modules.items())
            )
            (dest / ".gitmodules").write_text(text)
            git("add", ".gitmodules", cwd=dest)
        git(
            "commit",
            "--quiet",
            "--allow-empty",
            "-m",
            spec.message,
            cwd=dest,
            env=_identity(epoch + 60 * i),
        )
        shas.append(git_out("rev-parse", "HEAD", cwd=dest))
    return shas


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every file under ``folder`` as a ``files`` mapping for :class:`CommitSpec`."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
