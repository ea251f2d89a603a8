"""``kiln build --dry-run``: what a build would do, without doing it.

It runs the stages that only look (the workspace, the budget, the runner and preflight)
and, per vendor, asks the caches instead of building: whether the git cache holds the
pinned commits (else what would be fetched, and from where), whether the artifact cache
holds the vendor's key (a hit: nothing to compile; a miss: what changed since the
vendor's newest entry), and the schedule it would get (MAX_JOBS, nvcc threads, the
memory per compile and where that figure comes from). Nothing is written to
``artifacts/`` or the work folder; preflight may still provision the toolchain a real
build would (the PyPI CUDA, the builder image), as it would before any compile.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

from kiln.build import learned
from kiln.build.options import Options
from kiln.build.preflight import preflight
from kiln.build.runner import make_runner
from kiln.build.vendor import key_of
from kiln.config.mirrors import Mirrors
from kiln.config.models import Vendor
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, PreflightError
from kiln.plan import cachekey, schedule
from kiln.release.artifactcache import ArtifactCache
from kiln.sources import checkout as sources


def plan(opts: Options) -> dict[str, Any]:
    """The plan as data (``--json`` prints it as is)."""
    opts = opts.resolved()
    ws = Workspace(opts.workspace, opts.profile)
    selected = ws.select(list(opts.vendors) if opts.vendors else None)
    budget = schedule.make_budget(opts.mem_budget_gib, opts.jobs)
    peaks = learned.open_store(opts.cache, ws.root, opts.learned_from, selected)
    git = sources.GitCache(opts.cache, Mirrors.load(opts.mirrors), opts.offline)
    problems: list[str] = []
    with contextlib.suppress(ConfigError):
        schedule.check_fits(selected, peaks, budget)
    with tempfile.TemporaryDirectory(prefix="kiln-dry-run-") as logs:
        try:
            runner = make_runner(ws, opts, Path(logs))
            problem = None
        except ConfigError as exc:
            if opts.runner != "auto":
                raise
            runner, problem = None, str(exc)
        try:
            tc, _warnings = preflight(ws, selected, runner, git, problem)
            toolchain = tc.to_json()
        except PreflightError as exc:
            problems += exc.problems
            toolchain = None
    runner_data = (
        {"kind": runner.kind, "image": runner.image, "builder": runner.builder} if runner else {}
    )
    acache = ArtifactCache(opts.artifact_cache_root) if opts.artifact_cache_root else None
    return {
        "release": ws.release.name,
        "profile": opts.profile or "default",
        "archs": list(ws.profile.archs),
        "runner": runner_data,
        "budget": budget.to_json(),
        "problems": problems,
        "vendors": [
            {
                "name": v.name,
                **_sources(git, v),
                **_cache(git, ws, toolchain, runner_data, acache, v),
                **_schedule(v, opts.work / ws.release.name / v.name, peaks, budget),
            }
            for v in selected
        ],
    }


def _sources(git: sources.GitCache, vendor: Vendor) -> dict[str, Any]:
    """The pinned commit as the git cache knows it, and what a build would fetch."""
    src = vendor.source
    fetch: list[str] = []
    commit = git.lookup(src.url, src.commit, vendor.name)
    if commit is None:
        fetch.append(f"{src.url} at {src.commit}{_via(git, src.url)}, then its submodules")
    else:
        repo = git.cached(src.url)
        assert repo is not None
        for path, url, sha in sources.submodule_pins(repo, commit, src.url):
            if git.lookup(url, sha, f"{vendor.name}: submodule {path}") is None:
                fetch.append(f"submodule {path}: {url} at {sha[:12]}{_via(git, url)}")
    return {"requested": src.commit, "commit": commit, "fetch": fetch}


def _via(git: sources.GitCache, url: str) -> str:
    mapped = git.mirrors.map(url)
    return f" (from mirror {mapped})" if mapped != url else ""


def _cache(
    git: sources.GitCache,
    ws: Workspace,
    toolchain: dict[str, Any] | None,
    runner: dict[str, Any],
    acache: ArtifactCache | None,
    vendor: Vendor,
) -> dict[str, Any]:
    """Hit or miss in the artifact cache, and why."""
    if acache is None:
        return {"cache": "off", "key": None, "why": "--no-artifact-cache"}
    if toolchain is None:
        return {"cache": "unknown", "key": None, "why": "preflight failed (see problems)"}
    if git.lookup(vendor.source.url, vendor.source.commit, vendor.name) is None:
        return {"cache": "unknown", "key": None, "why": "the commit is not fetched yet"}
    key, material = key_of(git, ws, toolchain, runner, vendor)
    if (acache.root / key / "entry.json").is_file():
        return {"cache": "hit", "key": key, "why": "inputs unchanged: outputs reused"}
    last = acache.latest_material(vendor.name)
    if last is None:
        why = "never built with this artifact cache"
    else:
        diff = cachekey.changed(last[1], material)
        why = f"changed since entry {last[0][:12]}: {', '.join(diff) or 'nothing named'}"
    return {"cache": "miss", "key": key, "why": why}


def _schedule(
    vendor: Vendor, tree: Path, peaks: schedule.PeakStore, budget: schedule.Budget
) -> dict[str, Any]:
    learned = bool(peaks.units(vendor))
    choice = schedule.choose(vendor, tree, peaks, budget)
    counted = "learned" if learned else ("work tree" if tree.is_dir() else "unknown")
    return {"schedule": {**choice.to_json(), "units_from": counted}}


def render(p: dict[str, Any]) -> str:
    """The plan for people."""
    b = p["budget"]
    r = p["runner"]
    lines = [
        f"dry run of {p['release']} (profile {p['profile']}: {', '.join(p['archs'])})",
        f"runner: {r.get('kind', 'none')}" + (f", image {r['image']}" if r.get("image") else ""),
        f"budget: {b['mem_gib']:g} GiB ({b['source']}), {b['cpus']} CPU slots ({b['cpus_from']})",
    ]
    for v in p["vendors"]:
        s = v["schedule"]
        commit = (v["commit"] or v["requested"])[:12]
        threads = f", nvcc threads {s['nvcc_threads']}" if s["nvcc_threads"] else ""
        units = s["translation_units"] if s["units_from"] != "unknown" else "?"
        lines += [
            f"{v['name']} @ {commit}: artifact cache {v['cache']}: {v['why']}",
            f"  MAX_JOBS {s['max_jobs']}{threads}; {units} units ({s['units_from']}); "
            f"{s['mem_per_job_gib']:g} GiB per compile ({s['estimate_source']}), "
            f"gate reserves {s['gate_mem_gib']:g} GiB",
        ]
        lines += [f"  would fetch {f}" for f in v["fetch"]] or ["  nothing to fetch"]
    if p["problems"]:
        lines.append(f"preflight: {len(p['problems'])} problem(s), the build would stop:")
        lines += [f"  - {x}" for x in p["problems"]]
    else:
        lines.append("preflight: passed")
    return "\n".join(lines)


def as_json(p: dict[str, Any]) -> str:
    return json.dumps(p, indent=2, sort_keys=True)
