"""What the stages of one build share: the workspace, the options, the runner and its
toolchain, the budget, the caches; the step a vendor runs; and the small rules every
build kind follows (timings, one file name per vendor, a failed step explained)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kiln.config.workspace import Workspace
from kiln.errors import BuildError, KilnError
from kiln.inside import say
from kiln.inside.kit import contract
from kiln.inside.step import StepSpec
from kiln.orchestrate import failure, fixcheck, progress
from kiln.orchestrate.options import Options
from kiln.plan import jobs, schedule
from kiln.release import artifactcache
from kiln.runners.protocol import Command, Runner, step_env
from kiln.sources import checkout
from kiln.toolchain import checks, compilercache
from kiln.verify import wrapped


class Claims:
    """Which vendor made each output file name: two may not make one (the vendors' threads
    claim names at once, so under a lock)."""

    def __init__(self) -> None:
        self._made: dict[str, str] = {}
        self._lock = threading.Lock()

    def claim(self, name: str, vendor: str) -> None:
        with self._lock:
            if name in self._made:
                first, second = sorted((vendor, self._made[name]))
                raise BuildError(
                    f"{first} and {second} both made {name}: "
                    f"give one of them another distribution name or version"
                )
            self._made[name] = vendor


@dataclass(frozen=True)
class Context:
    """What every vendor's step of one build reads: fixed before the first step starts
    (only ``claims`` and ``display`` change, each under its own lock)."""

    ws: Workspace
    opts: Options
    git: checkout.GitCache  # with the mirrors this run fetches from (--bundles' own)
    runner: Runner
    tc: checks.Toolchain
    logs: Path
    budget: schedule.Budget
    peaks: schedule.PeakStore  # read by the steps; merged by the pipeline after them
    ccache: compilercache.CompilerCache
    acache: artifactcache.ArtifactCache | None
    gate: Path
    display: progress.Display
    echo: bool  # stream build output to the console (one step at a time, no live table)
    claims: Claims = field(default_factory=Claims)

    @property
    def offline(self) -> bool:
        """Whether this run is offline (--offline, or --bundles), as
        ``kiln.sources.origins.decide`` decided it: the one place it is read from."""
        return self.git.offline

    def claim(self, name: str, vendor: str) -> None:
        """Two vendors may not make one file name."""
        self.claims.claim(name, vendor)

    def place(self, built: Path, folder: Path, vendor: str) -> Path:
        """Move a verified output into the release."""
        self.claim(built.name, vendor)
        folder.mkdir(parents=True, exist_ok=True)
        dest = folder / built.name
        os.replace(built, dest)
        shutil.rmtree(built.parent, ignore_errors=True)
        return dest


@dataclass(frozen=True)
class Step:
    spec: StepSpec
    env: dict[str, str]
    log_file: Path
    mem_gib: float


class Timings(dict[str, float]):
    """A step's phase durations (the manifest's ``vendors.<name>.timings``, unchanged)
    that also appends each timed block's start and end, epoch seconds, to ``phases``
    (``<logs>/<vendor>.phases``, one JSON line per block: the timings report's phases,
    ``kiln/timings/``)."""

    def __init__(self, phases: Path | None = None) -> None:
        super().__init__()
        self.phases = phases


def phases_file(logs: Path, vendor: str) -> Path:
    return logs / f"{vendor}.phases"


@contextmanager
def timed(timings: dict[str, float], step: str) -> Iterator[None]:
    """Add the time the block takes to ``timings[step]`` (a step timed in parts adds up);
    where ``timings`` is a :class:`Timings` with a file, the block's start and end too."""
    start = time.monotonic()
    wall = time.time()
    try:
        yield
    finally:
        took = time.monotonic() - start
        timings[step] = round(timings.get(step, 0.0) + took, 3)
        phases = getattr(timings, "phases", None)
        if phases is not None:
            line = json.dumps(
                {"phase": step, "start": round(wall, 3), "end": round(wall + took, 3)}
            )
            try:
                with open(phases, "a") as fh:
                    fh.write(line + "\n")
            except OSError:
                pass  # a report's input: never a reason to fail the build


def _run_folded(ctx: Context, command: Command, title: str) -> None:
    """The step through the runner, its output one GitHub Actions fold group under
    ``title`` (kiln.inside.say): echoed, folded as it comes (one step at a time);
    otherwise the whole log at once when the step ends, however it ends."""
    if ctx.echo:
        with say.group(title):
            ctx.runner.run(command)
        return
    try:
        ctx.runner.run(command)
    finally:
        if say.in_actions() and command.log_file is not None:
            try:
                text = command.log_file.read_text(errors="replace")
            except OSError:
                text = ""
            say.folded(title, text)


def run_step(
    ctx: Context, step: Step, refused: Callable[[], KilnError | None] | None = None
) -> None:
    """``python -m kiln.inside step SPEC`` through the runner (here, or in the container).
    ``refused``: where the step failed, kiln's own reason to have stopped it, if any
    (:mod:`kiln.orchestrate.beforecompile`), said instead of the build's failure."""
    spec_file = step.log_file.with_suffix(".step.json")
    spec_file.write_text(step.spec.to_json())
    tree, out_dir = Path(step.spec.tree), Path(step.spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writable = [tree, out_dir, step.log_file.parent]
    if ctx.ccache.directory is not None:
        writable.append(ctx.ccache.directory)
    started = time.time() - 1.0  # a file system's timestamps may be a second coarse
    command = Command(
        [step.spec.python, "-m", "kiln.inside", "step", spec_file],
        tree,
        step_env(step.env),
        f"building {step.spec.vendor}",
        log_file=step.log_file,
        writable=writable,
        mem_gib=step.mem_gib,
        readonly=[Path(ctx.ccache.binary)] if ctx.ccache.mounted and ctx.ccache.binary else [],
        network=ctx.ccache.networked,
        echo=ctx.echo,
    )
    try:
        _run_folded(ctx, command, f"kiln: {step.spec.vendor}: build ({step.log_file.name})")
    except BuildError as exc:
        reason = refused() if refused is not None else None
        if reason is not None:
            raise reason from None
        raise failure.explain(
            exc,
            step.spec.vendor,
            ctx.logs,
            step.log_file,
            lambda resolve: fixcheck.check(resolve, ctx.ws.profile, ctx.offline),
        ) from None
    # every compile went through kiln's wrapper: an object no compiler run of it wrote was
    # compiled past it (its arch flags and determinism never reached that compile)
    stats = contract.StepFiles.from_env(step.env).job_stats
    records = jobs.job_stats(Path(stats)) if stats else []
    bypassed = wrapped.unrecorded_objects(tree, (r.get("out") for r in records), started)
    if bypassed:
        raise BuildError(wrapped.bypass_message(step.spec.vendor, bypassed, tree))
