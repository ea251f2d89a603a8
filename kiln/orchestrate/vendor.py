"""One vendor's build: its cache key, the artifact cache, the pinned checkout and its
patches, the environment and the step, then its build kind's outputs, its license and
patches, and its manifest entry."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kiln import fsutil
from kiln.config.models import Vendor
from kiln.config.workspace import Workspace
from kiln.errors import KilnError
from kiln.inside import memwatch
from kiln.inside.kit import pipcuda
from kiln.inside.step import BUILD_TOOLS_ENV, StepSpec
from kiln.orchestrate import failure, importproof, kit, learned
from kiln.orchestrate.context import Context, Step, Timings, phases_file, timed
from kiln.orchestrate.kinds import KINDS, Job
from kiln.plan import bound, cachekey, jobs, schedule
from kiln.plan.environment import build_environment, step_files
from kiln.release import artifactcache, files
from kiln.release.manifest import (
    ArtifactCacheInfo,
    Caches,
    CompilerCacheInfo,
    Output,
    PatchInfo,
    RunnerInfo,
    Schedule,
    SourceInfo,
    SubmoduleInfo,
    VendorEntry,
)
from kiln.runners.protocol import Runner
from kiln.sources import checkout, licenses, patches
from kiln.toolchain import compilercache, vendortools

log = logging.getLogger(__name__)


def runner_info(ctx: Context) -> RunnerInfo:
    return describe_runner(ctx.runner)


def describe_runner(r: Runner) -> RunnerInfo:
    """What the manifest (and the artifact cache's key) records of where steps ran: one
    place for the build, its header and the dry run."""
    return RunnerInfo(kind=r.kind, image=r.image, builder=r.builder, network=network_state(r))


def network_state(r: Runner) -> Literal["isolated", "not isolated"]:
    """Whether this runner's steps can reach the network (the manifest's runner.network)."""
    return "isolated" if r.capabilities.isolates_network else "not isolated"


def cache_key(ctx: Context, vendor: Vendor) -> tuple[str, cachekey.Material]:
    """The artifact-cache key of ``vendor`` (and what it hashes)."""
    return key_of(ctx.git, ctx.ws, ctx.tc.to_json(), runner_info(ctx).data(), vendor)


def key_of(
    git: checkout.GitCache,
    ws: Workspace,
    toolchain: Mapping[str, object],
    runner: Mapping[str, object],
    vendor: Vendor,
) -> tuple[str, cachekey.Material]:
    """The key from its parts: the commit resolved through the git cache, the
    superproject's gitlinks, the patches as they are now, the toolchain and runner."""
    src = vendor.source
    commit = git.resolve(src.url, src.commit, vendor.name)
    repo = git.cached(src.url)
    assert repo is not None
    material = cachekey.material(
        vendor,
        commit,
        checkout.gitlinks(repo, commit),
        [(e, fsutil.sha256_file(ws.patches_dir / e.file)) for e in ws.patches_for(vendor.name)],
        ws.series.tags.get(vendor.name),
        ws.profile,
        toolchain,
        runner,
    )
    return cachekey.make_key(material), material


def _reuse(ctx: Context, vendor: Vendor, key: str, stage: Path) -> VendorEntry | None:
    """The cached outputs of an unchanged vendor, re-hashed, placed into the release."""
    if ctx.acache is None:
        return None
    hit = ctx.acache.lookup(key, vendor.name)
    if hit is None:
        return None
    entry, folder = hit
    for out in entry.outputs_of("wheel", "tarball"):
        ctx.claim(Path(out.path).name, vendor.name)
    artifactcache.place(folder, entry, stage)
    log.info(
        "%s: inputs unchanged (artifact cache %s): reusing its verified outputs",
        vendor.name,
        key[:12],
    )
    caches = (entry.caches or Caches()).model_copy(
        update={"artifact": ArtifactCacheInfo(status="hit", key=key)}
    )
    # the key leaves out what only the proof reads: the recipe as it is now, and a proof
    # made under other proof settings is made again
    recipe = vendor.build.model_dump(mode="json")
    settings = {k: v for k, v in entry.recipe.items() if k in cachekey.PROOF_ONLY}
    again = settings != {k: v for k, v in recipe.items() if k in cachekey.PROOF_ONLY}
    reused = entry.model_copy(update={"caches": caches, "recipe": recipe})
    proven = _proven(ctx, vendor, reused, stage, again)
    if proven is not reused:
        ctx.acache.update_entry(key, proven)  # the next build keeps this proof
    return proven


