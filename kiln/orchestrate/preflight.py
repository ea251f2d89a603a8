"""Everything checkable before any fetch or compile, every problem at once: patches, build
kinds, CUDA, the recipes' system files, sources, then (only when all that passed, as it
may provision a build venv and the pip CUDA) the build Python and its torch, and the
system headers NVIDIA's pip wheels may provide. A wrong machine fails in seconds, not an
hour into a compile. ``check(dry=True)`` (``kiln build --dry-run``) stops where the build
would provision, listing what it would make and naming what only that can tell."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.config.models import SystemRequirement, Vendor
from kiln.config.workspace import Workspace
from kiln.errors import KilnError, PatchError, PreflightError, SourceError, ToolchainError
from kiln.orchestrate.kinds import KINDS
from kiln.release import files
from kiln.runners.protocol import Runner
from kiln.sources import checkout, patches
from kiln.toolchain import checks
from kiln.toolchain.provision import Provision
from kiln.verify import imports


def offline_advice(ws: Workspace) -> str:
    image = ws.profile.image or "the profile's builder image"
    return (
        f"To build offline: on a machine with network run `kiln lock` and copy its "
        f"cache (--cache, default ~/.cache/kiln) here (or mirror each upstream and pass "
        f"--mirrors FILE --offline), put the series' patches under patches/, and run inside "
        f"{image} (or pass --cuda-home with CUDA {ws.profile.cuda} and --python with "
        f"Python {ws.profile.python}"
        + (f" + torch {ws.profile.torch})." if ws.profile.torch else ").")
    )


# The headers NVIDIA's pip wheels may provide: the first part of a header's path (its
# folder, or its name) starting with one of these, in any case. They are what torch's
# ``nvidia/*/include`` folders hold (the CUDA runtime and its libraries: cuda*.h, cublas*,
# cusparse*, cufft*, curand*, cusolver*, cupti*, cufile.h, nvrtc.h, nvJitLink.h, nvtx3/;
# cuDNN, NCCL, NVSHMEM) and the CUDA home (crt/, and its CCCL: cuda/, cub/, thrust/, nv/),
# folders the build compiles with that only exist once the toolchain is provisioned (the
# build venv; --toolchain pypi's CUDA home). The one list: a ``build.system`` header
# named here that the system lacks is checked again after provisioning, with those
# folders; every other need is the system's alone, checked before anything is
# provisioned or fetched. (Generic names of the CUDA runtime's folder,
# vector_types.h and the like, are reached through cuda_runtime.h: name that one.)
PIP_CUDA_HEADERS = (
    "cuda",
    "cub",
    "cucomplex",
    "cudnn",
    "cufft",
    "cufile",
    "cupti",
    "curand",
    "cusolver",
    "cusparse",
    "cutensor",
    "thrust",
    "nv",
    "nccl",
    "crt",
    "cooperative_groups",
)

Need = tuple[str, int]  # (vendor, index in its build.system)


def pip_cuda_may_provide(req: SystemRequirement) -> bool:
    """Whether NVIDIA's pip wheels may provide ``req`` (a header of
    :data:`PIP_CUDA_HEADERS`). Never a library: the linker check looks only where the
    system's linker does, before provisioning as after."""
    if req.header is None:
        return False
    return req.header.split("/", 1)[0].lower().startswith(PIP_CUDA_HEADERS)


def system_needs(selected: list[Vendor]) -> dict[Need, SystemRequirement]:
    return {(v.name, i): r for v in selected for i, r in enumerate(v.build.system)}


def missing_system(
    asked: dict[Need, SystemRequirement], runner: Runner, include_dirs: list[str]
) -> dict[Need, SystemRequirement]:
    """Those of ``asked`` missing where builds run, with ``include_dirs`` added to the
    compiler's include path."""
    if not asked:
        return {}
    missing = runner.missing_system(
        [r.model_dump(exclude_none=True) for r in asked.values()], include_dirs
    )
    return {k: r for k, r in asked.items() if r.model_dump(exclude_none=True) in missing}


def system_problems(missing: dict[Need, SystemRequirement], runner: Runner) -> list[str]:
    """One line per missing ``build.system`` file (a header, a library), with the package
    that provides it."""
    where = runner.capabilities.where
    return [
        f"vendors/{name}.toml: build.system.{i}: {req.what} not found {where}: "
        f"install it (apt-get install {req.package})"
        for (name, i), req in missing.items()
    ]


def cuda_include_dirs(tc: checks.Toolchain) -> list[str]:
    """The CUDA include folders a build compiles with, in their order: the CUDA home's
    (torch's CUDA extensions pass it with -I; --toolchain pypi provisions it), then its
    CCCL and the pip CUDA's (pipcuda.environment)."""
    offered = tc.pip_cuda
    cccl = offered.get("cccl") if offered else None
    pip = [*([cccl] if cccl else []), *(offered.get("include_dirs", []) if offered else [])]
    return [f"{tc.cuda_home}/include", *pip]


