"""The import proof: a vendor's output installed where the release lands and imported
there, before the release folder is written (on by default; ``--no-import-proof``).

1. The consumer's environment (:mod:`kiln.toolchain.consumerenv`): what ``install.sh``
   makes from the release's ``requirements.txt``, with the profile's Python, made once
   per set of inputs through the build's runner (in the builder container for the
   Docker runner) and reused.
2. The output installed from the release's staging folder, as ``install.sh`` installs
   it (a wheel ``--no-deps --no-index``; a tarball unpacked, its tree on a ``.pth``),
   into a small venv of its own whose site-packages holds the environment's
   distributions (linked in), as install.sh's one venv does.
3. Its ``Requires-Dist`` held against what the environment has (a runtime lock that
   pins another torch fails here, with the pin to change).
4. Every extension module, top-level package and declared module imported by
   ``python -m kiln.inside prove`` (:mod:`kiln.inside.import_child`: ``LD_BIND_NOW=1``,
   a time limit, a libcuda stub where no driver is).
5. Every ``DT_NEEDED`` entry provided by someone (:func:`kiln.verify.imports.closure`).

A failure fails the vendor with one screen: the module, the symbol demangled or the
library, the cause and fix from the cause table (:func:`kiln.inside.causes.
explain_load`), the log. The result goes into the output's manifest entry
(``import_proof``), which the artifact cache keeps: an unchanged vendor is proven again
only when the consumer environment changed.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from packaging.requirements import Requirement

from kiln import fsutil
from kiln.config.models import Vendor
from kiln.errors import (
    BuildError,
    CauseEntry,
    ConfigError,
    ErrorEntry,
    FailureRecord,
    FixEdit,
    ImportFailed,
    KilnError,
    ToolchainError,
)
from kiln.inside import import_child
from kiln.inside.causes import table
from kiln.inside.causes.cause import Cause, LoadFailure
from kiln.inside.kit import compilegate as compile_gate
from kiln.orchestrate import failure as failure_record
from kiln.orchestrate.context import Context
from kiln.plan import jobs
from kiln.release import archive, files
from kiln.release.manifest import ImportedModule, ImportProof, Output
from kiln.runners.protocol import Command, step_env
from kiln.toolchain import consumerenv, pipconfig, uvtool
from kiln.toolchain.consumerenv import ConsumerEnv
from kiln.verify import imports, loadfacts
from kiln.verify.binaries import linkage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Landed:
    """An output installed into a proof venv: its Python, its shared objects on disk
    (path in the output -> file), their DT_NEEDED, its top-level names, its
    ``Requires-Dist``."""

    python: Path
    shared_objects: dict[str, Path]
    needed: dict[str, list[str]]
    packages: list[str]
    requires: list[str]
    roots: tuple[Path, ...]  # where the output's files lie once installed


def _run(
    ctx: Context, argv: list[str], what: str, log_file: Path, kiln: bool = False, **extra: Any
) -> None:
    """One command where the build runs; ``kiln``: it imports kiln.inside (kiln's source
    on PYTHONPATH for it alone: venv and pip get the environment as install.sh would)."""
    base = ctx.runner.base_env()
    if kiln:
        env = step_env(base)
    else:
        env = {k: v for k, v in base.items() if k != "PYTHONPATH"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra.pop("add_env", {}))
    ctx.runner.run(
        Command(
            argv,
            Path(extra.pop("cwd", ctx.opts.work)),
            env,
            what,
            log_file=log_file,
            **extra,
        )
    )


# pip 23 (Debian 12's) does not notice a download cut short: it reads as a hash mismatch
# (pip's words, then uv's)
HASH_MISMATCH = ("DO NOT MATCH THE HASHES", "Hash mismatch for")


def _tool_said(tail: list[str]) -> str:
    """What pip, uv (or venv) said last, for the one-line error: its last two ``ERROR:``
    (pip) or ``error:`` (uv) lines and the indented lines under the last (the package a
    hash error names, uv's ``cause:``), else its last line: the cause, which the log's
    path alone hides."""
    lines = [t.rstrip() for t in tail if t.strip()]
    starts = [i for i, t in enumerate(lines) if t.lstrip().lower().startswith("error:")]
    if not starts:
        return f" ({lines[-1].strip()})" if lines else ""
    last = starts[-1]
    margin = len(lines[last]) - len(lines[last].lstrip())  # the error's tail may be indented
    detail = []
    for line in lines[last + 1 : last + 4]:
        if len(line) - len(line.lstrip()) <= margin:
            break
        detail.append(line.strip())
    said = " ".join([lines[i].strip() for i in starts[-2:]] + detail)
    if any(words in said for words in HASH_MISMATCH):
        said += (
            "; a download cut short reads the same (pip does not notice): build again, "
            "and where it repeats, the lock is wrong"
        )
    return f" ({said})"


def planned_environment(ctx: Context) -> ConsumerEnv:
    """This build's consumer environment, made or not: its inputs are the workspace's
    runtime requirements, the build's Python and what the build runs in. Where the build
    runs here, uv links it from the cache that filled the build venv (torch unpacked
    once on the machine, :func:`kiln.toolchain.uvtool.shared_cache`)."""
    ws = ctx.ws
    shared = (
        uvtool.shared_cache(ctx.tc.python, ctx.opts.cache / "envs")
        if ctx.runner.capabilities.host_paths
        else None
    )
    return consumerenv.plan(
        ctx.opts.cache,
        ws.profile.python,
        ctx.tc.python,
        files.requirements(ws.root, ws.profile.torch),
        ws.profile.torch_index,
        f"{ctx.runner.kind}:{ctx.runner.builder or ''}",
        uvtool.binary(),
        shared,
        ctx.opts.proof_env,
    )


def pip_settings(ctx: Context, log_file: Path) -> pipconfig.UvSettings:
    """pip's settings where the build runs (``pip config list`` of the build venv's pip:
    its files and its ``PIP_*`` variables), as uv's arguments; none where pip cannot say."""
    res = ctx.runner.run(
        Command(
            [ctx.tc.python, "-m", "pip", "config", "list"],
            ctx.opts.work,
            {k: v for k, v in ctx.runner.base_env().items() if k != "PYTHONPATH"},
            "reading pip's settings (the indexes install.sh's pip would use)",
            log_file=log_file,
            check=False,
        )
    )
    if res.returncode != 0:
        log.warning("pip config list failed (log: %s): uv uses its own defaults", log_file)
        return pipconfig.UvSettings()
    return pipconfig.uv_settings(pipconfig.parse(res.output))


