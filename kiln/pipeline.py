"""The whole flow for a workspace: preflight, then per vendor fetch -> patch ->
build (through a runner) -> verify, then the manifest, all into a staging folder
that replaces the release folder only when everything passed."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln import (
    __version__,
    docker_runner,
    fsutil,
    inplace,
    licenses,
    manifest,
    patches,
    release,
    sources,
    toolchain,
    verify,
    wheelfix,
)
from kiln.buildsteps import StepSpec
from kiln.config import Vendor, Workspace
from kiln.errors import BuildError, ConfigError, PatchError, PreflightError, ToolchainError
from kiln.mirrors import Mirrors
from kiln.recipes import build_environment
from kiln.runners import LocalRunner, Runner, step_env

SUPPORTED_KINDS = ("wheel", "inplace")

log = logging.getLogger("kiln.pipeline")


@dataclass
class Options:
    workspace: Path
    vendors: list[str] | None = None
    artifacts: Path = Path("artifacts")
    cache: Path = Path(".kiln-cache")
    work: Path = Path("build/work")
    mirrors: Path | None = None
    offline: bool = False
    python: str | None = None
    cuda_home: str | None = None
    runner: str = "auto"  # "auto": docker when the profile names an image and a daemon answers
    image: str | None = None  # overrides profile.image
    allow_unpinned_image: bool = False
    docker_dir: Path | None = None  # default: <workspace>/docker
    docker_mounts: list[str] = field(default_factory=list)
    mem_limit_gib: float | None = None
    toolchain: str = "system"  # "pypi": the profile's CUDA from hash-pinned PyPI wheels


@dataclass
class Context:
    ws: Workspace
    opts: Options
    git: sources.GitCache
    runner: Runner
    tc: toolchain.Toolchain
    logs: Path
    made: dict[str, str] = field(default_factory=dict)  # output file name -> vendor


@contextmanager
def timed(timings: dict[str, float], step: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        timings[step] = round(time.monotonic() - start, 3)


def offline_advice(ws: Workspace) -> str:
    image = ws.profile.image or "the profile's builder image"
    return (
        f"To build offline: on a machine with network run `nox -s lock` and copy its "
        f".kiln-cache/ here (or mirror each upstream and pass --mirrors FILE --offline), put "
        f"the series' patches under patches/, and run inside {image} (or pass --cuda-home "
        f"with CUDA {ws.profile.cuda} and --python with Python {ws.profile.python}"
        + (f" + torch {ws.profile.torch})." if ws.profile.torch else ").")
    )


def make_runner(ws: Workspace, opts: Options, logs: Path) -> Runner:
    image = opts.image or ws.profile.image
    choice = opts.runner
    if choice == "auto":
        choice = "docker" if image and docker_runner.daemon_answers() else "local"
    if choice == "local":
        pypi = ws.profile.cuda if opts.toolchain == "pypi" else None
        return LocalRunner(opts.python, opts.cuda_home, opts.cache, logs, pypi)
    if opts.toolchain == "pypi":
        raise ConfigError(
            "--toolchain pypi is for the local runner; the Docker runner uses the image's CUDA"
        )
    if choice != "docker":
        raise ConfigError(f"--runner {choice}: unknown runner (choose: auto, local, docker)")
    if not image:
        raise ConfigError(
            "--runner docker needs an image: set profile.image in kiln.toml or pass --image"
        )
    p = ws.profile
    return docker_runner.DockerRunner(
        image,
        allow_unpinned=opts.allow_unpinned_image,
        docker_dir=opts.docker_dir or ws.root / "docker",
        build_args={
            "PYTHON_VERSION": p.python,
            "CUDA_VERSION": p.cuda,
            "TORCH_VERSION": p.torch or "",
        },
        mounts=[docker_runner.Mount.parse(m) for m in opts.docker_mounts],
        python=opts.python or "python3",
        cuda_home=opts.cuda_home or "/usr/local/cuda",
    )


def preflight(
    ws: Workspace,
    selected: list[Vendor],
    runner: Runner | None,
    cache: sources.GitCache,
    runner_problem: str | None = None,
) -> tuple[toolchain.Toolchain, list[str]]:
    """Check everything checkable before any fetch or compile, and report every problem
    at once: patches, build kinds, CUDA, sources, then the build Python and its torch."""
    found: list[str] = []
    entries = [p for v in selected for p in ws.patches_for(v.name)]
    for entry in entries:
        try:
            patches.require_present([entry], ws.patches_dir)
        except PatchError as exc:
            found.append(str(exc))
    for vendor in selected:
        if vendor.build.kind not in SUPPORTED_KINDS:
            found.append(
                f"vendors/{vendor.name}.toml: build.kind {vendor.build.kind!r} is not "
                f"supported by this kiln yet"
            )
    if runner is None:
        found.append(runner_problem or "no runner")
    else:
        try:
            runner.nvcc(ws.profile)
        except ToolchainError as exc:
            found.append(str(exc))
    for vendor in selected:
        problem = sources.availability(cache, vendor.source.url, vendor.source.commit, vendor.name)
        if problem:
            found.append(problem)
    if not found and runner is not None:
        tc = runner.toolchain(ws.profile)
        found.extend(toolchain.problems(tc, ws.profile))
    if found:
        raise PreflightError(
            f"cannot build {ws.release.name} here ({len(found)} "
            f"problem{'s' if len(found) > 1 else ''}):",
            found,
            offline_advice(ws),
        )
    return tc, patches.hash_report(entries, ws.patches_dir)


def _place(built: Path, folder: Path, vendor: str, made: dict[str, str]) -> Path:
    """Move a verified output into the release; two vendors may not make one file name."""
    if built.name in made:
        raise BuildError(
            f"{vendor} made {built.name}, which {made[built.name]} made too: "
            f"give one of them another distribution name or version"
        )
    made[built.name] = vendor
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / built.name
    os.replace(built, dest)
    shutil.rmtree(built.parent, ignore_errors=True)
    return dest


def _output(path: Path, stage: Path, kind: str, **extra: Any) -> dict[str, Any]:
    return {**release.file_entry(path, stage, kind), **extra}


@dataclass(frozen=True)
class Step:
    spec: StepSpec
    env: dict[str, str]
    log_file: Path
    mem_gib: float


def run_step(ctx: Context, step: Step) -> None:
    """``python -m kiln step SPEC`` through the runner (here, or in the container)."""
    spec_file = step.log_file.with_suffix(".step.json")
    spec_file.write_text(step.spec.to_json())
    tree, out_dir = Path(step.spec.tree), Path(step.spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx.runner.run(
        [step.spec.python, "-m", "kiln", "step", spec_file],
        cwd=tree,
        env=step_env(step.env),
        log_file=step.log_file,
        writable=[tree, out_dir, step.log_file.parent],
        what=f"building {step.spec.vendor}",
        mem_gib=step.mem_gib,
        echo=True,
    )


def _wheel_outputs(
    ctx: Context,
    vendor: Vendor,
    step: Step,
    stage: Path,
    co: sources.Checkout,
    applied: list[patches.AppliedPatch],
    timings: dict[str, float],
) -> list[dict[str, Any]]:
    with timed(timings, "build"):
        run_step(ctx, step)
    made = sorted(Path(step.spec.out_dir).glob("*.whl"))
    if len(made) != 1:
        raise BuildError(
            f"building {vendor.name} left {len(made)} wheels, expected one; see {step.log_file}"
        )
    with timed(timings, "package"):
        label = wheelfix.local_label(ctx.ws.profile, co.commit, [p.sha256 for p in applied])
        fixed = wheelfix.normalize(made[0], label, co.commit_time, made[0].parent / "fixed")
    with timed(timings, "verify"):
        report = verify.verify_wheel(fixed, list(vendor.build.archs), ctx.ws.profile)
    wheel = _place(fixed, stage / "wheels", vendor.name, ctx.made)
    shutil.rmtree(made[0].parent, ignore_errors=True)
    archs = sorted({a for o in report.shared_objects for a in o.sass})
    log.info("%s: %s verified (%s)", vendor.name, wheel.name, ", ".join(archs) or "host only")
    details = {k: v for k, v in report.to_json().items() if k != "file"}
    return [_output(wheel, stage, "wheel", **details)]


def _import_check(ctx: Context, tree: Path, module: str) -> dict[str, Any]:
    res = ctx.runner.run(
        [ctx.tc.python, "-c", f"import {module}"],
        cwd=tree,
        env={**ctx.runner.base_env(), "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
        writable=[tree],
        what=f"import {module}",
        check=False,
    )
    return inplace.judge_import(module, res.returncode, res.output)


def _inplace_outputs(
    ctx: Context,
    vendor: Vendor,
    step: Step,
    stage: Path,
    co: sources.Checkout,
    applied: list[patches.AppliedPatch],
    recorded_env: dict[str, str],
    timings: dict[str, float],
) -> list[dict[str, Any]]:
    tree = Path(step.spec.tree)
    with timed(timings, "build"):
        run_step(ctx, step)
    with timed(timings, "verify"):
        objects = inplace.verify_outputs(tree, vendor)
        module = vendor.build.import_check
        smoke = _import_check(ctx, tree, module) if module else None
    log.info(
        "%s: %s verified (%s)%s",
        vendor.name,
        ", ".join(o.path for o in objects),
        ", ".join(sorted({a for o in objects for a in o.sass})) or "host only",
        f"; import {smoke['status']}" if smoke else "",
    )
    inplace.write_tree_metadata(tree, vendor, co.commit, applied, ctx.ws.patches_dir, recorded_env)
    tag = ctx.ws.series.tags.get(vendor.name) or ("unpatched" if not applied else None)
    if tag is None:
        raise ConfigError(
            f"patches/series.toml: tags.{vendor.name}: missing; name the patch "
            f'set for the tarball (e.g. tags = {{ {vendor.name} = "prefixcache" }})'
        )
    name = inplace.tarball_name(vendor, co.commit, tag, ctx.ws.profile)
    with timed(timings, "package"):
        tarball = inplace.pack_tree(tree, stage / name, vendor, co.commit_time)
    if tarball.name in ctx.made:
        raise BuildError(f"{vendor.name} made {tarball.name}, which {ctx.made[name]} made too")
    ctx.made[tarball.name] = vendor.name
    extra: dict[str, Any] = {"shared_objects": [o.__dict__ for o in objects]}
    if smoke:
        extra["import_check"] = smoke
    return [_output(tarball, stage, "tarball", **extra)]


def _license_output(vendor: Vendor, tree: Path, stage: Path) -> dict[str, Any]:
    dest = stage / "licenses" / f"{vendor.name}-{Path(vendor.source.license).name}"
    licenses.collect(vendor, tree, dest)
    return _output(dest, stage, "license")


def _patch_outputs(
    ctx: Context, applied: list[patches.AppliedPatch], stage: Path
) -> list[dict[str, Any]]:
    out = []
    for p in applied:
        dest = stage / "patches" / p.file
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ctx.ws.patches_dir / p.file, dest)
        out.append(_output(dest, stage, "patch"))
    return out


def build_vendor(ctx: Context, vendor: Vendor, stage: Path) -> dict[str, Any]:
    timings: dict[str, float] = {}
    what = vendor.name
    tree = ctx.opts.work / ctx.ws.release.name / vendor.name
    with timed(timings, "fetch"):
        co = sources.checkout(ctx.git, vendor.source, tree, what)
    with timed(timings, "patch"):
        applied = patches.apply_series(
            tree, ctx.ws.patches_for(vendor.name), ctx.ws.patches_dir, what
        )
        # -lineinfo records source mtimes: make them the commit's, not the checkout's.
        fsutil.set_mtimes(tree, co.commit_time)
    b = vendor.build
    env, recorded_env = build_environment(
        vendor, ctx.ws.profile, ctx.tc.cuda_home, co.commit_time, base=ctx.runner.base_env()
    )
    # Every build compiles through kiln's wrapper (deterministic flags, object cache).
    inplace.install_kit(tree)
    env.update(inplace.kit_environment(tree, ctx.tc, env))
    out_dir = stage / f".out-{vendor.name}" if b.kind == "wheel" else tree
    step = Step(
        StepSpec(vendor.name, b.kind, ctx.tc.python, str(tree), str(out_dir), b.command),
        env,
        ctx.logs / f"{vendor.name}-build.log",
        ctx.opts.mem_limit_gib or b.max_jobs * b.mem_per_job_gib,
    )
    step.log_file.unlink(missing_ok=True)
    log.info("%s: building at %s (log: %s)", what, co.commit[:12], step.log_file)
    if b.kind == "inplace":
        outputs = _inplace_outputs(ctx, vendor, step, stage, co, applied, recorded_env, timings)
    else:
        outputs = _wheel_outputs(ctx, vendor, step, stage, co, applied, timings)
    outputs.append(_license_output(vendor, tree, stage))
    outputs.extend(_patch_outputs(ctx, applied, stage))
    return {
        "source": {
            "url": co.url,
            "requested": vendor.source.commit,
            "commit": co.commit,
            "commit_time": co.commit_time,
            "license": vendor.source.license,
            "license_id": vendor.source.license_id,
            "submodules": [
                {"path": s.path, "url": s.url, "commit": s.commit} for s in co.submodules
            ],
        },
        "patches": [
            {
                "file": p.file,
                "sha256": p.sha256,
                "locked_sha256": p.locked_sha256,
                "status": p.status,
            }
            for p in applied
        ],
        "patch_tag": ctx.ws.series.tags.get(vendor.name),
        "recipe": vendor.build.model_dump(mode="json"),
        "environment": recorded_env,
        "runner": {
            "kind": ctx.runner.kind,
            "image": ctx.runner.image,
            "builder": ctx.runner.builder,
        },
        "outputs": outputs,
        "timings": timings,
    }


def _carry_over(
    previous: Path, stage: Path, header: dict[str, Any], rebuilt: set[str]
) -> dict[str, Any]:
    """Entries of the last release that this run did not rebuild, if made the same way."""
    try:
        old = manifest.read(previous / manifest.FILE_NAME)
    except Exception:  # no previous release, or an unreadable one: start afresh
        return {}
    same = all(old.get(k) == header[k] for k in ("profile", "toolchain", "runner"))
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
    for name, entry in old["vendors"].items():
        if name in rebuilt:
            continue
        for out in entry["outputs"]:
            dest = stage / out["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(previous / out["path"], dest)
        kept[name] = entry
    return kept


def build(opts: Options) -> Path:
    """Build the selected vendors of ``opts.workspace``; return the release folder."""
    ws = Workspace(opts.workspace)
    # Wheels first, then trees built in place (DeepInfer builds against the others).
    selected = sorted(ws.select(opts.vendors), key=lambda v: v.build.kind != "wheel")
    opts.artifacts, opts.work, opts.cache = (
        p.resolve() for p in (opts.artifacts, opts.work, opts.cache)
    )
    release_dir = opts.artifacts / ws.release.name
    logs = opts.artifacts / "logs" / ws.release.name
    logs.mkdir(parents=True, exist_ok=True)
    cache = sources.GitCache(opts.cache, Mirrors.load(opts.mirrors), opts.offline)
    try:
        runner: Runner | None = make_runner(ws, opts, logs)
        runner_problem = None
    except ConfigError as exc:
        if opts.runner != "auto":
            raise
        runner, runner_problem = None, str(exc)
    tc, warnings = preflight(ws, selected, runner, cache, runner_problem)
    assert runner is not None
    for w in warnings:
        log.warning("%s", w)
    ctx = Context(ws, opts, cache, runner, tc, logs)
    header = {
        "schema": manifest.SCHEMA_ID,
        "kiln_version": __version__,
        "release": ws.release.model_dump(mode="json"),
        "profile": ws.profile.model_dump(mode="json"),
        "toolchain": tc.to_json(),
        "runner": {"kind": runner.kind, "image": runner.image, "builder": runner.builder},
    }
    with fsutil.staged_dir(release_dir) as stage:
        built = {v.name: build_vendor(ctx, v, stage) for v in selected}
        kept = _carry_over(release_dir, stage, header, set(built))
        data = {**header, "warnings": warnings, "vendors": dict(sorted({**kept, **built}.items()))}
        data["files"] = release.write_files(stage, ws, data, release_dir)
        manifest.write(stage / manifest.FILE_NAME, data)
        fsutil.publish(stage, release_dir)
    log.info("release ready: %s", release_dir)
    return release_dir