def _proven(
    ctx: Context, vendor: Vendor, entry: VendorEntry, stage: Path, again: bool = False
) -> VendorEntry:
    """An entry keeps its import proof while the consumer environment is the one it was
    proven in and the proof's settings are the same (``again``: they changed); else (the
    runtime requirements changed, or it was kept before its proof) it is proven now."""
    if not ctx.opts.import_proof or not (again or importproof.stale(entry.outputs, ctx)):
        return entry
    outputs = [
        o.model_copy(
            update={"import_proof": importproof.prove(ctx, vendor, stage / o.path, o.kind)}
        )
        if o.kind in ("wheel", "tarball")
        else o
        for o in entry.outputs
    ]
    return entry.model_copy(update={"outputs": outputs})


def _measure(
    ctx: Context,
    vendor: Vendor,
    logs: StepLogs,
    choice: schedule.Choice,
    timings: dict[str, float],
) -> tuple[Schedule, CompilerCacheInfo]:
    """What the step used (memory, compiles, its critical path: the manifest's schedule
    fields) and its compiler cache's figures."""
    stats = jobs.job_stats(logs.jobs)
    ran = {**schedule.summarize_jobs(stats), **bound.step_path(stats, timings).to_json()}
    mem = memwatch.read(logs.mem)
    cc = compilercache.read_stats(logs.ccache)
    peak_rss_gib = round(mem["peak_kib"] / 2**20, 3)
    used = Schedule.model_validate({**choice.to_json(), **ran, "peak_rss_gib": peak_rss_gib})
    tool = ctx.ccache.tool if ctx.ccache.enabled else None
    compiler = CompilerCacheInfo.model_validate({"tool": tool, **cc, "note": ctx.ccache.note})
    for warning in compiler.warnings or []:
        log.warning("%s: %s", vendor.name, warning)
    return used, compiler


def _measured(ctx: Context, vendor: Vendor, logs: StepLogs) -> schedule.Measured | None:
    """What the step's compiles measured, for the next run's plan (only from real
    compiles: cache hits use little); also from a step that failed after compiling, so
    the fix's build plans from what its units used, not from the recipe's guess. The
    pipeline merges it into the store once the steps are done."""
    stats = jobs.job_stats(logs.jobs)
    ran = schedule.summarize_jobs(stats)
    tail = schedule.learned_tail(stats)
    # sccache compiles in its server, not below kiln's wrapper: the wrapper's figures are
    # sccache's client's, nothing to learn a unit's memory or CPU from.
    # (ccache's hits are records of their own: only what compiled is learned from)
    learns = ctx.ccache.tool != "sccache" or not ctx.ccache.enabled
    if learns and ran["compiles"]:
        if ran["peak_job_gib"] <= 0:
            return None
        return schedule.Measured(ran["peak_job_gib"], schedule.learned_units(stats), tail)
    if learns and tail:
        return schedule.Measured(None, None, tail)
    return None


@dataclass(frozen=True)
class VendorBuilt:
    """A vendor's step done: its manifest entry and what its compiles measured (None
    for an entry reused from the artifact cache, or nothing learned)."""

    entry: VendorEntry
    measured: schedule.Measured | None = None