def environment(ctx: Context) -> ConsumerEnv:
    """The consumer environment of this build, made where the build runs if it is not
    yet (once per set of inputs; its first making is timed and said on its own)."""
    ws = ctx.ws
    env = planned_environment(ctx)
    if env.source == consumerenv.BUILD_PYTHON and not ctx.runner.capabilities.host_paths:
        raise ConfigError(
            f"--proof-env build-python: the {ctx.runner.kind} runner makes the consumer "
            "environment where it builds, from the requirements; drop --proof-env or use "
            "--runner local"
        )
    if env.made():
        if env.source == consumerenv.BUILD_PYTHON:
            _build_python_meets(ctx, env)
        return env
    log_file = ctx.logs / "consumer-env.log"

    def make() -> None:
        started = time.monotonic()
        log.info(
            "import proof: making the consumer environment (what install.sh makes: %s) at %s, once",
            files.requirements_source(ws.root),
            env.root,
        )
        if env.root.exists():
            shutil.rmtree(env.root)
        env.root.parent.mkdir(parents=True, exist_ok=True)
        settings = pip_settings(ctx, log_file) if env.uv else pipconfig.UvSettings()
        try:
            for i, (argv, what) in enumerate(env.commands(settings)):
                if i == 1:
                    (env.root / consumerenv.REQUIREMENTS_FILE).write_text(env.requirements)
                _run(
                    ctx,
                    argv,
                    f"making {what}",
                    log_file,
                    cwd=env.root.parent,
                    writable=[env.root.parent, *_outside(env.links_from, env.root.parent)],
                    readonly=[Path(env.uv)] if env.uv else [],
                    add_env=settings.env,
                    network=True,
                )
        except BuildError as exc:
            source = files.requirements_source(ws.root)
            first, *tail = str(exc).splitlines()
            said = _tool_said(tail)
            raise ToolchainError(
                f"the consumer environment (what the release's install.sh makes from "
                f"{source}) could not be made: {first}{said}; fix {source} "
                f"(`kiln lock` pins it) or pass --no-import-proof"
            ) from None
        consumerenv.mark_made(env)
        log.info(
            "import proof: consumer environment made in %.1f s (%s; later builds reuse it)",
            time.monotonic() - started,
            env.root,
        )

    fsutil.made_once(env.root, env.made, make, "the consumer environment")
    if env.source == consumerenv.BUILD_PYTHON:
        _build_python_meets(ctx, env)
    return env


