"""Upstream sources: a cache of bare clones, pinned checkouts, submodules.

Flow: ``resolve`` a (possibly short) SHA to a full one in the bare cache,
fetching through the mirrors when it is missing; ``checkout`` a fresh detached
work tree at it; initialise every submodule at the commit the tree records,
from the cache; ``verify`` that HEAD and every submodule are what was asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kiln import fsutil
from kiln.config.fields import FULL_SHA_RE, url_problem
from kiln.config.mirrors import Mirrors, is_remote
from kiln.config.models import Source
from kiln.errors import FetchFailed, SourceError
from kiln.inside import proc
from kiln.inside.kit import contract
from kiln.sources import bundles
from kiln.sources.git import commit_time, git, git_env, git_out

log = logging.getLogger(__name__)

# A fetch that receives nothing for this long has stalled (a server that accepted the
# connection and went silent): it is stopped and reported. Progress lines keep coming
# while data flows, however slowly.
STALL_ENV = contract.FETCH_STALL_S
DEFAULT_STALL_S = 120.0


def stall_seconds() -> float:
    try:
        return max(float(os.environ.get(STALL_ENV, DEFAULT_STALL_S)), 1.0)
    except ValueError:
        return DEFAULT_STALL_S


def local_path(source: str) -> Path | None:
    """The folder a local mirror names (``/srv/x.git``, ``file:///srv/x.git``), or None."""
    return None if is_remote(source) else Path(source.removeprefix("file://"))


def is_shallow(repo: Path) -> bool:
    return (repo / "shallow").is_file() or (repo / ".git" / "shallow").is_file()


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


# git's answers when a server will not hand out a commit by SHA (then kiln fetches the
# branches and tags instead); any other fetch failure (a dropped connection) is final.
_SHA_REFUSED = re.compile(
    r"not our ref|unadvertised object|couldn't find remote ref|no such remote ref|"
    r"Server does not allow request",
    re.IGNORECASE,
)


def git_reason(output: str) -> str:
    """git's first ``fatal:``/``error:`` line, without the prefix (else its last line)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for line in lines:
        for prefix in ("fatal: ", "error: ", "error in "):
            if line.startswith(prefix):
                return line.removeprefix(prefix)
    return lines[-1] if lines else "no output"


def check_url(url: str, what: str) -> None:
    """Refuse URLs git would read as an option or as a command (they come from TOML
    files, mirrors files and upstreams' ``.gitmodules``: data, never code)."""
    bad = url_problem(url)
    if bad:
        raise SourceError(f"{what}: URL {url!r} {bad}; refusing it (fix the URL)")


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
    """Bare clones keyed by upstream URL (not by mirror, so a mirror swap reuses them).

    Builds from other checkouts may share the cache at once: every fetch into a clone
    (and the removal of a damaged one) holds that clone's lock (``fsutil.making``), and
    :meth:`resolve` asks again once it holds it, so two builds that need the same commit
    fetch it once. Reading a clone while another kiln fetches into it is safe: git moves
    refs only once the objects are in, and kiln trusts only commits a ref reaches."""

    def __init__(self, root: Path, mirrors: Mirrors, offline: bool = False) -> None:
        self.root = root.resolve() / "git"
        self.mirrors = mirrors
        self.offline = offline
        # The bare clones the calling thread's checkout read (checked on a failure): one
        # set per thread, since vendors check out at once and the prefetch runs beside
        # them (one shared set was rebound by one checkout while another iterated it).
        self._used = threading.local()

    @property
    def used(self) -> set[Path]:
        """The bare clones this thread's checkout read since it began."""
        found: set[Path] | None = getattr(self._used, "paths", None)
        if found is None:
            found = self._used.paths = set()
        return found

    def start_reading(self) -> None:
        """A checkout begins on this thread: what it reads is counted afresh."""
        self._used.paths = set()

    def clone_path(self, url: str) -> Path:
        """Where ``url``'s bare clone is (made or not)."""
        return self.root / _cache_name(url)

    def bare(self, url: str) -> Path:
        """The bare clone for ``url``, created empty if absent. It is made in a temporary
        folder and renamed into place, so a killed run never leaves a half-made one."""
        path = self.root / _cache_name(url)
        self.used.add(path)
        if not (path / "HEAD").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():  # not a repository (no HEAD): a leftover, never trusted
                shutil.rmtree(path)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=self.root))
            try:
                git("init", "--bare", "--quiet", tmp)
                os.rename(tmp, path)
            except OSError:
                if not (path / "HEAD").exists():  # another run made it first: fine
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return path

    def _locked(self, url: str) -> contextlib.AbstractContextManager[None]:
        """The lock of ``url``'s bare clone: fetches into one clone run one at a time."""
        return fsutil.making(self.root / _cache_name(url), f"the git clone of {url}")

    def fetch(self, url: str, what: str, extra_refs: tuple[str, ...] = ()) -> None:
        """Fetch every branch and tag of ``url`` (through its mirror) into its bare clone,
        holding the clone's lock.

        git moves refs only after the whole pack arrived and was indexed, so a fetch cut
        off mid-transfer leaves the clone as it was: a rerun fetches again."""
        with self._locked(url):
            self._fetch(url, what, extra_refs)

    def _fetch(
        self, url: str, what: str, extra_refs: tuple[str, ...] = (), every_ref: bool = True
    ) -> None:
        """The fetch itself: every branch and tag and ``extra_refs``, or (``every_ref``
        false) ``extra_refs`` alone."""
        source = self.mirrors.map(url)
        check_url(url, what)
        check_url(source, what)
        if self.offline and is_remote(source):
            raise SourceError(offline_refusal(url, source, what))
        shown = url if source == url else f"{url} (mirror {source})"
        local = local_path(source)
        if local is not None and not (local / "HEAD").exists() and not (local / ".git").exists():
            state = "is not a git repository" if local.exists() else "does not exist"
            raise SourceError(
                f"{what}: {url}: no repository there ({state}): fix the URL"
                if source == url
                else f"{what}: mirror {source} for {url} {state}: fix the mirrors file "
                f"(or make the mirror there)"
            )
        log.info("fetching %s", shown)
        every = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"] if every_ref else []
        refspecs = [*every, *extra_refs]
        stall = stall_seconds()
        try:
            res = git(
                # A server that sends below 1 KiB/s for the stall time is given up on.
                *("-c", "http.lowSpeedLimit=1024", "-c", f"http.lowSpeedTime={int(stall)}"),
                "fetch",
                "--progress",  # progress lines: what tells a slow fetch from a stalled one
                "--prune",
                "--no-write-fetch-head",
                # A shallow mirror (CI checkouts are shallow by default): take its
                # commits as they are; without this git drops its refs with exit code 0.
                "--update-shallow",
                "--",
                source,
                *refspecs,
                cwd=self.bare(url),
                check=False,
                idle_timeout=stall,
            )
        except SourceError as exc:  # stalled
            raise FetchFailed(
                f"{what}: fetching {shown} stalled: no data for {stall:g} s; the cache keeps "
                f"only what completed before: rerun once the source answers (or raise "
                f"{STALL_ENV})",
                refused_sha=False,
            ) from exc
        if local is not None and is_shallow(local):
            log.warning(
                "%s: mirror %s is shallow (only its newest commits): builds that count "
                "history (setuptools-scm, git describe) may differ; unshallow it with "
                "`git fetch --unshallow` to be safe",
                what,
                source,
            )
        if res.returncode != 0:
            reason = git_reason(res.output)
            broken = missing_refs(local, res.output) if local is not None else []
            fix = "rerun once the source answers (or fix the URL/mirror)"
            if broken:  # rerunning never helps: say what is corrupt, and where
                one = len(broken) == 1
                reason += (
                    f": the mirror's {', '.join(broken)} {'points' if one else 'point'} at "
                    f"an object it does not hold (an incomplete or damaged mirror)"
                )
                fix = f"repair or delete {'that ref' if one else 'those refs'} in {source}"
            raise FetchFailed(
                f"{what}: fetching {shown} failed: {reason}; the cache keeps only what "
                f"completed before: {fix}",
                refused_sha=bool(extra_refs) and bool(_SHA_REFUSED.search(res.output)),
            )

    def _fetch_pinned(self, url: str, sha: str, what: str) -> None:
        """Fetch what holds ``sha``: every branch and tag and the commit itself (tags
        count for builds that read them: setuptools-scm, git describe). Where that
        fails, the commit alone, where the server hands out commits by SHA: a mirror
        whose other refs lack objects still serves a complete pinned commit (said, with
        what the other refs lack); where it refuses, every branch and tag alone."""
        if not FULL_SHA_RE.match(sha):
            self._fetch(url, what)
            return
        extra = (f"+{sha}:refs/kiln/{sha}",)
        try:
            self._fetch(url, what, extra)
            return
        except FetchFailed as every:
            first = every
        try:
            self._fetch(url, what, extra, every_ref=False)
        except FetchFailed as alone:
            if not alone.refused_sha:
                raise first from None
            self._fetch(url, what)  # servers that refuse fetching by SHA
            return
        log.warning(
            "%s: %s; fetched the pinned commit %s alone (the cache has none of that "
            "source's other branches and tags)",
            what,
            str(first).removeprefix(f"{what}: "),
            sha[:12],
        )

    def damage(self, path: Path) -> str | None:
        """None when the bare clone at ``path`` passes ``git fsck``; else its first error."""
        # Only damage counts: an upstream's odd .gitmodules is judged where it is used.
        lenient = [f"fsck.gitmodules{k}=ignore" for k in ("Url", "Path", "Name")]
        opts = [a for kv in lenient for a in ("-c", kv)]
        res = git(*opts, "fsck", "--no-dangling", "--no-progress", cwd=path, check=False)
        return None if res.returncode == 0 else git_reason(res.output)

    def discard(self, path: Path) -> None:
        """Remove a damaged bare clone (renamed aside first, so none is half-removed)."""
        aside = path.with_name(f".{path.name}-damaged-{os.getpid()}")
        with fsutil.making(path, f"the git clone {path.name}"):
            if path.exists():  # another kiln may have discarded it first
                os.rename(path, aside)
        shutil.rmtree(aside, ignore_errors=True)
        self.used.discard(path)

    def cached(self, url: str) -> Path | None:
        path = self.root / _cache_name(url)
        if not (path / "HEAD").exists():
            return None
        self.used.add(path)
        return path

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
        return found[0] if found and repo and _reachable(repo, found[0]) else None

    def resolve(self, url: str, sha: str, what: str) -> str:
        """Full SHA for ``sha`` (short or full), fetching only when the cache lacks it."""
        full = self.lookup(url, sha, what)
        if full is None:
            with self._locked(url):
                full = self.lookup(url, sha, what)  # another kiln may have fetched it
                if full is None:
                    self._fetch_pinned(url, sha, what)
                    full = self.lookup(url, sha, what)
        if full is None:
            local = local_path(self.mirrors.map(url))
            shallow = (
                " (a shallow mirror: it holds only its newest commits)"
                if (local is not None and is_shallow(local))
                else ""
            )
            raise SourceError(
                f"{what}: commit {sha} is not in {self.mirrors.map(url)}{shallow}; "
                f"check the pinned SHA (or the mirror)"
            )
        return full


