"""The local runner: every command of a build runs on this machine (inside the builder
image on a pod, or with the profile's toolchain), in a memory cgroup of its own and,
unless it asks for the network, a network namespace of its own (runners/isolation.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from kiln.config.models import Profile
from kiln.errors import BuildError, ConfigError
from kiln.inside import facts, proc
from kiln.runners import isolation, memlimit
from kiln.runners.protocol import Capabilities, Command, RunnerRequest
from kiln.toolchain import buildenv, cudapypi
from kiln.toolchain.checks import Toolchain, check_cuda
from kiln.toolchain.provision import Provision


class LocalRunner:
    kind = "local"
    image: str | None = None
    builder: str | None = None

    @property
    def capabilities(self) -> Capabilities:
        return capabilities()

    def __init__(
        self,
        python: str | None,
        cuda_home: str | None,
        cache: Path,
        log_dir: Path,
        pypi_cuda: str | None = None,
        dry: bool = False,
    ) -> None:
        """``pypi_cuda``: use that CUDA from NVIDIA's hash-pinned PyPI wheels (installed
        only once every other check passed, by :meth:`toolchain`). ``dry``: for a dry
        run, which writes nothing (no provisioning, no facts kept in the cache)."""
        self._python, self._cache, self._log_dir = python, cache, log_dir
        self.pypi_cuda = pypi_cuda
        self.dry = dry
        self.cuda_home = facts.find_cuda_home(cuda_home)

    def nvcc(self, profile: Profile) -> str:
        if self.pypi_cuda:  # the lock says which nvcc it pins: no install needed to check
            version = cudapypi.nvcc_version(self.pypi_cuda)
            where = f"kiln's hash-pinned CUDA {self.pypi_cuda} lock"
        else:
            version = facts.nvcc_version(self.cuda_home)
            where = str(self.cuda_home)
        check_cuda(version, where, profile)
        return version

    def provisions(self, profile: Profile) -> list[Provision]:
        cuda = cudapypi.planned(self.pypi_cuda, self._cache) if self.pypi_cuda else None
        venv = buildenv.planned(profile, self._cache, self._python)
        return [p for p in (cuda, venv) if p is not None]

    def toolchain(self, profile: Profile) -> Toolchain:
        if self.dry and not all(p.made for p in self.provisions(profile)):
            raise RuntimeError("a dry run's runner never provisions: ask provisions() first")
        if self.pypi_cuda:
            self.cuda_home = cudapypi.provision(self.pypi_cuda, self._cache, self._log_dir)
        python = buildenv.build_python(profile, self._cache, self._python, self._log_dir)
        found = facts.probe(python, self.cuda_home, self._cache / "facts", save=not self.dry)
        if self.pypi_cuda:
            found["components"] = cudapypi.components(self.pypi_cuda)
        return Toolchain.from_facts(found)

    def base_env(self) -> dict[str, str]:
        return dict(os.environ)

    def missing_system(
        self, requirements: list[dict[str, str]], include_dirs: list[str]
    ) -> list[dict[str, str]]:
        return facts.missing_system(requirements, include_dirs)

    def cancel(self) -> None:
        proc.kill_all()

    def run(self, cmd: Command) -> proc.Result:
        # The step's memory limit, as the Docker runner's container has: a cgroup of its
        # own, so an OOM kill is named as such (kiln.memlimit).
        # No network unless the command asks for it (issue 41): as the Docker runner's
        # kiln's own venv and cache stay read-only (also where they lie under /tmp, which
        # a step sees its own of), but for what of them the step writes (its compiler cache)
        protected = [Path(sys.prefix), Path(sys.base_prefix), self._cache]
        if cmd.network or not isolation.isolates():
            return self._limited(cmd, cmd.argv, cmd.env)
        with isolation.isolated(cmd.argv, cmd.env, cmd.writable, protected, cmd.readonly) as (
            argv,
            env,
        ):
            return self._limited(cmd, argv, env)

    def _limited(
        self, cmd: Command, argv: Sequence[str | os.PathLike[str]], env: Mapping[str, str]
    ) -> proc.Result:
        return memlimit.run_limited(
            argv,
            mem_gib=cmd.mem_gib,
            cwd=cmd.cwd,
            env=dict(env),
            log_file=cmd.log_file,
            what=cmd.what,
            check=cmd.check,
            error=BuildError,
            echo=cmd.echo,
        )


def capabilities() -> Capabilities:
    return Capabilities(
        kind=LocalRunner.kind,
        isolates_network=isolation.isolates(),  # bubblewrap or unshare, where either can
        memory_limit=True,
        gpu=True,
        host_paths=True,
        where="on this machine",
        programs_from="this machine's PATH",
        install_in="",
        records_image=False,
    )


def available(req: RunnerRequest) -> bool:
    """``--runner auto`` takes the local runner wherever no other answers."""
    return True


def make(req: RunnerRequest) -> LocalRunner:
    """The local runner; where no step can be isolated here, refused unless
    ``--allow-network`` (a guard that cannot do its job stops, unless told)."""
    if not isolation.isolates():
        if not req.allow_network:
            raise ConfigError(isolation.refusal())
        isolation.allowed_network()
    return LocalRunner(req.python, req.cuda_home, req.cache, req.logs, req.pypi_cuda, dry=req.dry)