WARM_MARKER = ".kiln-warm"  # in the environment's pycache: torch's bytecode is there
# A command that yields its CPU to the compiles: nice, and (where the kernel groups each
# session's processes, as it does every step's: autogroups, which nice alone does not
# reach) its session's group made the least weighty; on idle CPUs it runs at once.
LEAST_PRIORITY = (
    "nice",
    "-n",
    "19",
    "sh",
    "-c",
    'echo 19 > /proc/self/autogroup 2>/dev/null; exec "$@"',
    "kiln-least-priority",
)


def warm(ctx: Context) -> threading.Thread | None:
    """The consumer environment made, and ``import torch``'s bytecode compiled into its
    pycache, in the background while the steps compile: the proofs then read it. Their
    first imports compiled it, each of a wheel's modules at once in a process of its own
    (two at 8 CPU-s each beside the compiles of a cold public build on 2 cores, where 1.6
    once warm), and on a many-core machine the proof is on the critical path. Once per
    environment; what fails here is left to the proof to say."""
    if not ctx.opts.import_proof or not ctx.ws.profile.torch:
        return None

    def run() -> None:
        try:
            env = environment(ctx)
            marker = env.pycache / WARM_MARKER
            if marker.exists() or "torch" not in env.distributions():
                return
            env.pycache.mkdir(parents=True, exist_ok=True)
            _run(
                ctx,
                [
                    *LEAST_PRIORITY,
                    str(env.python),
                    *("-I", "-X", f"pycache_prefix={env.pycache}", "-c", "import torch"),
                ],
                "compiling torch's bytecode for the import proofs",
                ctx.logs / "consumer-env.log",
                cwd=env.pycache,
                writable=[env.pycache],
                readonly=[env.root],
            )
            marker.write_text("")
        except (KilnError, OSError) as exc:
            log.debug("the consumer environment's warm-up: %s (the proof says it)", exc)

    thread = threading.Thread(target=run, name="proof-warm-up", daemon=True)
    thread.start()
    return thread


def _compiling(ctx: Context) -> bool:
    """Whether a compile of another step holds a slot of the run's gate now."""
    return bool(compile_gate.holders(ctx.gate))


def _build_python_meets(ctx: Context, env: ConsumerEnv) -> None:
    """``--proof-env build-python``: the build Python's distributions must meet what
    install.sh would install (name and version; the hashes are the index's, not checked
    here), else the proof would prove another environment than the release's."""
    source = files.requirements_source(ctx.ws.root)
    missing = consumerenv.unmet(env.requirements, env.distributions())
    if missing:
        raise ToolchainError(
            f"--proof-env build-python: the build Python {ctx.tc.python} does not meet "
            f"{source}: {'; '.join(missing)}; install them there, or drop --proof-env "
            "(the consumer environment made from the index)"
        )
    if env.key not in _SAID:  # checked for every proof, said once
        _SAID.add(env.key)
        log.info(
            "import proof: the consumer environment is the build Python's own distributions "
            "(--proof-env build-python; they meet %s)",
            source,
        )


_SAID: set[str] = set()


def _outside(path: Path, folder: Path) -> list[Path]:
    """``[path]`` where it is not under ``folder`` (a runner binds it on its own), else []."""
    return [] if path.is_relative_to(folder) else [path]


def _overlay(
    ctx: Context, env: ConsumerEnv, root: Path, log_file: Path, own: frozenset[str] = frozenset()
) -> tuple[Path, Path]:
    """A venv at ``root`` whose one site-packages holds ``env``'s distributions, as
    install.sh's venv holds them beside the wheels it installs: (python, site). Each entry
    of the environment's site-packages is linked in (the environment is made once and
    kept), so what a wheel reaches relative to itself there resolves as it will where it
    lands: a RUNPATH ``$ORIGIN/../nvidia/cu13/lib`` (with the environment on a ``.pth``,
    beside it, ``libcublas.so.13`` was not found, and the fix offered the same rpath).
    A folder the output installs into too (``own``: its top-level names, a namespace
    such as ``nvidia/``) is made here, its entries linked: nothing is written into the
    environment, which other proofs share."""
    _run(
        ctx,
        [str(env.python), "-m", "venv", "--without-pip", str(root)],
        "making the proof's venv",
        log_file,
        cwd=root.parent,
        writable=[root.parent],
        readonly=[env.root],
    )
    site = sorted((root / "lib").glob("python3*/site-packages"))[0]
    link_environment(site, env.site_packages(), own)
    return root / "bin" / "python", site


