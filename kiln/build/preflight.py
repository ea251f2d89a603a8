"""Everything checkable before any fetch or compile, every problem at once: patches, build
kinds, CUDA, sources, the build Python and its torch, the recipes' system files. A wrong
machine fails in seconds, not an hour into a compile."""

from __future__ import annotations

from kiln.build.kinds import KINDS
from kiln.config.models import Vendor
from kiln.config.workspace import Workspace
from kiln.errors import PatchError, PreflightError, ToolchainError
from kiln.runners.protocol import Runner
from kiln.sources import checkout as sources
from kiln.sources import patches
from kiln.toolchain import checks as toolchain


def offline_advice(ws: Workspace) -> str:
    image = ws.profile.image or "the profile's builder image"
    return (
        f"To build offline: on a machine with network run `kiln lock` and copy its "
        f".kiln-cache/ here (or mirror each upstream and pass --mirrors FILE --offline), put "
        f"the series' patches under patches/, and run inside {image} (or pass --cuda-home "
        f"with CUDA {ws.profile.cuda} and --python with Python {ws.profile.python}"
        + (f" + torch {ws.profile.torch})." if ws.profile.torch else ").")
    )


def system_problems(selected: list[Vendor], runner: Runner, tc: toolchain.Toolchain) -> list[str]:
    """The recipes' ``build.system`` files (a header, a library) that are missing where
    builds run, each with the package that provides it."""
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


def preflight(
    ws: Workspace,
    selected: list[Vendor],
    runner: Runner | None,
    cache: sources.GitCache,
    runner_problem: str | None = None,
) -> tuple[toolchain.Toolchain, list[str]]:
    """The toolchain where builds run and the warnings (edited patches); raises
    :class:`PreflightError` listing every problem found."""
    found: list[str] = []
    offline = False  # whether the advice on building offline applies
    entries = [p for v in selected for p in ws.patches_for(v.name)]
    for entry in entries:
        try:
            patches.require_present([entry], ws.patches_dir, ws.source_patches_dir)
        except PatchError as exc:
            found.append(str(exc))
            offline = True
    for vendor in selected:
        if vendor.build.kind not in KINDS:
            found.append(
                f"vendors/{vendor.name}.toml: build.kind {vendor.build.kind!r} is not "
                f"supported by this kiln (it knows {', '.join(KINDS)})"
            )
    if runner is None:
        found.append(runner_problem or "no runner")
    else:
        try:
            runner.nvcc(ws.profile)
        except ToolchainError as exc:
            found.append(str(exc))
            offline = True
    for vendor in selected:
        problem = sources.availability(cache, vendor.source.url, vendor.source.commit, vendor.name)
        if problem:
            found.append(problem)
            offline = True
    if not found and runner is not None:
        tc = runner.toolchain(ws.profile)
        wrong = toolchain.problems(tc, ws.profile)
        offline = offline or bool(wrong)
        found += wrong + system_problems(selected, runner, tc)
    if found:
        raise PreflightError(
            f"cannot build {ws.release.name} here ({len(found)} "
            f"problem{'s' if len(found) > 1 else ''}):",
            found,
            offline_advice(ws) if offline else "",
        )
    return tc, patches.hash_report(entries, ws.patches_dir)
