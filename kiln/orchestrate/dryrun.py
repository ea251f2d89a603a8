"""``kiln build --dry-run``: what a build would do, without doing it, and every refusal it
would make, in its own words and with its exit code.

Dry means nothing is provisioned, fetched, cloned or written: not the cache, not the work
folder, not ``artifacts/``, not the bundles' mirrors. Each stage of the build
(:mod:`kiln.orchestrate.stages`) says what it would do: load and plan are the
build's own (``pipeline.load``, ``pipeline.plan``, ``pipeline.check_plan``), prepare runs
preflight's checks with a runner made for a dry run, and the vendors ask the caches instead
of building: whether the git cache holds the pinned commits (else what would be fetched, from
where, into which bare clone), whether the artifact cache holds the vendor's key, and the
schedule it would get. What a build provisions first (the build venv, the pip CUDA, the
builder image) is listed with its place and about its size; the checks that can only run
once it is there (the build Python's torch, headers NVIDIA's pip wheels may provide) are
named as unchecked, never as passed. ``--bundles`` are read where they are (their heads),
not unbundled.

:func:`exit_code` is the code the build would exit with: the first refusal's, in the order
of the build's stages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from kiln.config.mirrors import Mirrors
from kiln.config.models import Vendor
from kiln.config.workspace import Workspace
from kiln.errors import KilnError
from kiln.inside.kit.compileflags import SOURCE_SUFFIXES
from kiln.orchestrate import pipeline, preflight, runlock
from kiln.orchestrate.options import Options
from kiln.orchestrate.runner import runner_or_problem
from kiln.orchestrate.vendor import describe_runner, key_of
from kiln.plan import cachekey, schedule
from kiln.release.artifactcache import ArtifactCache
from kiln.runners.protocol import Runner
from kiln.sources import bundles, checkout, origins
from kiln.sources.git import git as git_cmd
from kiln.toolchain import provision as prov
from kiln.toolchain.provision import Provision


@dataclass(frozen=True)
class Refusal:
    """A refusal as the build reports it (``kiln: error: MESSAGE``, exit code)."""

    stage: str
    error: str
    exit_code: int
    message: str
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "problems": list(self.problems)}


def _refusal(stage: str, exc: KilnError) -> Refusal:
    problems = getattr(exc, "problems", [])
    return Refusal(stage, type(exc).__name__, exc.exit_code, str(exc), tuple(problems))


@dataclass(frozen=True)
class CacheAnswer:
    """Hit or miss in the artifact cache, and why (``unknown``: not answerable dry)."""

    cache: Literal["hit", "miss", "unknown", "off"]
    key: str | None
    why: str


@dataclass(frozen=True)
class Fetches:
    """The pinned commit as the git cache knows it, and what a build would fetch."""

    requested: str
    commit: str | None
    fetch: tuple[str, ...]


@dataclass(frozen=True)
class VendorPlan:
    name: str
    sources: Fetches
    cache: CacheAnswer
    schedule: schedule.Choice  # what the build's own schedule.choose would pick
    units_from: str  # "learned", "work tree", "the pinned commit" or "unknown"

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            **asdict(self.sources),
            "fetch": list(self.sources.fetch),
            **asdict(self.cache),
            "schedule": {**self.schedule.to_json(), "units_from": self.units_from},
        }


@dataclass(frozen=True)
class DryRun:
    """What a build would do and every refusal it would make (``--json``: ``to_json``)."""

    release: str
    profile: str
    archs: tuple[str, ...]
    runner: dict[str, object]  # kind, image, builder (empty: no runner could be made)
    budget: schedule.Budget
    provision: tuple[Provision, ...]  # what the build would make first
    reused: tuple[Provision, ...]  # what it would find made
    unchecked: tuple[str, ...]
    problems: tuple[str, ...]
    refusals: tuple[Refusal, ...]
    vendors: tuple[VendorPlan, ...]

    @property
    def exit_code(self) -> int:
        """The code the build would exit with: its first refusal's, else 0."""
        return self.refusals[0].exit_code if self.refusals else 0

    def to_json(self) -> dict[str, object]:
        return {
            "release": self.release,
            "profile": self.profile,
            "archs": list(self.archs),
            "runner": self.runner,
            "budget": self.budget.to_json(),
            "provision": [p.to_json() for p in self.provision],
            "reused": [p.to_json() for p in self.reused],
            "unchecked": list(self.unchecked),
            "problems": list(self.problems),
            "refusals": [r.to_json() for r in self.refusals],
            "exit_code": self.exit_code,
            "vendors": [v.to_json() for v in self.vendors],
        }