def link_environment(site: Path, environment: Path, own: frozenset[str] = frozenset()) -> None:
    """Each entry of the ``environment`` site-packages linked into ``site`` (its .pth
    files too: site reads them there); a folder of ``own`` made, its entries linked."""
    for entry in sorted(environment.iterdir()):
        if (site / entry.name).exists():
            continue
        if entry.name in own and entry.is_dir():
            (site / entry.name).mkdir()
            for inner in sorted(entry.iterdir()):
                (site / entry.name / inner.name).symlink_to(inner, inner.is_dir())
            continue
        (site / entry.name).symlink_to(entry, entry.is_dir())


def _extract_shared_objects(members: dict[str, bytes], dest: Path) -> dict[str, Path]:
    out = {}
    for rel, data in members.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        out[rel] = path
    return out


def land_wheel(ctx: Context, env: ConsumerEnv, wheel: Path, root: Path, log_file: Path) -> Landed:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        sos = {m: zf.read(m) for m in names if m.endswith(".so") or ".so." in m}
        info = [m for m in names if m.count("/") == 1 and m.split("/")[0].endswith(".dist-info")]
        meta = next((zf.read(m).decode() for m in info if m.endswith("/METADATA")), "")
        tops = next((zf.read(m).decode() for m in info if m.endswith("/top_level.txt")), None)
    own = frozenset(name.split("/")[0] for name in names)
    python, site = _overlay(ctx, env, root / "venv", log_file, own)
    # install.sh's own line (`pip install --no-deps --no-index WHEELS`), by the build
    # Python's pip: the environment has no pip of its own where it installs nothing else
    _run(
        ctx,
        [
            ctx.tc.python,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            *consumerenv.PIP_QUIET,
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        f"installing {wheel.name} as install.sh does",
        log_file,
        cwd=root,
        writable=[root],
        readonly=[wheel, env.root],
    )
    shared = _extract_shared_objects(sos, root / "objects")
    return Landed(
        python,
        shared,
        _needed(shared),
        imports.top_level(names, tops),
        imports.requires_dist(meta),
        (site, root / "objects"),
    )


def land_tree(
    ctx: Context, env: ConsumerEnv, tarball: Path, vendor: Vendor, root: Path, log_file: Path
) -> Landed:
    python, site = _overlay(ctx, env, root / "venv", log_file)
    target = root / "target"
    archive.unpack(tarball, target)
    tree = target / vendor.name
    # install.sh's own line: the tree on a .pth of the venv
    (site / f"kiln-{vendor.name}.pth").write_text(f"{tree}\n")
    shared = {
        str(p.relative_to(tree)): p
        for pattern in vendor.build.outputs
        for p in sorted(tree.glob(pattern))
        if p.is_file()
    }
    members = [str(p.relative_to(tree)) for p in tree.glob("*/__init__.py")]
    tops = sorted({m.split("/")[0] for m in members} & {r.split("/")[0] for r in shared})
    return Landed(python, shared, _needed(shared), tops, [], (tree, site))


def _needed(shared: dict[str, Path]) -> dict[str, list[str]]:
    return {rel: linkage(path)[0] for rel, path in shared.items()}


def _driver_here(ctx: Context) -> bool:
    """Whether a GPU driver answers where the build runs (asked of its Python)."""
    probe = (
        "import ctypes\ntry:\n ctypes.CDLL('libcuda.so.1')\nexcept OSError:\n raise SystemExit(3)"
    )
    res = ctx.runner.run(
        Command(
            [ctx.tc.python, "-c", probe],
            ctx.opts.work,
            ctx.runner.base_env(),
            "looking for a GPU driver",
            check=False,
        )
    )
    return res.returncode == 0


def _fail(
    ctx: Context,
    vendor: str,
    headline: str,
    cause: Cause,
    details: list[str],
    log_file: Path,
    unit: str | None = None,
) -> ImportFailed:
    """The error for people (one screen), and the failure record the summary and the
    timings report read."""
    lines = [f"{vendor}: {headline}", *(f"    {d}" for d in details if d)]
    lines += [f"  cause: {cause.cause}", f"  fix: {cause.fix}", f"  full log: {log_file}"]
    record = FailureRecord(
        vendor=vendor,
        unit=unit,
        errors=[ErrorEntry(text=d) for d in details if d][:5],
        cause=CauseEntry(row=cause.row, cause=cause.cause, fix=cause.fix, edit=cause.edit),
        log=str(log_file),
    )
    path = failure_record.record_path(ctx.logs, vendor)
    fsutil.write_atomic(path, json.dumps(record, indent=1, sort_keys=True))
    return ImportFailed("\n".join(lines), record=record)  # the summary table reads it


def _check_requirements(
    ctx: Context, vendor: str, landed: Landed, versions: dict[str, str], log_file: Path
) -> None:
    unmet = imports.unmet_requirements(landed.requires, versions)
    if unmet:
        raise requirements_refused(ctx, vendor, unmet, log_file)


def requirements_refused(
    ctx: Context,
    vendor: str,
    unmet: list[tuple[Requirement, str | None]],
    log_file: Path,
    before_compile: bool = False,
) -> ImportFailed:
    """The wheel requires what the consumer environment does not hold: the screen, with
    the lines that make install.sh install it (``before_compile``: read from the tree's
    metadata, so no compile has run)."""
    problems = [
        f"{req} (not installed)"
        if have is None
        else f"{req} (the environment has {req.name} {have})"
        for req, have in unmet
    ]
    source = files.requirements_source(ctx.ws.root)
    pin = ctx.ws.profile.torch_pin
    others = [imports.requirement_line(req) for req, _ in unmet if req.name.lower() != "torch"]
    torch_unmet = len(others) < len(unmet)
    fixes = []
    if pin and torch_unmet:
        fixes.append(
            f"pin {pin} in runtime-requirements.txt and run `kiln lock` (or set the profile's "
            "torch to the version the environment has, and rebuild)"
        )
    if others:
        lines = ", ".join(f"`{line}`" for line in others)
        where = (
            f"add the line{'s' if len(others) > 1 else ''} {lines} to {files.REQUIREMENTS}"
            if (ctx.ws.root / files.REQUIREMENTS).is_file()
            else f"write {files.REQUIREMENTS} in {ctx.ws.root} with the line"
            f"{'s' if len(others) > 1 else ''} {lines}"
        )
        keep = f" (kiln keeps the profile's {pin} beside them)" if pin else ""
        fixes.append(f"{where}{keep}, then run `kiln lock`, so install.sh installs them")
    headline = (
        "the wheel's metadata (read before any compile) requires what the consumer "
        f"environment ({source}) does not hold:"
        if before_compile
        else f"the consumer environment ({source}) cannot hold the output: it requires"
    )
    # mechanical where no lock must be made again: the lines appended (kiln build --fix)
    lines_edit: FixEdit | None = (
        {"file": files.REQUIREMENTS, "append_lines": list(others)}
        if others and not torch_unmet and not (ctx.ws.root / "runtime-requirements.lock").is_file()
        else None
    )
    return _fail(
        ctx,
        vendor,
        headline,
        Cause(
            "requirements-unmet",
            f"install.sh installs {source} and then the wheels with --no-deps: the wheel's "
            f"requirements are not met there, so it would load against something else"
            + (
                "; refused before compiling, since the build cannot change it"
                if before_compile
                else ""
            ),
            "; ".join(fixes),
            edit=lines_edit,
        ),
        problems,
        log_file,
    )


def _judge(
    ctx: Context,
    vendor: Vendor,
    planned: list[imports.PlannedModule],
    results: dict[str, import_child.Imported],
    landed: Landed,
    env: ConsumerEnv,
    versions: dict[str, str],
    log_file: Path,
) -> list[ImportedModule]:
    sites = [str(site) for site in env.site_dirs()]
    done: list[ImportedModule] = []
    for mod in planned:
        if mod.skip is not None:
            done.append(_imported(mod, "skipped", reason=mod.skip))
            continue
        res = results[mod.name]
        with log_file.open("a") as fh:
            fh.write(f"\n$ import {mod.name} (after {', '.join(mod.preload) or 'nothing'})\n")
            fh.write(res["output"] + f"\n(exit code {res['returncode']}, {res['seconds']} s)\n")
        if res["returncode"] == 0:
            _check_torch(ctx, vendor.name, mod.name, res.get("facts") or {}, sites, log_file)
            done.append(_imported(mod, "ok", seconds=res["seconds"]))
            continue
        raise _explain(ctx, vendor, mod, res, landed, env, versions, log_file)
    return done


def _imported(mod: imports.PlannedModule, status: str, **extra: Any) -> ImportedModule:
    """A planned module's line in the manifest."""
    return ImportedModule.model_validate(
        {
            "module": mod.name,
            "kind": mod.kind,
            "shared_object": mod.shared_object,
            "status": status,
            **extra,
        }
    )


def _check_torch(
    ctx: Context,
    vendor: str,
    module: str,
    facts: import_child.ImportFacts,
    sites: list[str],
    log_file: Path,
) -> None:
    """The torch an import loaded is the environment's, of the profile's version."""
    torch = facts.get("torch") or {}
    cause = imports.another_torch(
        str(torch.get("version") or ""), str(torch.get("file") or ""), ctx.ws.profile.torch, sites
    )
    if cause is None:
        return
    raise _fail(
        ctx,
        vendor,
        f"importing {module} loaded another torch than the release's:",
        cause,
        [f"torch {torch.get('version')} from {torch.get('file')}"],
        log_file,
        unit=module,
    )


def _explain(
    ctx: Context,
    vendor: Vendor,
    mod: imports.PlannedModule,
    res: import_child.Imported,
    landed: Landed,
    env: ConsumerEnv,
    versions: dict[str, str],
    log_file: Path,
) -> ImportFailed:
    read = imports.read_failure(mod.name, res["output"], bool(res["timed_out"]), landed.roots)
    so = mod.shared_object
    if read.symbol_file:
        so = next(
            (rel for rel, p in landed.shared_objects.items() if read.symbol_file.endswith(rel)),
            so,
        )
    tree = ctx.opts.work / ctx.ws.release.name / vendor.name
    compiled = {
        str(s["source"])
        for s in jobs.job_stats(ctx.logs / f"{vendor.name}.jobs")
        if s.get("source")
    }
    facts = loadfacts.gather(
        vendor.name,
        read,
        so,
        landed.needed.get(so or "", []),
        env.libraries(),
        versions,
        landed.shared_objects,
        tree if tree.is_dir() else None,
        compiled,
        ctx.ws.profile.torch_pin,
    )
    cause = table.explain_load(facts)
    shown = [read.last_line]
    if facts.demangled and facts.demangled != facts.symbol:
        shown.append(f"the symbol: {facts.demangled} (undefined in {so})")
    if facts.definers:
        shown.append(f"defined in: {', '.join(facts.definers)}")
    return _fail(
        ctx,
        vendor.name,
        f"{mod.name} does not import where the release lands (its consumer environment):",
        cause,
        shown,
        log_file,
        unit=so or mod.name,
    )


def _closure(
    ctx: Context,
    vendor: Vendor,
    landed: Landed,
    env: ConsumerEnv,
    versions: dict[str, str],
    platform: str,
    log_file: Path,
) -> dict[str, str]:
    result = imports.closure(
        landed.needed,
        [Path(rel).name for rel in landed.shared_objects],
        env.libraries(),
        versions,
        imports.system_libraries(platform),
        {r.soname: r.package for r in vendor.build.runtime_libraries},
    )
    if result.missing:
        so, name = result.missing[0]
        facts = LoadFailure(
            vendor=vendor.name,
            module=so,
            shared_object=so,
            message=f"NEEDED {name}",
            library=name,
        )
        raise _fail(
            ctx,
            vendor.name,
            f"{so} needs {name}, and nothing provides it where the release lands:",
            table.explain_load(facts),
            [f"{s}: NEEDED {n}" for s, n in result.missing],
            log_file,
            unit=so,
        )
    return result.provided


def prove(ctx: Context, vendor: Vendor, output: Path, kind: str) -> ImportProof:
    """Install ``output`` (a wheel, or an in-place tarball) as install.sh does and import
    it; raises :class:`ImportFailed` (one screen) when it does not load."""
    started_env = time.monotonic()
    env = environment(ctx)
    env_s = time.monotonic() - started_env
    started = time.monotonic()
    log_file = ctx.logs / f"{vendor.name}-import.log"
    log_file.write_text(f"# kiln import proof of {output.name} in {env.root}\n")
    ctx.display.update(vendor.name, "proving", f"importing {output.name}")
    scratch = ctx.opts.work / ".kiln-proof"
    scratch.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{vendor.name}-", dir=scratch))
    try:
        if kind == "wheel":
            landed = land_wheel(ctx, env, output, root, log_file)
            platform = output.name.removesuffix(".whl").rsplit("-", 1)[-1]
            declared: list[str] = []
        else:
            landed = land_tree(ctx, env, output, vendor, root, log_file)
            platform = ctx.ws.profile.platform
            declared = [vendor.build.import_check] if vendor.build.import_check else []
        versions = env.distributions()
        _check_requirements(ctx, vendor.name, landed, versions, log_file)
        provided = _closure(ctx, vendor, landed, env, versions, platform, log_file)
        driver = _driver_here(ctx)
        planned = imports.plan_modules(
            landed.shared_objects,
            landed.needed,
            landed.packages,
            declared,
            vendor.build.import_proof,
            driver,
        )
        todo = [m for m in planned if m.skip is None]
        spec_file = root / "spec.json"
        out_file = root / "results.json"
        spec = import_child.ProveSpec(
            # while other steps compile, the first module alone compiles the bytecode the
            # others read (a package's two modules each compiled torch._dynamo's: 9.4
            # CPU-s each beside the compiles on 2 cores); at the end, all at once (wall)
            first_alone=_compiling(ctx),
            python=str(landed.python),
            modules=[import_child.ModuleSpec(name=m.name, preload=list(m.preload)) for m in todo],
            timeout_s=vendor.build.import_proof.timeout_s,
            cuda_home=ctx.tc.cuda_home,
            work=str(root / "work"),
            out=str(out_file),
            jobs=ctx.budget.cpus,
            pycache=str(env.pycache),
        )
        env.pycache.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(json.dumps(spec))
        found = import_child.Proved(driver="found" if driver else "none", modules=[])
        if todo:
            _run(
                ctx,
                [ctx.tc.python, "-m", "kiln.inside", "prove", str(spec_file)],
                f"importing {vendor.name}'s modules",
                log_file,
                kiln=True,
                cwd=root,
                writable=[root, env.pycache],
                readonly=[env.root],
            )
            # the child's results, as import_child.run made them
            found = cast(import_child.Proved, json.loads(out_file.read_text()))
        results = {r["name"]: r for r in found["modules"]}
        modules = _judge(ctx, vendor, planned, results, landed, env, versions, log_file)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds = round(time.monotonic() - started, 2)
    loaded = next(
        (
            torch.get("version")
            for r in found["modules"]
            if (torch := (r["facts"] or {}).get("torch"))
        ),
        None,
    )
    proof = ImportProof(
        environment=env.key,
        environment_from="build-python" if env.source == consumerenv.BUILD_PYTHON else None,
        requirements=files.requirements_source(ctx.ws.root),
        python=ctx.ws.profile.python,
        torch=loaded,
        driver=found["driver"],
        seconds=seconds,
        modules=modules,
        needed=provided,
    )
    ok = [m.module for m in modules if m.status == "ok"]
    skipped = [m.module for m in modules if m.status == "skipped"]
    log.info(
        "%s: import proof: %s imported in %.1f s%s%s (libcuda: %s)",
        vendor.name,
        ", ".join(ok) or "nothing",
        seconds,
        f"; skipped {', '.join(skipped)}" if skipped else "",
        f" (the environment took {env_s:.1f} s)" if env_s > 1.0 else "",
        found["driver"],
    )
    return proof


def summary(proofs: list[ImportProof]) -> str:
    """The summary table's cell: what imported and in how long."""
    if not proofs:
        return ""
    ok = sum(1 for p in proofs for m in p.modules if m.status == "ok")
    skipped = sum(1 for p in proofs for m in p.modules if m.status == "skipped")
    seconds = sum(p.seconds or 0.0 for p in proofs)
    return f"{ok} imported" + (f", {skipped} skipped" if skipped else "") + f" ({seconds:.1f} s)"


def stale(outputs: list[Output], ctx: Context) -> bool:
    """Whether a reused entry's proof was made in another consumer environment (or
    none): then it is proven again."""
    env_key = planned_environment(ctx).key
    return any(
        o.import_proof is None or o.import_proof.environment != env_key
        for o in outputs
        if o.kind in ("wheel", "tarball")
    )
