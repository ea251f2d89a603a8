"""Which runner a build's steps run through (``--runner``): the request made from the
options and the profile, the runner found in :mod:`kiln.runners.registry`."""

from __future__ import annotations

from pathlib import Path

from kiln.config.workspace import Workspace
from kiln.errors import ConfigError
from kiln.orchestrate.options import Options
from kiln.runners import registry
from kiln.runners.protocol import Runner, RunnerRequest


def request(ws: Workspace, opts: Options, logs: Path, dry: bool = False) -> RunnerRequest:
    p = ws.profile
    return RunnerRequest(
        image=opts.image or p.image,
        python=opts.python,
        cuda_home=opts.cuda_home,
        cache=opts.cache,
        logs=logs,
        pypi_cuda=p.cuda if opts.toolchain == "pypi" else None,
        dry=dry,
        allow_network=opts.allow_network,
        allow_unpinned_image=opts.allow_unpinned_image,
        docker_dir=opts.docker_dir or ws.root / "docker",
        build_args={
            "PYTHON_VERSION": p.python,
            "CUDA_VERSION": p.cuda,
            "TORCH_VERSION": p.torch or "",
        },
        mounts=tuple(opts.docker_mounts),
        keep_container=opts.keep_container,
    )


def make_runner(ws: Workspace, opts: Options, logs: Path, dry: bool = False) -> Runner:
    """``auto``: the first runner of the registry available (Docker where an image is
    named and a daemon answers), else local. ``dry``: a runner that provisions nothing
    and writes nothing (``kiln build --dry-run``)."""
    return registry.make(opts.runner, request(ws, opts, logs, dry))


def runner_or_problem(
    ws: Workspace, opts: Options, logs: Path, dry: bool = False
) -> tuple[Runner | None, str | None]:
    """The build's runner; or, where ``--runner auto`` could make none, None and why
    (preflight lists it with every other problem at once). A runner asked for by name
    that cannot be made raises (the build's refusal, and the dry run's)."""
    try:
        return make_runner(ws, opts, logs, dry=dry), None
    except ConfigError as exc:
        if opts.runner != "auto":
            raise
        return None, str(exc)