@dataclass(frozen=True)
class Said:
    """What a dry run has said so far, stage by stage (kiln/orchestrate/stages.py walks
    the build's stages; each one's ``says`` returns a new value)."""

    opts: Options
    loaded: pipeline.Loaded | None = None
    head: pipeline.Header | None = None
    refusals: tuple[Refusal, ...] = ()
    git: checkout.GitCache | None = None
    bundle_files: Mapping[str, Path] = field(default_factory=dict)
    runner: Runner | None = None
    report: preflight.Report = field(default_factory=preflight.Report)
    vendors: tuple[VendorPlan, ...] = ()

    def refused(self, *more: Refusal) -> Said:
        return replace(self, refusals=(*self.refusals, *more))


def says_load(said: Said) -> Said:
    """The build's own load: an unreadable workspace raises here as in the build."""
    return replace(said, loaded=pipeline.load(said.opts))


def says_plan(said: Said) -> Said:
    """The build's own plan; a step that cannot fit is the budget's refusal."""
    assert said.loaded is not None
    head = pipeline.plan(said.loaded)
    said = replace(said, head=head)
    try:
        pipeline.check_plan(head)
    except KilnError as exc:
        return said.refused(_refusal("budget", exc))
    return said


def says_lock(said: Said) -> Said:
    """Another build holding the artifacts folder now (without --wait)."""
    return said if said.opts.wait else said.refused(*_busy("lock", said.opts.artifacts))


def says_inputs(said: Said) -> Said:
    """The git cache as the build reaches it (bundles read in place, never unbundled)."""
    assert said.loaded is not None
    refusals: list[Refusal] = []
    git, bundle_files = _git_cache(said.opts, said.loaded.ws, refusals)
    return replace(said, git=git, bundle_files=bundle_files).refused(*refusals)


def says_prepare(said: Said) -> Said:
    """The runner (made for a dry run) and preflight's checks."""
    assert said.loaded is not None and said.git is not None
    refusals: list[Refusal] = []
    loaded = said.loaded
    runner, report = _preflight(said.opts, loaded.ws, list(loaded.selected), said.git, refusals)
    return replace(said, runner=runner, report=report).refused(*refusals)


def says_stage(said: Said) -> Said:
    """Another build holding the work folder now (without --wait)."""
    return said if said.opts.wait else said.refused(*_busy("stage", said.opts.work))


def says_vendors(said: Said) -> Said:
    """Each vendor: what it would fetch, the artifact cache's answer, its schedule."""
    assert said.head is not None and said.git is not None
    opts, head, git, report = said.opts, said.head, said.git, said.report
    ws = head.ws
    runner_data = describe_runner(said.runner).data() if said.runner else {}
    toolchain = report.tc.to_json() if report.tc else None
    acache = ArtifactCache(opts.artifact_cache_root) if opts.artifact_cache_root else None
    files = dict(said.bundle_files)
    plans = tuple(
        VendorPlan(
            v.name,
            _sources(git, v, files),
            _cache(git, ws, toolchain, runner_data, acache, v, report),
            *_schedule(v, opts.work / ws.release.name / v.name, head.peaks, head.budget, git),
        )
        for v in head.selected
    )
    return replace(said, vendors=plans)


def says_nothing(said: Said) -> Said:
    """A stage a dry run never reaches the work of (the release, its swap)."""
    return said


def dry_run_of(said: Said) -> DryRun:
    """The plan, from what every stage said."""
    assert said.head is not None
    opts, head, report = said.opts, said.head, said.report
    ws = head.ws
    made = [*_bundle_mirrors(opts, dict(said.bundle_files)), *report.provision]
    return DryRun(
        release=ws.release.name,
        profile=opts.profile or "default",
        archs=tuple(ws.profile.archs),
        runner=describe_runner(said.runner).data() if said.runner else {},
        budget=head.budget,
        provision=tuple(p for p in made if not p.made),
        reused=tuple(p for p in made if p.made),
        unchecked=tuple(report.unchecked),
        problems=tuple(report.problems),
        refusals=said.refusals,
        vendors=said.vendors,
    )


def exit_code(p: DryRun) -> int:
    """The code the build would exit with: its first refusal's, else 0."""
    return p.exit_code


def _busy(stage: str, folder: Path) -> list[Refusal]:
    """The build's refusal when another build holds ``folder`` now (without --wait)."""
    holder = runlock.holder_now(folder)
    return [_refusal(stage, runlock.busy_error(folder, holder))] if holder else []


