"""``URL[@REV]`` to one full commit SHA, through kiln's git cache and mirrors.

REV may be a branch, a tag, a (short) commit SHA, or absent (the upstream's default
branch, as its source says ``HEAD`` points). A SHA the cache already holds is used
without fetching; anything else fetches the upstream's branches and tags first, since
branches move.
"""

from __future__ import annotations

import re
from pathlib import Path

from kiln.config.fields import FULL_SHA_RE
from kiln.config.mirrors import is_remote
from kiln.errors import FetchFailed, SourceError
from kiln.sources.checkout import GitCache, check_url, git_reason
from kiln.sources.git import git

_HEX = re.compile(r"^[0-9a-fA-F]{4,40}$")
# What stands before the @ of a user name: a scheme with no host yet, or a bare word.
_USER_ONLY = re.compile(r"^([a-z][a-z0-9+.-]*://[^/]*|[^/:]*)$")


def split(spec: str) -> tuple[str, str | None]:
    """``URL@REV`` -> (URL, REV). The ``@`` of a user name (``git@host:org/x``,
    ``https://user@host/x``) is not a REV; a branch may hold ``/`` (``URL@feature/x``).
    ``URL@`` is refused: an empty REV is a typo, not HEAD."""
    head, at, rev = spec.rpartition("@")
    if not at or _USER_ONLY.match(head):
        return spec, None
    if not rev:
        raise SourceError(f"{spec}: empty REV after '@'; write URL@BRANCH, URL@TAG or URL@SHA")
    return head, rev


def resolve(cache: GitCache, url: str, rev: str | None, what: str) -> tuple[str, str]:
    """(full SHA, how REV was read: "branch main", "tag v1.2", "commit", "HEAD -> main")."""
    check_url(url, what)
    if rev is not None and _HEX.match(rev):
        full = cache.lookup(url, rev, what)
        if full is not None:
            return full, "commit"
    _fetch(cache, url, what)
    repo = cache.bare(url)
    if rev is None or rev == "HEAD":
        branch = _default_branch(cache, url, what)
        return _commit(repo, f"refs/heads/{branch}"), f"HEAD -> {branch}"
    for kind, ref in (("branch", f"refs/heads/{rev}"), ("tag", f"refs/tags/{rev}")):
        sha = _commit(repo, ref, missing_ok=True)
        if sha:
            return sha, f"{kind} {rev}"
    if _HEX.match(rev):
        try:  # a commit no branch or tag reaches: fetched by its SHA where servers allow
            return cache.resolve(url, rev, what), "commit"
        except FetchFailed:
            raise
        except SourceError as exc:
            if "ambiguous" in str(exc):
                raise
    source = cache.mirrors.map(url)
    where = url if source == url else f"{url} (mirror {source})"
    raise SourceError(
        f"{what}: {rev!r} is not a branch, tag or commit of {where}; check the REV "
        f"(`git ls-remote {source}` lists the branches and tags)"
    )


def _fetch(cache: GitCache, url: str, what: str) -> None:
    """Fetch the upstream; offline with a clone already cached, use what the cache holds."""
    try:
        cache.fetch(url, what)
    except SourceError:
        if not (cache.offline and cache.cached(url)):
            raise


def _commit(repo: Path, ref: str, missing_ok: bool = False) -> str:
    res = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo, check=False)
    sha = res.output.strip()
    if res.returncode == 0 and FULL_SHA_RE.match(sha):
        return sha
    if missing_ok:
        return ""
    raise SourceError(f"{ref} is not in the fetched upstream ({git_reason(res.output)})")


def _default_branch(cache: GitCache, url: str, what: str) -> str:
    """The branch the upstream's (or its mirror's) HEAD names."""
    source = cache.mirrors.map(url)
    if cache.offline and is_remote(source):
        raise SourceError(
            f"{what}: --offline cannot ask {source} for its default branch; "
            f"name the revision (URL@BRANCH, URL@TAG or URL@SHA)"
        )
    res = git("ls-remote", "--symref", "--", source, "HEAD", check=False)
    m = re.search(r"^ref: refs/heads/(\S+)\s+HEAD$", res.output, re.MULTILINE)
    if res.returncode != 0 or not m:
        raise SourceError(
            f"{what}: {source} names no default branch (HEAD); "
            f"name the revision (URL@BRANCH, URL@TAG or URL@SHA)"
        )
    return m.group(1)
