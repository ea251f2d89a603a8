"""Build kind ``wheel``: the tree's wheel with build isolation off (the step: its PEP 517
backend called once, what ``pip wheel --no-build-isolation`` makes), then the
wheel repaired to its manylinux tag, re-packed under kiln's version label with the torch
pin in METADATA, held to its size budget, verified and placed in ``wheels/``. Before the
compile, what the wheel will require is held against where it lands
(:mod:`kiln.orchestrate.beforecompile`); once kept in the artifact cache, the vendor's
build proves it imports there (:mod:`kiln.orchestrate.importproof`)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Final

from kiln.config.models import Vendor
from kiln.errors import BuildError, VerifyError
from kiln.orchestrate import beforecompile
from kiln.orchestrate.context import run_step, timed
from kiln.orchestrate.kinds.buildkind import Job
from kiln.release import files, wheelfix
from kiln.release.manifest import Output
from kiln.verify import binaries

log = logging.getLogger(__name__)


class WheelKind:
    name: Final = "wheel"

    def out_dir(self, stage: Path, vendor: Vendor, tree: Path) -> Path:
        return stage / f".out-{vendor.name}"

    def outputs(self, job: Job) -> list[Output]:
        ctx, vendor, step, stage, co = job.ctx, job.vendor, job.step, job.stage, job.co
        applied, timings = job.applied, job.timings
        with timed(timings, "verify"):  # seconds, before minutes of compiling
            beforecompile.check_build_system(ctx, step)
            beforecompile.check_cuda_switches(ctx, step)
        with timed(timings, "build"):
            if ctx.opts.import_proof:  # the step waits for it before its compile
                with (check := beforecompile.RequirementsCheck(ctx, step)) as waiting:
                    run_step(ctx, waiting, check.refusal)
            else:
                run_step(ctx, step)
        made = sorted(Path(step.spec.out_dir).glob("*.whl"))
        if len(made) != 1:
            raise BuildError(
                f"building {vendor.name} left {len(made)} wheels, expected one; see {step.log_file}"
            )
        with timed(timings, "package"):
            profile = ctx.ws.profile
            label = wheelfix.local_label(profile, co.commit, [p.sha256 for p in applied])
            repaired = wheelfix.repair(
                made[0],
                co.commit_time,
                made[0].parent / "repaired",
                vendor.name,
                wheelfix.library_dirs(vendor.build.env),
            )
            fixed = wheelfix.normalize(
                repaired, label, co.commit_time, made[0].parent / "fixed", profile.torch_pin
            )
            wheelfix.check_size(fixed, vendor.name, vendor.build.max_wheel_mib)
        with timed(timings, "verify"):
            try:
                report = binaries.verify_wheel(
                    fixed, list(vendor.build.archs), ctx.ws.profile, ctx.tc.site_packages
                )
            except VerifyError as exc:
                raise _refused(ctx.logs, vendor.name, fixed, ctx.ws.root, exc) from None
        wheel = ctx.place(fixed, stage / "wheels", vendor.name)
        shutil.rmtree(made[0].parent, ignore_errors=True)
        archs = sorted({a for o in report.shared_objects for a in o.sass})
        log.info("%s: %s verified (%s)", vendor.name, wheel.name, ", ".join(archs) or "host only")
        details = {k: v for k, v in report.to_json().items() if k != "file"}
        # proven by the vendor's build once kept in the artifact cache (vendor.py)
        return [files.output_entry(wheel, stage, "wheel", **details)]


def _refused(logs: Path, vendor: str, wheel: Path, ws: Path, exc: VerifyError) -> VerifyError:
    """The wheel verify refused, kept beside the logs (the staging folder goes), and the
    command that checks it again."""
    kept = logs / f"{vendor}-refused" / wheel.name
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, kept)
    return type(exc)(
        f"{exc}\n  the refused wheel: {kept} (kiln verify-wheel {kept} --workspace {ws} "
        f"--vendor {vendor})"
    )


KIND = WheelKind()