def _git_cache(
    opts: Options, ws: Workspace, refusals: list[Refusal]
) -> tuple[checkout.GitCache, dict[str, Path]]:
    """The git cache as the build reaches it: with ``--bundles``, each upstream mapped to
    its bundle file itself (read, never unbundled); else the mirrors file."""
    try:
        found = pipeline.decide_origins(opts, dry=True)
    except KilnError as exc:
        refusals.append(_refusal("inputs", exc))
        offline = origins.is_offline(opts.offline, opts.bundles)
        return checkout.GitCache(opts.cache, Mirrors(), offline), {}
    return found.git_cache(opts.cache), found.bundle_files


def _bundle_mirrors(opts: Options, bundle_files: dict[str, Path]) -> list[Provision]:
    """The mirrors the build's inputs stage unbundles ``--bundles`` into (in the work
    folder), about the bundles' size."""
    if not bundle_files:
        return []
    where = opts.bundle_mirrors_dir
    what = f"the mirrors of {len(bundle_files)} git bundles"
    if all(bundles.unbundled(b, where) for b in bundle_files.values()):
        return [Provision(what, str(where), "", made=True)]
    size = sum(b.stat().st_size for b in bundle_files.values()) / prov.GIB
    return [Provision(what, str(where), prov.about(size, "the bundles' size"))]


def _preflight(
    opts: Options,
    ws: Workspace,
    selected: list[Vendor],
    git: checkout.GitCache,
    refusals: list[Refusal],
) -> tuple[Runner | None, preflight.Report]:
    """The runner (made for a dry run) and preflight's checks, as the build runs them."""
    # Where a build keeps its logs; a dry run's runner provisions nothing, so writes none.
    logs = opts.artifacts / "logs" / ws.release.name
    try:
        runner, problem = runner_or_problem(ws, opts, logs, dry=True)
    except KilnError as exc:  # a runner named that cannot be made (no Docker daemon)
        refusals.append(_refusal("runner", exc))
        return None, preflight.Report()
    try:
        report = preflight.check(ws, selected, runner, git, problem, dry=True)
    except KilnError as exc:  # e.g. a --python that is not there
        refusals.append(_refusal("preflight", exc))
        return runner, preflight.Report()
    error = report.error(ws)
    if error is not None:
        refusals.append(_refusal("preflight", error))
        return runner, report
    # Preflight passed: the build provisions next, and stops at what cannot be made.
    failing = [p.error for p in report.provision if p.error is not None and not p.made]
    if failing:
        refusals.append(_refusal("preflight", failing[0]))
    return runner, report


def _sources(git: checkout.GitCache, vendor: Vendor, bundle_files: dict[str, Path]) -> Fetches:
    """The pinned commit as the git cache knows it, and what a build would fetch."""
    src = vendor.source
    fetch: list[str] = []
    commit = git.lookup(src.url, src.commit, vendor.name)
    if commit is None:
        fetch.append(
            f"{src.url} at {src.commit}{_via(git, src.url, src.commit, bundle_files)}"
            f"{_new_clone(git, src.url)}, then its submodules"
        )
    else:
        repo = git.cached(src.url)
        assert repo is not None
        for path, url, sha in checkout.submodule_pins(repo, commit, src.url):
            if git.lookup(url, sha, f"{vendor.name}: submodule {path}") is None:
                fetch.append(
                    f"submodule {path}: {url} at {sha[:12]}{_via(git, url, sha, bundle_files)}"
                    f"{_new_clone(git, url)}"
                )
    return Fetches(src.commit, commit, tuple(fetch))


def _via(git: checkout.GitCache, url: str, sha: str, bundle_files: dict[str, Path]) -> str:
    bundle = bundle_files.get(url)
    if bundle is not None:
        held = any(c.startswith(sha) for c in bundles.heads(bundle).values())
        where = "a head of it" if held else "not a head of it: known once unbundled"
        return f" (from bundle {bundle}, unbundled first; {where})"
    mapped = git.mirrors.map(url)
    return f" (from mirror {mapped})" if mapped != url else ""


def _new_clone(git: checkout.GitCache, url: str) -> str:
    path = git.clone_path(url)
    return "" if (path / "HEAD").exists() else f" into a new bare clone {path}"