def missing_refs(mirror: Path, output: str) -> list[str]:
    """The refs of a local ``mirror`` pointing at an object it does not hold, where git's
    ``output`` names such an object (``not our ref``, ``bad object``, ``missing``)."""
    named = set(re.findall(r"\b[0-9a-f]{40}\b", output))
    if not named or (not (mirror / "HEAD").exists() and not (mirror / ".git").exists()):
        return []
    listed = git("for-each-ref", "--format=%(objectname) %(refname)", cwd=mirror, check=False)
    found = []
    for line in listed.output.splitlines():
        sha, _, ref = line.partition(" ")
        if sha in named and git("cat-file", "-e", sha, cwd=mirror, check=False).returncode:
            found.append(ref)
    return found


def _reachable(repo: Path, commit: str) -> bool:
    """Whether a ref of ``repo`` reaches ``commit``. git moves refs only after a fetch
    completed, so only those commits are whole: a fetch cut off mid-transfer can leave
    the commit and some trees as loose objects without their blobs, and git checks
    such a commit out with exit code 0, files missing."""
    res = git("rev-list", "-n", "1", commit, "--not", "--all", cwd=repo, check=False)
    return res.returncode == 0 and not res.output.strip()


@dataclass(frozen=True)
class Unavailable:
    """Why a pinned commit cannot be had: ``reachable`` where its source answers but does
    not hold it (a wrong SHA, an incomplete mirror: a source error, nothing about this
    machine), else the source itself cannot be reached from here."""

    problem: str
    reachable: bool = False

    def __str__(self) -> str:
        return self.problem