class StepFailed(Exception):
    """A step that failed after its compiles ran: its error as raised, untouched, and
    what the compiles measured, which the pipeline learns as from a step that built."""

    def __init__(self, error: KilnError, measured: schedule.Measured | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.measured = measured


def _license_outputs(
    vendor: Vendor, tree: Path, stage: Path, co: checkout.Checkout
) -> tuple[list[Output], list[SubmoduleInfo]]:
    """The upstream's license and every checked-out submodule's (built in or shipped)."""
    dest = stage / "licenses" / f"{vendor.name}-{Path(vendor.source.license).name}"
    licenses.collect(vendor, tree, dest)
    outputs = [files.output_entry(dest, stage, "license")]
    declared = {s.path: s for s in vendor.source.submodules}
    subs = []
    for s in co.submodules:
        sub = declared.get(s.path)
        copy, found = licenses.collect_submodule(vendor, s.path, sub, tree, stage / "licenses")
        outputs.append(files.output_entry(copy, stage, "license"))
        subs.append(
            SubmoduleInfo(
                path=s.path,
                url=s.url,
                commit=s.commit,
                license=found,
                license_file=str(copy.relative_to(stage)),
                license_id=sub.license_id if sub else None,
            )
        )
    return outputs, subs


def _patch_outputs(ctx: Context, applied: list[patches.AppliedPatch], stage: Path) -> list[Output]:
    out = []
    for p in applied:
        dest = stage / "patches" / p.file
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ctx.ws.patches_dir / p.file, dest)
        out.append(files.output_entry(dest, stage, "patch"))
    return out


@dataclass(frozen=True)
class StepLogs:
    """The files a step's tools write beside its log (the compiler runs, the memory
    sampler, the compiler cache's statistics, the failure record)."""

    jobs: Path
    mem: Path
    ccache: Path
    failure: Path

    @classmethod
    def of(cls, ctx: Context, vendor: str) -> StepLogs:
        return cls(
            jobs=ctx.logs / f"{vendor}.jobs",
            mem=ctx.logs / f"{vendor}.mem",
            ccache=ctx.logs / f"{vendor}.ccache",
            failure=failure.record_path(ctx.logs, vendor),
        )


@dataclass(frozen=True)
class StepSetup:
    env: dict[str, str]  # the step's whole environment
    recorded: dict[str, str]  # the part the manifest records
    fixes: dict[str, object]  # the pip-CUDA fixes (pipcuda.record's JSON: the manifest's)
    logs: StepLogs


def _environment(
    ctx: Context, vendor: Vendor, tree: Path, co: checkout.Checkout, choice: schedule.Choice
) -> StepSetup:
    """The step's environment, the part recorded, the pip-CUDA fixes, its log files."""
    env, recorded = build_environment(
        vendor,
        ctx.ws.profile,
        ctx.tc.cuda_home,
        co.commit_time,
        base=ctx.runner.base_env(),
        max_jobs=choice.max_jobs,
        nvcc_threads=choice.nvcc_threads,
    )
    # What torch's pip CUDA lacks on a host without a full CUDA install (headers on the
    # include path, unversioned link names, a libcuda stub): kiln.inside.kit.pipcuda.
    fixes: dict[str, object] = {}
    if ctx.tc.pip_cuda:
        env.update(pipcuda.environment(ctx.tc.pip_cuda, str(tree / pipcuda.LINKS_DIR), env))
        fixes = pipcuda.record(ctx.tc.pip_cuda, ctx.tc.site_packages, ctx.tc.cuda_home)
    # Every build compiles through kiln's wrapper (deterministic flags, object cache,
    # ccache, the run's compile gate).
    kit.install_kit(tree)
    env.update(kit.kit_environment(tree, ctx.tc, env))
    if vendor.build.build_tools:
        # the vendor's own build tools, first on its steps' sys.path (not recorded as
        # environment: the path is this machine's; the recipe records the pins)
        tools = vendortools.install(
            vendor.build.build_tools,
            ctx.ws.profile,
            ctx.opts.cache,
            tree,
            ctx.offline,
            ctx.logs / f"{vendor.name}-tools.log",
        )
        env[BUILD_TOOLS_ENV] = str(tools)
    logs = StepLogs.of(ctx, vendor.name)
    for f in (logs.jobs, logs.mem, logs.ccache, logs.failure):
        f.unlink(missing_ok=True)
    env.update(compilercache.environment(ctx.ccache, tree, logs.ccache))
    # torch >= 2.10 puts ccache in front of the compiler by itself when it finds one: in
    # front of kiln's wrapper, with kiln's ccache settings, caching every compile twice.
    env["TORCH_NO_COMPILER_WRAPPER"] = "1"
    hints = ctx.gate / f"hints-{vendor.name}.json"
    hints.write_text(json.dumps(schedule.gate_hints(vendor, ctx.peaks)))
    env.update(
        step_files(
            gate=ctx.gate,
            hints=hints,
            # per compile: what a unit of a kind nothing was learned or seen of reserves
            # (a learned step's figures are per unit, family and kind: the hints)
            guess_gib=schedule.recipe_guess(vendor, choice.nvcc_threads),
            jobs=logs.jobs,
            mem=logs.mem,
            failure=logs.failure,
        )
    )
    return StepSetup(env, recorded, fixes, logs)


