"""Thin wrappers over the git CLI, all through :mod:`kiln.proc`."""

from __future__ import annotations

import os
from pathlib import Path

from kiln.errors import KilnError, SourceError
from kiln.inside import proc

# Never let git prompt, read the user's global hooks or discover a parent repository.
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_ASKPASS": "true",
}


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **_GIT_ENV}
    if extra:
        env.update(extra)
    return env


def git(
    *args: str | os.PathLike[str],
    cwd: Path | None = None,
    check: bool = True,
    error: type[KilnError] = SourceError,
    what: str | None = None,
    env: dict[str, str] | None = None,
    log_file: Path | None = None,
    idle_timeout: float | None = None,
) -> proc.Result:
    """Run ``git args...``; file:// transport is allowed (mirrors are local paths)."""
    return proc.run(
        ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false", *args],
        cwd=cwd,
        env=git_env(env),
        check=check,
        error=error,
        what=what,
        log_file=log_file,
        idle_timeout=idle_timeout,
    )


def git_out(*args: str | os.PathLike[str], cwd: Path | None = None, **kw: object) -> str:
    return git(*args, cwd=cwd, **kw).output.strip()  # type: ignore[arg-type]


def commit_time(repo: Path, rev: str = "HEAD") -> int:
    """Committer time of ``rev`` (seconds since the epoch): kiln's SOURCE_DATE_EPOCH."""
    return int(git_out("show", "-s", "--format=%ct", rev, cwd=repo))
