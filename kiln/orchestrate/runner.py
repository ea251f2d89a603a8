"""Which runner a build's steps run through: local, or a builder container (``--runner``)."""

from __future__ import annotations

from pathlib import Path

from kiln.config.workspace import Workspace
from kiln.errors import ConfigError
from kiln.orchestrate.options import Options
from kiln.runners import docker as docker_runner
from kiln.runners import isolation
from kiln.runners.local import LocalRunner
from kiln.runners.protocol import Runner


def make_runner(ws: Workspace, opts: Options, logs: Path, dry: bool = False) -> Runner:
    """``auto``: docker when the profile (or ``--image``) names an image and a daemon
    answers, else local. ``dry``: a runner that provisions nothing and writes nothing
    (``kiln build --dry-run``)."""
    image = opts.image or ws.profile.image
    choice = opts.runner
    if choice == "auto":
        choice = "docker" if image and docker_runner.daemon_answers() else "local"
    if choice == "local":
        if not isolation.isolates():  # a guard that cannot do its job stops, unless told
            if not opts.allow_network:
                raise ConfigError(isolation.refusal())
            isolation.allowed_network()
        pypi = ws.profile.cuda if opts.toolchain == "pypi" else None
        return LocalRunner(opts.python, opts.cuda_home, opts.cache, logs, pypi, dry=dry)
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
        keep_failed=opts.keep_container,
        dry=dry,
    )


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
