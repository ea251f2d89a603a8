"""Where build steps run: the runner protocol. The host does what needs the network
(fetch, lock); every command of a build (the toolchain probe, ``python -m kiln.inside
step``, the import check) goes through a runner: the local runner runs it here (inside
the builder image on a pod, or on a workstation with the profile's toolchain), the
Docker runner in a container of the builder image. Both run the same commands, so a
test of one is a test of the other."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import kiln
from kiln.config.models import Profile
from kiln.inside import proc
from kiln.inside.facts import Facts
from kiln.toolchain.checks import Toolchain
from kiln.toolchain.provision import Provision

# The folder that holds the kiln package: put on PYTHONPATH for `python -m kiln.inside step`
# (build Pythons, provisioned or in an image, do not have kiln installed).
KILN_SRC = Path(kiln.__file__).resolve().parent.parent


@dataclass(frozen=True)
class Command:
    """One command of a build, for whichever runner runs it: ``writable`` folders are the
    only ones it may change, ``mem_gib`` its memory limit, ``echo`` streams its output to
    the console as well as to ``log_file``, ``check`` makes a non-zero exit an error;
    ``readonly`` files and folders are shown to it at their own paths, and ``network``
    lets it reach other machines (a shared compiler cache, build servers), which a step
    otherwise cannot."""

    argv: Sequence[str | os.PathLike[str]]
    cwd: Path
    env: dict[str, str]
    what: str
    log_file: Path | None = None
    writable: Sequence[Path] = ()
    check: bool = True
    mem_gib: float | None = None
    echo: bool = False
    readonly: Sequence[Path] = ()
    network: bool = False


@dataclass(frozen=True)
class Capabilities:
    """What a runner can do and where its steps live: what the build asks instead of
    the runner's name (``kiln.runners.registry`` is the one place names are told apart)."""

    kind: str  # its name, as --runner and the manifest's runner.kind say it
    isolates_network: bool  # its steps cannot reach the network
    memory_limit: bool  # each step under a memory limit of its own (an OOM kill named)
    gpu: bool  # its steps see this machine's GPUs
    # where paths live: the build venv and toolchain at this machine's paths, which kiln
    # reads itself (False: inside an image, reached only through commands)
    host_paths: bool
    where: str  # where its steps run, in a sentence: "on this machine"
    programs_from: str  # where a step's programs come from: "this machine's PATH"
    install_in: str  # where a missing program's apt-get goes ("" or " in the image's ...")
    records_image: bool  # its manifest records the image a rebuild runs in again


@dataclass(frozen=True)
class RunnerRequest:
    """What a build asks of its runner, whichever it is (made from the options and the
    profile by ``kiln.orchestrate.runner``; each runner takes what it needs)."""

    image: str | None  # the profile's or --image
    python: str | None
    cuda_home: str | None
    cache: Path
    logs: Path
    pypi_cuda: str | None  # the profile's CUDA from NVIDIA's PyPI wheels (--toolchain pypi)
    dry: bool
    allow_network: bool
    allow_unpinned_image: bool
    docker_dir: Path
    build_args: dict[str, str]
    mounts: tuple[str, ...]
    keep_container: bool


class Runner(Protocol):
    # read-only, so a runner whose image is always set (Docker's) is one too
    @property
    def kind(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def image(self) -> str | None:
        """The base image, by digest, or ``unpinned:<ref>``."""
        ...

    @property
    def builder(self) -> str | None:
        """The image id the steps ran in."""
        ...

    def nvcc(self, profile: Profile) -> str:
        """nvcc's version where builds run; raises ToolchainError (checked first, cheaply)."""
        ...

    def provisions(self, profile: Profile) -> list[Provision]:
        """What :meth:`toolchain` provisions first (a build venv, the pip CUDA, the
        builder image), each made or not: read only, for ``kiln build --dry-run``."""
        ...

    def toolchain(self, profile: Profile) -> Toolchain:
        """The toolchain's facts, provisioning what :meth:`provisions` lists (a runner
        made for a dry run never provisions: it is asked only once all is made)."""
        ...

    def base_env(self) -> dict[str, str]: ...

    def missing_system(
        self, requirements: list[dict[str, str]], include_dirs: list[str]
    ) -> list[dict[str, str]]:
        """Which of the recipes' ``build.system`` files are missing where builds run.
        Needs nothing provisioned (preflight asks before :meth:`toolchain`, with no
        ``include_dirs``, and again after it for headers the pip CUDA may provide)."""
        ...

    def cancel(self) -> None:
        """Stop every command this runner runs now (Ctrl-C while steps run in threads)."""
        ...

    def run(self, cmd: Command) -> proc.Result:
        """Run ``cmd`` where builds run."""
        ...


def step_env(env: dict[str, str]) -> dict[str, str]:
    """The build's environment plus what `python -m kiln.inside step` needs to import kiln."""
    return {**env, "PYTHONPATH": str(KILN_SRC), "PYTHONDONTWRITEBYTECODE": "1"}


def probe_command(python: str, cuda_home: str, system: str | None = None) -> list[str]:
    cmd = [python, "-m", "kiln.inside", "probe", "--python", python, "--cuda-home", cuda_home]
    return [*cmd, "--system", system] if system else cmd


def parse_probe(output: str) -> Facts:
    """The probe's last line (``python -m kiln.inside probe``: kiln.inside.facts.probe)."""
    facts: Facts = json.loads(output.strip().splitlines()[-1])
    return facts
