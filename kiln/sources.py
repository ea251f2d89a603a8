"""Upstream sources: a cache of bare clones, pinned checkouts, submodules.

Flow: ``resolve`` a (possibly short) SHA to a full one in the bare cache,
fetching through the mirrors when it is missing; ``checkout`` a fresh detached
work tree at it; initialise every submodule at the commit the tree records,
from the cache; ``verify`` that HEAD and every submodule are what was asked.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kiln import proc
from kiln.config import FULL_SHA_RE, Source
from kiln.errors import SourceError
from kiln.git import commit_time, git, git_env, git_out
from kiln.mirrors import Mirrors, is_remote

log = logging.getLogger("kiln.sources")


@dataclass(frozen=True)
class SubmoduleState:
    path: str
    url: str
    commit: str


@dataclass(frozen=True)
class Checkout:
    path: Path
    url: str
    commit: str
    submodules: tuple[SubmoduleState, ...]
    commit_time: int


def _cache_name(url: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1]).removesuffix(".git")
    return f"{stem or 'repo'}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.git"


def resolve_relative(url: str, parent_url: str) -> str:
    """Resolve a ``.gitmodules`` URL such as ``../fmt.git`` against the superproject's URL."""
    if not url.startswith(("./", "../")):
        return url
    parts = urlsplit(parent_url)
    segments = parts.path.rstrip("/").split("/")
    for piece in url.split("/"):
        if piece == "..":
            segments.pop()
        elif piece not in (".", ""):
            segments.append(piece)
    return urlunsplit(parts._replace(path="/".join(segments)))


class GitCache:
    """Bare clones keyed by upstream URL (not by mirror, so a mirror swap reuses them)."""

    def __init__(self, root: Path, mirrors: Mirrors, offline: bool = False) -> None:
        self.root = root.resolve() / "git"
        self.mirrors = mirrors
        self.offline = offline

    def bare(self, url: str) -> Path:
        path = self.root / _cache_name(url)
        if not (path / "HEAD").exists():
            path.mkdir(parents=True, exist_ok=True)
            git("init", "--bare", "--quiet", path)
        return path

    def fetch(self, url: str, what: str, extra_refs: tuple[str, ...] = ()) -> None:
        source = self.mirrors.map(url)
        if self.offline and is_remote(source):
            raise SourceError(
                f"{what}: {url} is not in the cache and --offline forbids fetching it; "
                f"add a local mirror for it (--mirrors FILE) or run without --offline"
            )
        shown = url if source == url else f"{url} (mirror {source})"
        log.info("fetching %s", shown)
        refspecs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", *extra_refs]
        git(
            "fetch",
            "--quiet",
            "--prune",
            "--no-write-fetch-head",
            source,
            *refspecs,
            cwd=self.bare(url),
            what=f"{what}: fetching {shown}",
        )

    def cached(self, url: str) -> Path | None:
        path = self.root / _cache_name(url)
        return path if (path / "HEAD").exists() else None

    def _candidates(self, repo: Path, prefix: str) -> list[str]:
        res = git("rev-parse", "--disambiguate=" + prefix, cwd=repo, check=False)
        objects = [line for line in res.output.split() if FULL_SHA_RE.match(line)]
        return [o for o in objects if git_out("cat-file", "-t", o, cwd=repo) == "commit"]

    def lookup(self, url: str, sha: str, what: str) -> str | None:
        """The full SHA of the one commit starting with ``sha`` in the cache, or None."""
        repo = self.cached(url)
        found = self._candidates(repo, sha) if repo else []
        if len(found) > 1:
            raise SourceError(
                f"{what}: commit {sha} is ambiguous in {url}: it matches "
                f"{', '.join(sorted(found))}; pin more digits"
            )
        return found[0] if found else None

    def resolve(self, url: str, sha: str, what: str) -> str:
        """Full SHA for ``sha`` (short or full), fetching only when the cache lacks it."""
        full = self.lookup(url, sha, what)
        if full is None:
            extra = (f"+{sha}:refs/kiln/{sha}",) if FULL_SHA_RE.match(sha) else ()
            try:
                self.fetch(url, what, extra)
            except SourceError:
                if not extra:
                    raise
                self.fetch(url, what)  # servers that refuse fetching by SHA
            full = self.lookup(url, sha, what)
        if full is None:
            raise SourceError(
                f"{what}: commit {sha} is not in {self.mirrors.map(url)}; "
                f"check the pinned SHA (or the mirror)"
            )
        return full