def build_vendor(ctx: Context, vendor: Vendor, stage: Path) -> VendorBuilt:
    """The vendor's entry: reused from the artifact cache, else built and kept there.
    A miss holds the key's lock until the entry is stored, so a build from another
    checkout sharing the cache that needs the same key waits, then reuses it."""
    phases = phases_file(ctx.logs, vendor.name)
    phases.unlink(missing_ok=True)
    timings = Timings(phases)
    ctx.display.update(vendor.name, "fetching", runner=ctx.runner.kind)
    with timed(timings, "fetch"):
        key, material = cache_key(ctx, vendor)
        reused = _reused(ctx, vendor, key, stage)
    if reused is not None:
        return VendorBuilt(reused)
    if ctx.acache is None:
        return _build(ctx, vendor, stage, key, material, timings)
    with ctx.acache.making(key, vendor.name):
        with timed(timings, "fetch"):
            reused = _reused(ctx, vendor, key, stage)  # made while this one waited?
        if reused is not None:
            return VendorBuilt(reused)
        return _build(ctx, vendor, stage, key, material, timings)


def _reused(ctx: Context, vendor: Vendor, key: str, stage: Path) -> VendorEntry | None:
    reused = _reuse(ctx, vendor, key, stage)
    if reused is not None:
        proven = importproof.summary([o.import_proof for o in reused.outputs if o.import_proof])
        ctx.display.update(
            vendor.name,
            "cached",
            f"artifact cache {key[:12]}" + (f"; {proven}" if proven else ""),
            cache="hit",
        )
    return reused