def _cache(
    git: checkout.GitCache,
    ws: Workspace,
    toolchain: Mapping[str, object] | None,
    runner: Mapping[str, object],
    acache: ArtifactCache | None,
    vendor: Vendor,
    report: preflight.Report,
) -> CacheAnswer:
    """Hit or miss in the artifact cache, and why."""
    if acache is None:
        return CacheAnswer("off", None, "--no-artifact-cache")
    if toolchain is None:
        why = (
            "the toolchain is known once provisioned"
            if report.unchecked and not report.problems
            else "preflight failed (see problems)"
        )
        return CacheAnswer("unknown", None, why)
    if git.lookup(vendor.source.url, vendor.source.commit, vendor.name) is None:
        return CacheAnswer("unknown", None, "the commit is not fetched yet")
    key, material = key_of(git, ws, toolchain, runner, vendor)
    if (acache.root / key / "entry.json").is_file():
        return CacheAnswer("hit", key, "inputs unchanged: outputs reused")
    last = acache.latest_material(vendor.name)
    if last is None:
        why = "never built with this artifact cache"
    else:
        diff = cachekey.changed(last[1], material)
        why = f"changed since entry {last[0][:12]}: {', '.join(diff) or 'nothing named'}"
    return CacheAnswer("miss", key, why)


def _units_at(git: checkout.GitCache, vendor: Vendor) -> int | None:
    """The translation units of the pinned commit where its clone is cached (its own
    files: a submodule's are counted once checked out), else None."""
    commit = git.lookup(vendor.source.url, vendor.source.commit, vendor.name)
    repo = git.cached(vendor.source.url)
    if commit is None or repo is None:
        return None
    res = git_cmd("ls-tree", "-r", "--name-only", "-z", commit, cwd=repo, check=False)
    if res.returncode != 0:
        return None
    skip = {".git", ".kiln", "build", "dist"}
    return len(
        [
            name
            for name in res.output.split("\0")
            if name.endswith(SOURCE_SUFFIXES) and not skip & set(name.split("/")[:-1])
        ]
    )


def _schedule(
    vendor: Vendor,
    tree: Path,
    peaks: schedule.PeakStore,
    budget: schedule.Budget,
    git: checkout.GitCache,
) -> tuple[schedule.Choice, str]:
    """What the build's own ``schedule.choose`` would pick: from what it learned, else
    the work tree's units, else the pinned commit's (the clone is cached, the tree not
    checked out), else the slots alone (said so: the units are known once fetched)."""
    if peaks.units(vendor):
        counted, units = "learned", None
    elif tree.is_dir():
        counted, units = "work tree", None
    else:
        units = _units_at(git, vendor)
        counted = "the pinned commit" if units is not None else "unknown"
    choice = schedule.choose(vendor, tree, peaks, budget, units=units)
    return choice, counted


def render(p: DryRun) -> str:
    """The plan for people."""
    b, r = p.budget, p.runner
    lines = [
        f"dry run of {p.release} (profile {p.profile}: {', '.join(p.archs)})",
        f"runner: {r.get('kind', 'none')}" + (f", image {r['image']}" if r.get("image") else ""),
        f"budget: {b.mem_gib:g} GiB ({b.source}), {b.cpus} CPU slots ({b.cpus_from})",
    ]
    if p.provision:
        lines.append("would provision first (a dry run makes nothing):")
        lines += [f"  {x.what} at {x.where}: {x.size}" for x in p.provision]
    lines += [f"reuses {x.what} at {x.where}" for x in p.reused]
    for v in p.vendors:
        s = v.schedule
        commit = (v.sources.commit or v.sources.requested)[:12]
        threads = f", nvcc threads {s.nvcc_threads}" if s.nvcc_threads else ""
        known = v.units_from != "unknown"
        units = s.translation_units if known else "?"
        jobs = f"MAX_JOBS {s.max_jobs}" if known else f"MAX_JOBS up to {s.max_jobs}"
        lines += [
            f"{v.name} @ {commit}: artifact cache {v.cache.cache}: {v.cache.why}",
            f"  {jobs}{threads}; {units} units ({v.units_from}"
            + ("" if known else ": counted once fetched")
            + "); "
            f"{s.mem_per_job_gib:g} GiB per compile, its nvcc threads included "
            f"({s.estimate_source})",
        ]
        lines += [f"  would fetch {f}" for f in v.sources.fetch] or ["  nothing to fetch"]
    preflight_refused = any(x.stage == "preflight" for x in p.refusals)
    if p.unchecked and not preflight_refused:
        lines.append("preflight: no problem found so far; checked only once provisioned:")
        lines += [f"  {x}" for x in p.unchecked]
    elif not preflight_refused and not any(x.stage == "runner" for x in p.refusals):
        lines.append("preflight: passed")
    for x in p.refusals:
        lines.append(f"the build would stop at {x.stage} (exit {x.exit_code}):")
        lines.append(f"kiln: error: {x.message}")
    if p.refusals:
        first = p.refusals[0]
        lines.append(f"exit code: {first.exit_code} (the build's: it stops at {first.stage})")
    return "\n".join(lines)


def as_json(p: DryRun) -> str:
    return json.dumps(p.to_json(), indent=2, sort_keys=True)