def availability(cache: GitCache, url: str, sha: str, what: str, timeout: float = 20) -> str | None:
    """None when ``sha`` can be had (cached, or its source answers); else the problem."""
    try:
        if cache.lookup(url, sha, what):
            return None
    except SourceError as exc:
        return str(exc)
    source = cache.mirrors.map(url)
    if not is_remote(source):
        path = Path(source.removeprefix("file://"))
        return None if path.exists() else f"{what}: mirror {source} for {url} does not exist"
    if cache.offline:
        return (
            f"{what}: {url} is not in the cache and --offline forbids fetching it; "
            f"add a local mirror for it (--mirrors FILE)"
        )
    try:
        res = proc.run(
            ["git", "ls-remote", "--exit-code", source, "HEAD"],
            check=False,
            env=git_env(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"{what}: {source} did not answer within {timeout:.0f} s (no network?)"
    if res.returncode != 0:
        reason = (res.output.strip().splitlines() or ["no answer"])[-1]
        return f"{what}: cannot reach {source} ({reason})"
    return None


def checkout(cache: GitCache, source: Source, dest: Path, what: str) -> Checkout:
    """A fresh detached work tree of ``source`` at its pinned commit, with submodules."""
    full = cache.resolve(source.url, source.commit, what)
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    git("clone", "--quiet", "--no-checkout", cache.bare(source.url), dest, what=f"{what}: clone")
    git("checkout", "--quiet", "--detach", full, cwd=dest, what=f"{what}: checkout {full}")
    subs = tuple(_init_submodules(cache, dest, source.url, what, prefix=""))
    _check_declared(source, subs, what)
    result = Checkout(dest, source.url, full, subs, commit_time(dest))
    verify(result, what)
    return result


def gitlinks(repo: Path, rev: str = "HEAD") -> dict[str, str]:
    """Submodule path -> commit, as recorded in the tree of ``rev``."""
    out = git_out("ls-tree", "-r", "-z", rev, cwd=repo)
    links = {}
    for entry in out.split("\0"):
        if entry.startswith("160000 commit "):
            meta, path = entry.split("\t", 1)
            links[path] = meta.split()[2]
    return links


def _gitmodules(repo: Path) -> dict[str, tuple[str, str]]:
    """Submodule path -> (name, url) from the checked-out ``.gitmodules``."""
    if not (repo / ".gitmodules").exists():
        return {}
    res = git(
        "config",
        "-f",
        ".gitmodules",
        "--get-regexp",
        r"^submodule\..*\.(path|url)$",
        cwd=repo,
        check=False,
    )
    names: dict[str, dict[str, str]] = {}
    for line in res.output.splitlines():
        key, _, value = line.partition(" ")
        name, attr = key[len("submodule.") :].rsplit(".", 1)
        names.setdefault(name, {})[attr] = value
    return {v["path"]: (n, v.get("url", "")) for n, v in names.items() if "path" in v}


def _init_submodules(
    cache: GitCache, repo: Path, repo_url: str, what: str, prefix: str
) -> list[SubmoduleState]:
    links = gitlinks(repo)
    modules = _gitmodules(repo)
    states: list[SubmoduleState] = []
    for path, commit in sorted(links.items()):
        shown = f"{what}: submodule {prefix}{path}"
        if path not in modules:
            raise SourceError(f"{shown}: recorded in the tree but missing from .gitmodules")
        name, raw_url = modules[path]
        url = resolve_relative(raw_url, repo_url)
        cache.resolve(url, commit, shown)  # fetches if needed; raises when the commit is absent
        git("config", f"submodule.{name}.url", cache.bare(url), cwd=repo)
        git(
            "submodule",
            "--quiet",
            "update",
            "--init",
            "--",
            path,
            cwd=repo,
            what=f"{shown}: checkout {commit}",
        )
        states.append(SubmoduleState(prefix + path, url, commit))
        states.extend(_init_submodules(cache, repo / path, url, what, prefix=f"{prefix}{path}/"))
    return states


def _check_declared(source: Source, subs: tuple[SubmoduleState, ...], what: str) -> None:
    """The lock's submodule list, when given, must match the tree's top level exactly."""
    if not source.submodules:
        return
    top = {s.path: s.commit for s in subs if not any(s.path.startswith(o.path + "/") for o in subs)}
    declared = {d.path: d.commit for d in source.submodules}
    for path in sorted(set(declared) ^ set(top)):
        where = "lists" if path in declared else "omits"
        raise SourceError(
            f"{what}: source.submodules {where} {path}, but the tree at {source.commit} "
            f"{'does not record it' if path in declared else 'records it'}; fix the vendor TOML"
        )
    for path, commit in declared.items():
        if commit and top[path] != commit:
            raise SourceError(
                f"{what}: submodule {path} is at {top[path]} in the tree but the lock says "
                f"{commit}; run `nox -s lock` to re-record it"
            )


def verify(co: Checkout, what: str) -> None:
    """HEAD and every submodule are exactly at the recorded commits."""
    head = git_out("rev-parse", "HEAD", cwd=co.path)
    if head != co.commit:
        raise SourceError(f"{what}: HEAD is {head}, expected {co.commit}")
    for sub in co.submodules:
        got = git_out("rev-parse", "HEAD", cwd=co.path / sub.path)
        if got != sub.commit:
            raise SourceError(f"{what}: submodule {sub.path} is at {got}, expected {sub.commit}")