def _build(
    ctx: Context,
    vendor: Vendor,
    stage: Path,
    key: str,
    material: cachekey.Material,
    timings: dict[str, float],
) -> VendorBuilt:
    what = vendor.name
    kind = KINDS[vendor.build.kind]
    tree = ctx.opts.work / ctx.ws.release.name / vendor.name
    with timed(timings, "fetch"):
        co = checkout.checkout(ctx.git, vendor.source, tree, what)
    with timed(timings, "patch"):
        ctx.display.update(what, "patching", cache="miss" if ctx.acache else "off")
        applied = patches.apply_series(
            tree,
            ctx.ws.patches_for(vendor.name),
            ctx.ws.patches_dir,
            what,
            ctx.logs / f"{vendor.name}-patch.log",
        )
        # -lineinfo records source mtimes: make them the commit's, not the checkout's.
        fsutil.set_mtimes(tree, co.commit_time)
    choice = schedule.choose(vendor, tree, ctx.peaks, ctx.budget, ctx.ccache.remote_slots)
    setup = _environment(ctx, vendor, tree, co, choice)
    b = vendor.build
    step = Step(
        StepSpec(
            vendor.name,
            b.kind,
            ctx.tc.python,
            str(tree),
            str(kind.out_dir(stage, vendor, tree)),
            b.command,
            pip_cuda=ctx.tc.pip_cuda,
        ),
        setup.env,
        ctx.logs / f"{vendor.name}-build.log",
        # The step's limit guards the machine; the compile gate keeps what runs within
        # the budget, a compile at a time, from what the compiles hold as they run.
        ctx.opts.mem_limit_gib or ctx.budget.mem_gib,
    )
    step.log_file.unlink(missing_ok=True)
    detail = f"jobs {choice.max_jobs}" + (
        f", nvcc threads {choice.nvcc_threads}" if choice.nvcc_threads else ""
    )
    ctx.display.update(what, "building", detail, mem_file=setup.logs.mem)
    log.info(
        "%s: building at %s with %s, %g GiB per job (%s) (log: %s)",
        what,
        co.commit[:12],
        detail,
        choice.mem_per_job_gib,
        choice.estimate_source,
        step.log_file,
    )
    try:
        # licenses first: a missing one fails in seconds, not after the compile
        license_outputs, submodules = _license_outputs(vendor, tree, stage, co)
        outputs = kind.outputs(Job(ctx, vendor, step, stage, co, applied, setup.recorded, timings))
        outputs += license_outputs
        outputs.extend(_patch_outputs(ctx, applied, stage))
        used, compiler = _measure(ctx, vendor, setup.logs, choice, timings)
        measured = _measured(ctx, vendor, setup.logs)
        note = schedule.far_off_note(vendor, jobs.job_stats(setup.logs.jobs))
        if note:
            log.warning("%s", note)
        entry = VendorEntry(
            source=SourceInfo(
                url=co.url,
                requested=vendor.source.commit,
                commit=co.commit,
                commit_time=co.commit_time,
                license=vendor.source.license,
                license_id=vendor.source.license_id,
                submodules=submodules,
            ),
            patches=[
                PatchInfo(
                    file=p.file,
                    sha256=p.sha256,
                    locked_sha256=p.locked_sha256,
                    status=p.status,
                )
                for p in applied
            ],
            patch_tag=ctx.ws.series.tags.get(vendor.name),
            recipe=vendor.build.model_dump(mode="json"),
            environment=setup.recorded,
            toolchain_fixes=setup.fixes,
            runner=runner_info(ctx),
            outputs=outputs,
            timings=dict(timings),
            schedule=used,
            caches=Caches(
                artifact=ArtifactCacheInfo(status="miss" if ctx.acache else "off", key=key),
                compiler=compiler,
            ),
            learned=learned.record(
                ctx.peaks.merged(vendor, measured) if measured else ctx.peaks.entry(vendor)
            ),
        )
        if ctx.acache is not None:
            # kept before its proof: a proof that fails (the runtime requirements, the proof's
            # settings) never costs the compile again; the next build proves the kept entry
            ctx.acache.store(key, material, entry, stage)
        with timed(timings, "verify"):
            entry = _proven(ctx, vendor, entry, stage)
        entry = entry.model_copy(update={"timings": dict(timings)})
        if ctx.acache is not None:
            ctx.acache.update_entry(key, entry)
    except KilnError as exc:
        # what compiled before the failure still counts (a proof that failed, too)
        raise StepFailed(exc, _measured(ctx, vendor, setup.logs)) from exc
    proven = importproof.summary([o.import_proof for o in entry.outputs if o.import_proof])
    ctx.display.update(
        what,
        "done",
        f"{detail}, peak {used.peak_rss_gib:g} GiB" + (f"; {proven}" if proven else ""),
        cache="miss, kept" if ctx.acache is not None else "off",
    )
    return VendorBuilt(entry, measured)