@dataclass
class Report:
    """What preflight found: the problems (the build's own words), the toolchain when
    every check passed, the warnings (edited patches); for a dry run, what a build would
    provision first and what only that provisioning can tell."""

    problems: list[str] = field(default_factory=list)
    offline: bool = False  # whether the advice on building offline applies
    tc: checks.Toolchain | None = None
    warnings: list[str] = field(default_factory=list)
    provision: list[Provision] = field(default_factory=list)  # made or not (dry run)
    unchecked: list[str] = field(default_factory=list)
    # problems of the sources alone (a pinned commit its mirror lacks): nothing about the
    # machine, so where they are all there is, the error is theirs (exit code 3)
    source_problems: list[str] = field(default_factory=list)

    def error(self, ws: Workspace) -> KilnError | None:
        """The error the build raises for these problems (None: none)."""
        if not self.problems:
            return None
        if self.problems == self.source_problems:
            return SourceError("\n".join(self.problems))
        n = len(self.problems)
        return PreflightError(
            f"cannot build {ws.release.name} here ({n} problem{'s' if n > 1 else ''}):",
            self.problems,
            offline_advice(ws) if self.offline else "",
        )


def preflight(
    ws: Workspace,
    selected: list[Vendor],
    runner: Runner | None,
    cache: checkout.GitCache,
    runner_problem: str | None = None,
) -> tuple[checks.Toolchain, list[str]]:
    """The toolchain where builds run and the warnings (edited patches); raises
    :class:`PreflightError` listing every problem found."""
    report = check(ws, selected, runner, cache, runner_problem)
    error = report.error(ws)
    if error is not None:
        raise error
    assert report.tc is not None
    return report.tc, report.warnings


def check(
    ws: Workspace,
    selected: list[Vendor],
    runner: Runner | None,
    cache: checkout.GitCache,
    runner_problem: str | None = None,
    dry: bool = False,
) -> Report:
    """Every check, in the build's order. ``dry`` (``kiln build --dry-run``, with a
    runner made for it): nothing is provisioned; what the runner would provision is
    listed, and the checks that need it are named as unchecked instead of passed."""
    r = Report()
    entries = [p for v in selected for p in ws.patches_for(v.name)]
    for entry in entries:
        try:
            patches.require_present([entry], ws.patches_dir, ws.source_patches_dir)
        except PatchError as exc:
            r.problems.append(str(exc))
            r.offline = True
    for vendor in selected:
        if vendor.build.kind not in KINDS:
            r.problems.append(
                f"vendors/{vendor.name}.toml: build.kind {vendor.build.kind!r} is not "
                f"supported by this kiln (it knows {', '.join(KINDS)})"
            )
    # install.sh's torch against the wheels' (before an hour of compiles, not after)
    pinned = imports.pinned_torch_problem(
        files.requirements(ws.root, ws.profile.torch),
        files.requirements_source(ws.root),
        ws.profile.torch,
    )
    if pinned:
        r.problems.append(pinned)
    deferred: dict[Need, SystemRequirement] = {}
    if dry and runner is not None:
        try:
            r.provision = runner.provisions(ws.profile)
        except KilnError:  # (no CUDA lock for --toolchain pypi) nvcc's check says it below
            r.provision = []
    pending = [p for p in r.provision if not p.made]
    blocked = [p for p in pending if p.before_checks]
    if runner is None:
        r.problems.append(runner_problem or "no runner")
    elif blocked:
        r.unchecked.append(
            f"nvcc (CUDA {ws.profile.cuda}) and the recipes' system files (build.system) "
            f"in {blocked[0].what}: checked once it is made"
        )
    else:
        try:
            runner.nvcc(ws.profile)
        except ToolchainError as exc:
            r.problems.append(str(exc))
            r.offline = True
        # The recipes' system files before anything is provisioned or fetched: a missing
        # -dev package is known in seconds, not after a 5 GB build venv. Only a header
        # NVIDIA's pip wheels may provide waits for their folders (after provisioning).
        try:
            missing = missing_system(system_needs(selected), runner, [])
        except KilnError as exc:  # where builds run cannot be asked: one more problem
            missing = {}
            r.problems.append(str(exc))
        deferred = {k: q for k, q in missing.items() if pip_cuda_may_provide(q)}
        r.problems += system_problems(
            {k: q for k, q in missing.items() if k not in deferred}, runner
        )
    for vendor in selected:
        problem = checkout.availability(cache, vendor.source.url, vendor.source.commit, vendor.name)
        if problem:
            r.problems.append(str(problem))
            if problem.reachable:  # its source answers without it: the pin or the mirror
                r.source_problems.append(str(problem))
            else:
                r.offline = True
    if r.problems or runner is None:
        return r
    if pending:
        p = ws.profile
        r.unchecked.append(
            f"the build Python (Python {p.python}"
            + (f", torch {p.torch}" if p.torch else "")
            + ") and the toolchain's facts: checked once provisioned"
        )
        r.unchecked += [
            f"vendors/{name}.toml: build.system.{i}: {q.what}: not on the system; NVIDIA's "
            f"pip wheels may provide it: checked once provisioned"
            for (name, i), q in deferred.items()
        ]
        return r
    tc = runner.toolchain(ws.profile)
    wrong = checks.problems(tc, ws.profile)
    r.offline = r.offline or bool(wrong)
    still = missing_system(deferred, runner, cuda_include_dirs(tc))
    r.problems += wrong + system_problems(still, runner)
    if not r.problems:
        r.tc = tc
        r.warnings = patches.hash_report(entries, ws.patches_dir)
    return r
