"""The whole flow for a workspace: preflight, then per vendor fetch -> patch ->
build (through a runner) -> verify, then the manifest, all into a staging folder
that replaces the release folder only when everything passed."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln import __version__, fsutil
from kiln.build import progress
from kiln.build import runlock as buildlock
from kiln.build.kinds import inplace
from kiln.config import inputs
from kiln.config.mirrors import Mirrors
from kiln.config.models import Vendor
from kiln.config.workspace import Workspace
from kiln.errors import BuildError, ConfigError, PatchError, PreflightError, ToolchainError
from kiln.inside import memwatch
from kiln.inside.kit import compilegate as compile_gate
from kiln.inside.kit import pipcuda
from kiln.inside.step import StepSpec
from kiln.plan import schedule
from kiln.plan.environment import build_environment
from kiln.release import artifactcache, manifest, wheelfix
from kiln.release import files as release
from kiln.runners import docker as docker_runner
from kiln.runners.local import LocalRunner, Runner, step_env
from kiln.sources import checkout as sources
from kiln.sources import licenses, patches
from kiln.toolchain import checks as toolchain
from kiln.toolchain import compilercache
from kiln.verify import binaries as verify

SUPPORTED_KINDS = ("wheel", "inplace")

log = logging.getLogger("kiln.pipeline")


@dataclass
class Options:
    workspace: Path
    vendors: list[str] | None = None
    profile: str | None = None  # a [profiles.NAME] variant of kiln.toml's profile
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
    jobs: int | None = None  # CPU slots for compiles (default: the cores)
    mem_budget_gib: float | None = None  # default: available memory minus a margin
    compiler_cache: Path | None = None  # default: <cache>/ccache
    no_compiler_cache: bool = False
    artifact_cache: bool = True
    artifact_cache_dir: Path | None = None  # default: <cache>/artifacts
    wait: bool = False  # wait for another build holding artifacts/ instead of refusing
    live: bool | None = None  # live progress table (default: when stderr is a terminal)


@dataclass
class Context:
    ws: Workspace
    opts: Options
    git: sources.GitCache
    runner: Runner
    tc: toolchain.Toolchain
    logs: Path
    budget: schedule.Budget
    peaks: schedule.PeakStore
    ccache: compilercache.CompilerCache
    acache: artifactcache.ArtifactCache | None
    gate: Path
    display: progress.Display
    echo: bool  # stream build output to the console (one step at a time, no live table)
    most_at_once: int = 0  # the most steps that ran at the same time (manifest)
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
            patches.require_present([entry], ws.patches_dir, ws.source_patches_dir)
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
        found.extend(system_problems(selected, runner, tc))
    if found:
        raise PreflightError(
            f"cannot build {ws.release.name} here ({len(found)} "
            f"problem{'s' if len(found) > 1 else ''}):",
            found,
            offline_advice(ws),
        )
    return tc, patches.hash_report(entries, ws.patches_dir)


def system_problems(selected: list[Vendor], runner: Runner, tc: toolchain.Toolchain) -> list[str]:
    """The recipes' ``build.system`` files (a header, a library) that are missing where
    builds run, each with the package that provides it: found in seconds, not after a
    compile has run for minutes."""
    asked = {(v.name, i): r for v in selected for i, r in enumerate(v.build.system)}
    if not asked:
        return []
    wanted = [r.model_dump(exclude_none=True) for r in asked.values()]
    include_dirs = list(tc.pip_cuda.get("include_dirs", []))
    missing = runner.missing_system(wanted, include_dirs)
    where = "in the builder image" if runner.kind == "docker" else "on this machine"
    out = []
    for (name, i), req in asked.items():
        if req.model_dump(exclude_none=True) in missing:
            out.append(
                f"vendors/{name}.toml: build.system.{i}: {req.what} not found {where}: "
                f"install it (apt-get install {req.package})"
            )
    return out


_claim_lock = threading.Lock()


def _claim(made: dict[str, str], name: str, vendor: str) -> None:
    with _claim_lock:
        if name in made:
            first, second = sorted((vendor, made[name]))
            raise BuildError(
                f"{first} and {second} both made {name}: "
                f"give one of them another distribution name or version"
            )
        made[name] = vendor


def _place(built: Path, folder: Path, vendor: str, made: dict[str, str]) -> Path:
    """Move a verified output into the release; two vendors may not make one file name."""
    _claim(made, built.name, vendor)
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


_MISSING_LIB = re.compile(r"cannot find (-l\S+)")


def link_hint(log_file: Path, env: dict[str, str]) -> str | None:
    """For a link that failed on a library: which one, and where kiln looked."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return None
    missing = sorted(set(_MISSING_LIB.findall(text)))
    if not missing:
        return None
    looked = [p for p in env.get("LIBRARY_PATH", "").split(os.pathsep) if p]
    return (
        f"the linker found no {', '.join(missing)}; kiln looked in LIBRARY_PATH "
        f"{', '.join(looked) or '(empty)'} and the compiler's own folders: install the "
        f"library or add its folder to build.env LIBRARY_PATH in the vendor TOML"
    )


