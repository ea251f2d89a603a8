"""A build as one typed chain of stages (nox's ``workflow.execute`` over one tuple of
tasks is the model): each stage *does* its part of a build (:mod:`kiln.orchestrate.pipeline`:
the value the stage before it returned, and the build's exit stack for what it opens,
to the next value) and *says* what it would do in a dry run
(:mod:`kiln.orchestrate.dryrun`: what it would make or fetch, the refusal it would
raise). The chain (:mod:`kiln.orchestrate.chain`) is typed from ``Options`` to the
release folder, so mypy refuses a stage whose value is not the one before it; it is cut
where :func:`build` reads a value (``Prepared``: the summary; ``Release``: its bound).
:func:`build` runs :data:`TO_PREPARED`, :data:`TO_RELEASE` and :data:`SWAP_IN`, and
:func:`dry_run` asks the same stages in the same order, so a new stage is one
``.then(Stage(...))`` line here, in its place.

    load       Options -> Loaded: the workspace and the vendors asked for, their
               ``build.after`` checked
    plan       Loaded -> Header: the memory budget and CPU slots; one job of every step
               must fit. The header is read only from here on: every later value
               carries it as ``head`` beside what its own stage added
    lock       Header -> Locked: one build per artifacts/ folder (a second refuses, or
               waits); what the build makes there is undone if it is refused before its
               first step
    inputs     Locked -> Inputs: where sources come from (kiln/sources/origins.py), the
               logs folder, a snapshot of the patches and TOMLs (edits mid-run never mix
               in)
    prepare    Inputs -> Prepared: where the steps run, preflight (every problem at once),
               the compile gate, caches, display; the release's draft (the manifest's
               header, preflight's warnings)
    stage      Prepared -> Staged: the work folder locked, the staging folder made
    vendors    Staged -> Built: every vendor at once (``build.after`` orders them), each
               in a thread
    release    Built -> Release: the previous release's unchanged vendors, the manifest
               and release files, in the staging folder
    swap_in    Release -> Path: the staging folder swapped in for the release folder

Whatever a stage raises, the exit stack releases every lock, the staging folder and the
gate, so nothing half-written reaches ``artifacts/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Final

from kiln.errors import Interrupted, KilnError
from kiln.orchestrate import dryrun, pipeline
from kiln.orchestrate.chain import Chain, Stage
from kiln.orchestrate.dryrun import Said
from kiln.orchestrate.options import Options

# Options -> Prepared: what the run summary and the timings report read once it exists
TO_PREPARED: Final[Chain[Options, pipeline.Prepared, Said]] = (
    Chain.of(Stage("load", pipeline.load, dryrun.says_load))
    .then(Stage("plan", pipeline.plan_stage, dryrun.says_plan))
    .then(Stage("lock", pipeline.lock, dryrun.says_lock))
    .then(Stage("inputs", pipeline.take_inputs, dryrun.says_inputs))
    .then(Stage("prepare", pipeline.prepare, dryrun.says_prepare))
)
# Prepared -> Release: the release written in the staging folder (the summary's bound)
TO_RELEASE: Final[Chain[pipeline.Prepared, pipeline.Release, Said]] = (
    Chain.of(Stage("stage", pipeline.stage_release, dryrun.says_stage))
    .then(Stage("vendors", pipeline.build_vendors, dryrun.says_vendors))
    .then(Stage("release", pipeline.write_release, dryrun.says_nothing))
)
# Release -> Path: the staging folder swapped in
SWAP_IN: Final[Stage[pipeline.Release, Path, Said]] = Stage(
    "swap_in", pipeline.swap_in, dryrun.says_nothing
)
# every stage's name, in order (the dry run asks each what it would do)
STAGE_NAMES: Final[tuple[str, ...]] = (*TO_PREPARED.names, *TO_RELEASE.names, SWAP_IN.name)
_SAYS: Final[tuple[Callable[[Said], Said], ...]] = (
    *TO_PREPARED.says,
    *TO_RELEASE.says,
    SWAP_IN.says,
)


def build(opts: Options) -> Path:
    """Build the selected vendors of ``opts.workspace``; return the release folder. The
    summary is shown whatever happens once a step started; with ``--timings``, the
    timings report is written into the logs folder at the end, also when a step failed
    (from what the steps recorded)."""
    # how far the build got: the summary's and the timings report's inputs
    prepared: pipeline.Prepared | None = None
    release: pipeline.Release | None = None  # written (the summary's bound line)
    timings = opts.timings
    with contextlib.ExitStack() as stack:
        try:
            prepared = TO_PREPARED.does(opts, stack)
            release = TO_RELEASE.does(prepared, stack)
            done = SWAP_IN.does(release, stack)
        except KilnError as exc:
            if timings and prepared is not None and not isinstance(exc, Interrupted):
                pipeline.timings_report(prepared.head, prepared.ctx.logs, None)
            raise
        finally:
            if prepared is not None:
                pipeline.summarize(prepared.ctx.display, release)
        if timings:
            pipeline.timings_report(prepared.head, prepared.ctx.logs, release)
        return done


def dry_run(opts: Options) -> dryrun.DryRun:
    """What the build would do, every stage asked instead of run. Raises what the build
    raises before anything can be planned (an unreadable workspace: the same error, the
    same code)."""
    said = dryrun.Said(opts.resolved())
    for says in _SAYS:
        said = says(said)
    return dryrun.dry_run_of(said)