def availability(
    cache: GitCache, url: str, sha: str, what: str, timeout: float = 20
) -> Unavailable | None:
    """None when ``sha`` can be had (cached, or its source answers); else the problem."""
    found = _availability(cache, url, sha, what, timeout)
    if found is None or isinstance(found, Unavailable):
        return found
    return Unavailable(found)


def _availability(
    cache: GitCache, url: str, sha: str, what: str, timeout: float
) -> str | Unavailable | None:
    try:
        if cache.lookup(url, sha, what):
            return None
    except SourceError as exc:
        return str(exc)
    source = cache.mirrors.map(url)
    try:
        check_url(url, what)
        check_url(source, what)
    except SourceError as exc:
        return str(exc)
    if not is_remote(source):
        path = Path(source.removeprefix("file://"))
        if not path.exists():
            return f"{what}: mirror {source} for {url} does not exist: fix the mirrors file"
        if bundles.is_bundle(path):  # a dry run's --bundles: read, not unbundled
            # A head is there; any other commit can only be looked for once unbundled
            # (the dry run says so), as the build does: never a problem here.
            return None
        return _commit_problem(path, sha, source, what)
    if cache.offline:
        return offline_refusal(url, source, what)
    try:
        res = proc.run(
            ["git", "ls-remote", "--exit-code", "--", source, "HEAD"],
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


def _commit_problem(mirror: Path, sha: str, source: str, what: str) -> str | Unavailable | None:
    """Preflight for a local mirror: is the pinned commit there (seconds, before any
    fetch or compile)? None when it is, or when the folder cannot be asked."""
    res = git("rev-parse", "--disambiguate=" + sha, cwd=mirror, check=False)
    if res.returncode != 0 and "not a git repository" in res.output:
        return f"{what}: mirror {source} is not a git repository: fix the mirrors file"
    found = [c for c in res.output.split() if FULL_SHA_RE.match(c)]
    commits = [c for c in found if git_out("cat-file", "-t", c, cwd=mirror) == "commit"]
    if commits:
        return None
    shallow = " (a shallow mirror: it holds only its newest commits)" if is_shallow(mirror) else ""
    return Unavailable(
        f"{what}: commit {sha} is not in mirror {source}{shallow}; check the pinned SHA "
        f"(vendors/{what}.toml source.commit) or update the mirror",
        reachable=True,
    )


def offline_refusal(url: str, source: str, what: str) -> str:
    """Why --offline cannot have ``url``: no mirror maps it, or the one that does is a
    network URL (which --offline forbids as much as the upstream's)."""
    if source != url:
        return (
            f"{what}: the mirror configured for {url} is a network URL ({source}), which "
            f"--offline forbids fetching from; map it to a local mirror (a folder) or drop "
            f"--offline"
        )
    return (
        f"{what}: {url} is not in the cache and --offline forbids fetching it; "
        f"add a local mirror for it (--mirrors FILE)"
    )


def checkout(cache: GitCache, source: Source, dest: Path, what: str) -> Checkout:
    """A fresh detached work tree of ``source`` at its pinned commit, with submodules.

    When that fails, every bare clone it read is checked with ``git fsck``: damaged
    ones (a truncated object, a corrupt pack) are removed and fetched again from the
    mirror or upstream, once; a cache that fails its check is never used as is."""
    cache.start_reading()
    try:
        return _checkout(cache, source, dest, what)
    except SourceError as exc:
        damaged = {p: d for p in sorted(cache.used) if p.exists() and (d := cache.damage(p))}
        if not damaged:
            raise
        for path, problem in damaged.items():
            log.warning(
                "%s: the cached clone %s is damaged (%s); fetching it again", what, path, problem
            )
            cache.discard(path)
        first = next(iter(damaged.items()))
        try:
            return _checkout(cache, source, dest, what)
        except SourceError as again:
            raise SourceError(
                f"{what}: the cached clone {first[0]} was damaged ({first[1]}) and fetching it "
                f"again failed: {str(again).splitlines()[0]}"
            ) from exc


def _checkout(cache: GitCache, source: Source, dest: Path, what: str) -> Checkout:
    full = cache.resolve(source.url, source.commit, what)
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(
        "clone",
        "--quiet",
        "--no-checkout",
        "--",
        cache.bare(source.url),
        dest,
        what=f"{what}: clone",
    )
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


def _gitmodules(repo: Path, commit: str | None = None) -> dict[str, tuple[str, str]]:
    """Submodule path -> (name, url) from the checked-out ``.gitmodules``, or from the
    one at ``commit`` of a bare repository."""
    if commit is None and not (repo / ".gitmodules").exists():
        return {}
    where = ["--blob", f"{commit}:.gitmodules"] if commit else ["-f", ".gitmodules"]
    res = git(
        "config",
        *where,
        "--null",
        "--get-regexp",
        r"^submodule\..*\.(path|url)$",
        cwd=repo,
        check=False,
    )
    names: dict[str, dict[str, str]] = {}
    for entry in res.output.split("\0") if res.returncode == 0 else []:
        key, _, value = entry.strip("\n").partition("\n")  # --null: "key\nvalue\0"
        name, dot, attr = key.removeprefix("submodule.").rpartition(".")
        if dot and attr in ("path", "url"):
            names.setdefault(name, {})[attr] = value
    return {v["path"]: (n, v.get("url", "")) for n, v in names.items() if "path" in v}


def submodule_pins(repo: Path, commit: str, repo_url: str) -> list[tuple[str, str, str]]:
    """(path, url, commit) of the first-level submodules recorded at ``commit`` of the bare
    ``repo``, read without a checkout (``kiln build --dry-run``: what a build would fetch)."""
    links = gitlinks(repo, commit)
    modules = _gitmodules(repo, commit) if links else {}
    return [
        (path, resolve_relative(modules[path][1], repo_url), sha)
        for path, sha in sorted(links.items())
        if path in modules
    ]


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
                f"{commit}; run `kiln lock` to re-record it"
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
    # git checks out a tree whose objects it cannot read with exit code 0: compare.
    for prefix in ["", *(f"{s.path}/" for s in co.submodules)]:
        changed = git_out(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--ignore-submodules=all",
            cwd=co.path / prefix,
        )
        if changed:
            raise SourceError(
                f"{what}: the checkout does not match its commit ({prefix}"
                f"{changed.splitlines()[0].strip()}): an object is missing or damaged"
            )