def run_step(ctx: Context, step: Step) -> None:
    """``python -m kiln.inside step SPEC`` through the runner (here, or in the container)."""
    spec_file = step.log_file.with_suffix(".step.json")
    spec_file.write_text(step.spec.to_json())
    tree, out_dir = Path(step.spec.tree), Path(step.spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writable = [tree, out_dir, step.log_file.parent]
    if ctx.ccache.directory is not None:
        writable.append(ctx.ccache.directory)
    try:
        ctx.runner.run(
            [step.spec.python, "-m", "kiln.inside", "step", spec_file],
            cwd=tree,
            env=step_env(step.env),
            log_file=step.log_file,
            writable=writable,
            what=f"building {step.spec.vendor}",
            mem_gib=step.mem_gib,
            echo=ctx.echo,
        )
    except BuildError as exc:
        hint = link_hint(step.log_file, step.env)
        if hint is None:
            raise
        raise BuildError(f"building {step.spec.vendor}: {hint}\n{exc}") from exc


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
        report = verify.verify_wheel(
            fixed, list(vendor.build.archs), ctx.ws.profile, ctx.tc.site_packages
        )
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
    _claim(ctx.made, tarball.name, vendor.name)
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


def _cache_key(ctx: Context, vendor: Vendor) -> tuple[str, dict[str, Any]]:
    """The artifact-cache key: everything that determines this vendor's outputs. The
    commit is resolved through the git cache; nested submodules are fixed by their
    parents' commits, so the superproject's gitlinks complete the source."""
    src = vendor.source
    commit = ctx.git.resolve(src.url, src.commit, vendor.name)
    repo = ctx.git.cached(src.url)
    assert repo is not None
    material = {
        "kiln": artifactcache.kiln_code_hash(),
        "vendor": vendor.name,
        "source": {
            "url": src.url,
            "commit": commit,
            "submodules": sources.gitlinks(repo, commit),
            "license": src.license,
            "license_id": src.license_id,
        },
        "patches": [
            {
                **entry.model_dump(mode="json"),
                "actual_sha256": fsutil.sha256_file(ctx.ws.patches_dir / entry.file),
            }
            for entry in ctx.ws.patches_for(vendor.name)
        ],
        "patch_tag": ctx.ws.series.tags.get(vendor.name),
        "recipe": vendor.build.model_dump(mode="json"),
        "profile": ctx.ws.profile.model_dump(mode="json"),
        "toolchain": ctx.tc.to_json(),
        "runner": {
            "kind": ctx.runner.kind,
            "image": ctx.runner.image,
            "builder": ctx.runner.builder,
        },
    }
    return artifactcache.make_key(material), material


def _reuse(ctx: Context, vendor: Vendor, key: str, stage: Path) -> dict[str, Any] | None:
    """The cached outputs of an unchanged vendor, re-hashed, placed into the release."""
    if ctx.acache is None:
        return None
    hit = ctx.acache.lookup(key, vendor.name)
    if hit is None:
        return None
    entry, files = hit
    for out in entry["outputs"]:
        if out["kind"] in ("wheel", "tarball"):
            _claim(ctx.made, Path(out["path"]).name, vendor.name)
    artifactcache.place(files, entry, stage)
    log.info(
        "%s: inputs unchanged (artifact cache %s): reusing its verified outputs",
        vendor.name,
        key[:12],
    )
    caches = {**entry.get("caches", {}), "artifact": {"status": "hit", "key": key}}
    return {**entry, "caches": caches}


def _measure(ctx: Context, vendor: Vendor, files: dict[str, Path]) -> dict[str, Any]:
    """What the step used (memory, compiles, compiler-cache hits), and the learned
    per-job peak for the next run (only from real compiles: cache hits use little)."""
    stats = schedule.job_stats(files["jobs"])
    jobs = schedule.summarize_jobs(stats)
    mem = memwatch.read(files["mem"])
    cc = compilercache.read_stats(files["ccache"])
    if jobs["compiles"] and (not ctx.ccache.enabled or cc["misses"]):
        # Only real compiles teach (a ccache hit runs briefly and small); per unit too.
        units = schedule.learned_units(stats) if not cc["hits"] else {}
        ctx.peaks.remember(vendor, jobs["peak_job_gib"], units)
    return {
        "measured": {**jobs, "peak_rss_gib": round(mem["peak_kib"] / 2**20, 3)},
        "compiler": {
            "tool": "ccache" if ctx.ccache.enabled else None,
            **cc,
            "note": ctx.ccache.note,
        },
    }


def build_vendor(ctx: Context, vendor: Vendor, stage: Path) -> dict[str, Any]:
    timings: dict[str, float] = {}
    what = vendor.name
    ctx.display.update(what, "fetching", runner=ctx.runner.kind)
    tree = ctx.opts.work / ctx.ws.release.name / vendor.name
    with timed(timings, "fetch"):
        key, material = _cache_key(ctx, vendor)
        reused = _reuse(ctx, vendor, key, stage)
        if reused is not None:
            ctx.display.update(what, "cached", f"artifact cache {key[:12]}", cache="hit")
            return reused
        co = sources.checkout(ctx.git, vendor.source, tree, what)
    with timed(timings, "patch"):
        ctx.display.update(what, "patching", cache="miss" if ctx.acache else "off")
        applied = patches.apply_series(
            tree, ctx.ws.patches_for(vendor.name), ctx.ws.patches_dir, what
        )
        # -lineinfo records source mtimes: make them the commit's, not the checkout's.
        fsutil.set_mtimes(tree, co.commit_time)
    b = vendor.build
    choice = schedule.choose(vendor, tree, ctx.peaks, ctx.budget)
    env, recorded_env = build_environment(
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
    fixes: dict[str, Any] = {}
    if ctx.tc.pip_cuda:
        env.update(pipcuda.environment(ctx.tc.pip_cuda, str(tree / pipcuda.LINKS_DIR), env))
        fixes = pipcuda.record(ctx.tc.pip_cuda, ctx.tc.site_packages, ctx.tc.cuda_home)
    # Every build compiles through kiln's wrapper (deterministic flags, object cache,
    # ccache, the run's compile gate).
    inplace.install_kit(tree)
    env.update(inplace.kit_environment(tree, ctx.tc, env))
    files = {k: ctx.logs / f"{vendor.name}.{k}" for k in ("jobs", "mem", "ccache")}
    for f in files.values():
        f.unlink(missing_ok=True)
    env.update(compilercache.environment(ctx.ccache, tree, files["ccache"]))
    # torch >= 2.10 puts ccache in front of the compiler by itself when it finds one: in
    # front of kiln's wrapper, with kiln's ccache settings, caching every compile twice.
    env["TORCH_NO_COMPILER_WRAPPER"] = "1"
    hints = ctx.gate / f"hints-{vendor.name}.json"
    hints.write_text(json.dumps(schedule.gate_hints(vendor, ctx.peaks, choice.nvcc_threads)))
    env.update(
        {
            "KILN_GATE_HINTS": str(hints),
            "KILN_GATE_DIR": str(ctx.gate),
            "KILN_GATE_MEM_GIB": str(choice.gate_mem_gib),
            "KILN_GATE_CPUS": str(choice.nvcc_threads or 1),
            "KILN_JOB_STATS": str(files["jobs"]),
            "KILN_STEP_MEM": str(files["mem"]),
        }
    )
    out_dir = stage / f".out-{vendor.name}" if b.kind == "wheel" else tree
    container_gib = min(ctx.budget.mem_gib, choice.gate_mem_gib * choice.max_jobs + 1.0)
    step = Step(
        StepSpec(
            vendor.name,
            b.kind,
            ctx.tc.python,
            str(tree),
            str(out_dir),
            b.command,
            pip_cuda=ctx.tc.pip_cuda or None,
        ),
        env,
        ctx.logs / f"{vendor.name}-build.log",
        ctx.opts.mem_limit_gib or max(container_gib, choice.gate_mem_gib),
    )
    step.log_file.unlink(missing_ok=True)
    detail = f"jobs {choice.max_jobs}" + (
        f", nvcc threads {choice.nvcc_threads}" if choice.nvcc_threads else ""
    )
    ctx.display.update(what, "building", detail, mem_file=files["mem"])
    log.info(
        "%s: building at %s with %s, %g GiB per job (%s) (log: %s)",
        what,
        co.commit[:12],
        detail,
        choice.mem_per_job_gib,
        choice.estimate_source,
        step.log_file,
    )
    if b.kind == "inplace":
        outputs = _inplace_outputs(ctx, vendor, step, stage, co, applied, recorded_env, timings)
    else:
        outputs = _wheel_outputs(ctx, vendor, step, stage, co, applied, timings)
    outputs.append(_license_output(vendor, tree, stage))
    outputs.extend(_patch_outputs(ctx, applied, stage))
    used = _measure(ctx, vendor, files)
    entry = {
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
        "toolchain_fixes": fixes,
        "runner": {
            "kind": ctx.runner.kind,
            "image": ctx.runner.image,
            "builder": ctx.runner.builder,
        },
        "outputs": outputs,
        "timings": timings,
        "schedule": {**choice.to_json(), **used["measured"]},
        "caches": {
            "artifact": {"status": "miss" if ctx.acache else "off", "key": key},
            "compiler": used["compiler"],
        },
    }
    if ctx.acache is not None:
        ctx.acache.store(key, material, entry, stage)
    peak = used["measured"]["peak_rss_gib"]
    ctx.display.update(what, "done", f"{detail}, peak {peak:g} GiB")
    return entry


def _run_plan(ctx: Context, selected: list[Vendor], stage: Path) -> dict[str, dict[str, Any]]:
    """Build every vendor, each as soon as the ones it comes ``after`` are done, all
    others at once (the compile gate shares the machine between them). After a
    failure nothing new starts; steps already running finish (and are cached, so a
    rerun does not redo them); then the first error is raised."""
    names = {v.name for v in selected}
    after = {v.name: [a for a in v.build.after if a in names] for v in selected}
    pending = list(selected)
    running: dict[Future[dict[str, Any]], str] = {}
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=max(len(selected), 1), thread_name_prefix="step") as pool:
        try:
            while pending or running:
                ready = [v for v in pending if all(a in results for a in after[v.name])]
                for v in ready if not errors else []:
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
                        errors.append(exc)
                        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                        ctx.display.update(name, "failed", first[:80])
        except BaseException:
            ctx.runner.cancel()
            raise
    if pending and not errors:
        raise ConfigError(
            f"build.after of {', '.join(v.name for v in pending)} forms a cycle: "
            f"fix build.after in their vendors/*.toml"
        )
    for extra in errors[1:]:
        log.error("%s", str(extra).splitlines()[0] if str(extra) else type(extra).__name__)
    if errors:
        raise errors[0]
    return results


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


def _check_after(ws: Workspace) -> None:
    for v in ws.vendors.values():
        for name in v.build.after:
            if name not in ws.vendors:
                raise ConfigError(
                    f"vendors/{v.name}.toml: build.after: unknown vendor {name!r} "
                    f"(known: {', '.join(ws.vendors)})"
                )


def build(opts: Options) -> Path:
    """Build the selected vendors of ``opts.workspace``; return the release folder."""
    ws = Workspace(opts.workspace, opts.profile)
    _check_after(ws)
    selected = ws.select(opts.vendors)
    opts.artifacts, opts.work, opts.cache = (
        p.resolve() for p in (opts.artifacts, opts.work, opts.cache)
    )
    budget = schedule.make_budget(opts.mem_budget_gib, opts.jobs)
    peaks = schedule.PeakStore(opts.cache / "peaks.json")
    schedule.check_fits(selected, peaks, budget)
    (opts.artifacts / "logs").mkdir(parents=True, exist_ok=True)
    # The work folder is locked once preflight passed (a run that cannot start creates
    # nothing there).
    with buildlock.hold([opts.artifacts], wait=opts.wait):
        return _build_locked(opts, ws, selected, budget, peaks)


def _build_locked(
    opts: Options,
    ws: Workspace,
    selected: list[Vendor],
    budget: schedule.Budget,
    peaks: schedule.PeakStore,
) -> Path:
    started = time.monotonic()
    release_dir = opts.artifacts / ws.release.name
    logs = opts.artifacts / "logs" / ws.release.name
    logs.mkdir(parents=True, exist_ok=True)
    snapshot = inputs.Snapshot(ws, logs / ".inputs" / "patches")
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
    gate = logs / ".gate"
    shutil.rmtree(gate, ignore_errors=True)
    compile_gate.write_budget(gate, budget.mem_gib, budget.cpus)
    ccache_dir = None if opts.no_compiler_cache else (opts.compiler_cache or opts.cache / "ccache")
    display = progress.Display([v.name for v in selected], live=opts.live)
    ctx = Context(
        ws,
        opts,
        cache,
        runner,
        tc,
        logs,
        budget,
        peaks,
        compilercache.setup(ccache_dir.resolve() if ccache_dir else None, tc.ccache),
        artifactcache.ArtifactCache((opts.artifact_cache_dir or opts.cache / "artifacts").resolve())
        if opts.artifact_cache
        else None,
        gate,
        display,
        echo=len(selected) == 1 and not display.live,
    )
    header = {
        "schema": manifest.SCHEMA_ID,
        "kiln_version": __version__,
        "release": ws.release.model_dump(mode="json"),
        "profile": ws.profile.model_dump(mode="json"),
        "toolchain": tc.to_json(),
        "runner": {"kind": runner.kind, "image": runner.image, "builder": runner.builder},
    }
    log.info(
        "plan: %d step%s, memory budget %g GiB (%s), %d CPU slots",
        len(selected),
        "s" if len(selected) != 1 else "",
        budget.mem_gib,
        budget.source,
        budget.cpus,
    )
    try:
        with (
            buildlock.hold([opts.work], wait=opts.wait),
            fsutil.staged_dir(release_dir) as stage,
            memwatch.Watcher(os.getpid(), interval=2.0) as watch,
            display,
        ):
            built = _run_plan(ctx, selected, stage)
            watch.stop()
            for w in snapshot.warnings():
                log.warning("%s", w)
                warnings.append(w)
            kept = _carry_over(release_dir, stage, header, set(built))
            data = {
                **header,
                "warnings": warnings,
                "scheduler": {
                    **budget.to_json(),
                    "steps_at_once": ctx.most_at_once,
                    "compiles_at_once": schedule.most_at_once(
                        [
                            s
                            for v, e in built.items()
                            if e["caches"]["artifact"]["status"] != "hit"
                            for s in schedule.job_stats(logs / f"{v}.jobs")
                        ]
                    ),
                    "peak_rss_gib": round(watch.peak_kib / 2**20, 3),
                    "wall_s": round(time.monotonic() - started, 3),
                },
                "vendors": dict(sorted({**kept, **built}.items())),
            }
            data["files"] = release.write_files(stage, ws, data, release_dir)
            manifest.write(stage / manifest.FILE_NAME, data)
            fsutil.publish(stage, release_dir)
    finally:
        peaks.save()
        shutil.rmtree(gate, ignore_errors=True)
        _summarize(display)
    log.info("release ready: %s", release_dir)
    return release_dir


def _summarize(display: progress.Display) -> None:
    if any(s.state != "queued" for s in display.steps.values()):
        display.print_summary()
