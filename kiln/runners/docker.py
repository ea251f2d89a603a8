"""The Docker runner (docker-py; never the docker CLI).

The builder image is ``docker/`` built ``FROM`` the profile's base image (pinned by
digest), tagged by a content hash of the folder, the base and the build args, and
reused while that hash holds. Each command runs in a fresh container: kiln's source
read-only and the step's folders read-write at the same paths as on the host, the
caller's uid:gid (so files in ``artifacts/`` belong to the caller), ``HOME=/tmp``, no
network (sources are fetched by the host before), a memory limit from the build's
memory plan, and output streamed live to the console and the step's log. The
container is removed on success, failure and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kiln import fsutil
from kiln.config.models import Profile
from kiln.errors import BuildError, ConfigError, DockerUnavailable, ToolchainError
from kiln.inside import proc
from kiln.inside.facts import Facts
from kiln.runners.memlimit import absorbed, oom_error
from kiln.runners.protocol import (
    KILN_SRC,
    Capabilities,
    Command,
    RunnerRequest,
    parse_probe,
    probe_command,
    step_env,
)
from kiln.toolchain.checks import Toolchain, check_cuda
from kiln.toolchain.provision import Provision

log = logging.getLogger(__name__)

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUILDER_REPO = "kiln-builder"


@dataclass(frozen=True)
class Mount:
    """An extra bind mount: ``SRC[:DST[:ro|rw]]`` (read-only unless ``rw``)."""

    src: str
    dst: str
    mode: str = "ro"

    @classmethod
    def parse(cls, text: str) -> Mount:
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise ConfigError(f"--docker-mount {text!r}: expected SRC[:DST[:ro|rw]]")
        src = os.path.abspath(parts[0])
        return cls(
            src,
            parts[1] if len(parts) > 1 and parts[1] else src,
            parts[2] if len(parts) == 3 else "ro",
        )


def daemon_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def connect() -> Any:  # docker.DockerClient (docker-py has no type information)
    from docker.errors import DockerException

    import docker

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except DockerException as exc:
        reason = str(exc).splitlines()[0][:160]
        raise DockerUnavailable(
            f"cannot reach the Docker daemon at {daemon_address()} ({reason}): start it or "
            f"use --runner local"
        ) from None
    return client


def daemon_answers() -> bool:
    try:
        connect()
    except DockerUnavailable:
        return False
    return True


def _tree_digest(folder: Path, extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


KEPT_PREFIX = "kiln-kept-"  # --keep-container: a failed step's container, left to the user


CAPABILITIES: Final = Capabilities(
    kind="docker",
    isolates_network=True,  # a container's steps run with --network none
    memory_limit=True,
    gpu=False,
    host_paths=False,
    where="in the builder image",
    programs_from="the builder image",
    install_in=" in the image's Dockerfile",
    records_image=True,
)


class DockerRunner:
    kind = CAPABILITIES.kind
    capabilities = CAPABILITIES

    def __init__(
        self,
        base_image: str,
        *,
        allow_unpinned: bool,
        docker_dir: Path,
        build_args: dict[str, str],
        mounts: Sequence[Mount],
        python: str,
        cuda_home: str,
        keep_failed: bool = False,
        dry: bool = False,
    ) -> None:
        """``dry``: for a dry run: never builds the builder image nor removes containers."""
        if "@sha256:" not in base_image and not allow_unpinned:
            raise ConfigError(
                f"image {base_image} is not pinned by digest (NAME:TAG@sha256:...): run "
                f"`kiln lock` on a machine that reaches the registry, or pass "
                f"--allow-unpinned-image (the manifest then says 'unpinned')"
            )
        if not (docker_dir / "Dockerfile").is_file():
            raise ConfigError(f"{docker_dir}/Dockerfile: not found (--docker-dir)")
        self.client = connect()
        self.dry = dry
        if not dry:
            self.remove_orphans()
        self.base = base_image
        self.image = base_image if "@sha256:" in base_image else f"unpinned:{base_image}"
        self.docker_dir = docker_dir
        self.build_args = {"BASE_IMAGE": base_image, **build_args}
        self.mounts = list(mounts)
        self._live: set[Any] = set()  # containers of steps running now (step threads)
        self._live_lock = threading.Lock()  # steps add and remove, cancel() reads
        self.python = python
        self.cuda_home = cuda_home
        self.keep_failed = keep_failed
        self.builder: str | None = None
        self._tag: str | None = None
        self._facts: Facts | None = None

    # ------------------------------------------------------------------ image
    def _builder_tag(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in sorted(self.build_args.items()))
        return f"{BUILDER_REPO}:{_tree_digest(self.docker_dir, args)}"

    def provisions(self, profile: Profile) -> list[Provision]:
        """The builder image; until an image has its content hash, every check in it
        (nvcc, the recipes' system files) waits for it."""
        from docker.errors import ImageNotFound

        tag = self._builder_tag()
        what = f"the builder image ({self.docker_dir}/Dockerfile on {self.base})"
        try:
            self.client.images.get(tag)
            return [Provision(what, tag, "", made=True)]
        except ImageNotFound:
            return [Provision(what, tag, "size known once built", before_checks=True)]

    def ensure_builder(self) -> str:
        """The builder image's tag, built only when its content hash is new."""
        from docker.errors import BuildError as DockerBuildError
        from docker.errors import ImageNotFound

        tag = self._builder_tag()
        try:
            image = self.client.images.get(tag)
            log.info("builder image %s is up to date", tag)
        except ImageNotFound:
            if self.dry:
                raise RuntimeError(
                    "a dry run's runner never builds: ask provisions() first"
                ) from None
            log.info("building the builder image %s from %s", tag, self.docker_dir)
            try:
                image, _ = self.client.images.build(
                    path=str(self.docker_dir),
                    tag=tag,
                    buildargs=self.build_args,
                    network_mode="host",
                    rm=True,
                    forcerm=True,
                    pull=False,
                )
            except DockerBuildError as exc:
                tail = "\n".join(
                    f"    {c.get('stream', c.get('error', '')).rstrip()}"
                    for c in list(exc.build_log)[-15:]
                )
                raise BuildError(
                    f"building the builder image {tag} failed: {exc.msg}\n{tail}"
                ) from None
        self.builder = image.id
        self._tag = tag
        return tag

    # -------------------------------------------------------------- toolchain
    def _probe(self) -> Facts:
        if self._facts is None:
            res = self.run(
                Command(
                    probe_command(self.python, self.cuda_home),
                    Path("/"),
                    step_env(self.base_env()),
                    "probing the builder image",
                )
            )
            self._facts = parse_probe(res.output)
        return self._facts

    def nvcc(self, profile: Profile) -> str:
        facts = self._probe()
        if "nvcc" not in facts:
            raise ToolchainError(f"in the builder image: {facts.get('error')}")
        version = str(facts["nvcc"])
        check_cuda(version, f"{self.cuda_home} (in the builder image)", profile)
        return version

    def toolchain(self, profile: Profile) -> Toolchain:
        return Toolchain.from_facts(self._probe())

    def missing_system(
        self, requirements: list[dict[str, str]], include_dirs: list[str]
    ) -> list[dict[str, str]]:
        asked = json.dumps({"requirements": requirements, "include_dirs": include_dirs})
        res = self.run(
            Command(
                probe_command(self.python, self.cuda_home, asked),
                Path("/"),
                step_env(self.base_env()),
                "checking the builder image for the recipes' system files",
            )
        )
        missing: list[dict[str, str]] = json.loads(res.output.strip().splitlines()[-1])
        return missing

    def base_env(self) -> dict[str, str]:
        return {"PATH": CONTAINER_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}

    # ------------------------------------------------------------------- run
    def run(self, cmd: Command) -> proc.Result:
        argv, cwd, env, what = cmd.argv, cmd.cwd, cmd.env, cmd.what
        log_file, writable, check, mem_gib = cmd.log_file, cmd.writable, cmd.check, cmd.mem_gib
        echo = cmd.echo
        tag = self.builder_tag()
        volumes = {str(KILN_SRC): {"bind": str(KILN_SRC), "mode": "ro"}}
        for path in writable:
            path.mkdir(parents=True, exist_ok=True)
            volumes[str(path)] = {"bind": str(path), "mode": "rw"}
        for path in cmd.readonly:
            volumes[str(path)] = {"bind": str(path), "mode": "ro"}
        for m in self.mounts:
            volumes[m.src] = {"bind": m.dst, "mode": m.mode}
        environment = dict(env)
        limit = f"{int(mem_gib * 1024)}m" if mem_gib else None
        line = shlex.join(str(a) for a in argv)
        container = self.client.containers.create(
            tag,
            [str(a) for a in argv],
            working_dir=str(cwd),
            environment=environment,
            user=f"{os.getuid()}:{os.getgid()}",
            volumes=volumes,
            # The host's network only for a step that must reach a shared compiler cache
            # or build servers (loopback included); otherwise none.
            network_mode="host" if cmd.network else "none",
            mem_limit=limit,
            memswap_limit=limit,
            labels={"kiln": "step", "kiln.owner": str(os.getpid())},
            detach=True,
        )
        out = proc.Streamer(
            log_file, echo, f"{line}  (container {container.short_id}, image {tag})"
        )
        with self._live_lock:
            self._live.add(container)
        rc, oom, where = -1, False, " (in the builder container)"
        try:
            container.start()
            for raw in container.logs(stream=True, follow=True):
                out.feed(raw.decode("utf-8", errors="replace"))
            rc = container.wait()["StatusCode"]
            container.reload()
            oom = bool(container.attrs["State"].get("OOMKilled"))
        finally:
            with self._live_lock:
                self._live.discard(container)
            out.close()
            if self.keep_failed and (rc != 0 or oom):
                # the name marks it kept: remove_orphans leaves it to the user
                kept = f"{KEPT_PREFIX}{container.short_id}"
                container.rename(kept)
                where = f" (in the builder container, kept as {kept}: `docker start -ai {kept}`)"
                log.warning(
                    "kept the failed step's container %s: `docker start -ai %s` reruns the "
                    "step inside it; `docker rm %s` when done",
                    kept,
                    kept,
                    kept,
                )
            else:
                container.remove(force=True)
        if oom and rc != 0:
            raise oom_error(what, mem_gib, log_file)
        if oom:
            absorbed(what, 1)
        if check and rc != 0:
            raise BuildError(out.failure(what, rc, log_file, where))
        return proc.Result(rc, out.output)

    def remove_orphans(self) -> None:
        """Containers of steps whose kiln process is gone (killed with SIGKILL, or its
        machine's OOM killer): they would go on writing into work trees this run
        re-creates. Removed, and said so."""
        for container in self.client.containers.list(all=True, filters={"label": "kiln=step"}):
            if container.name.startswith(KEPT_PREFIX):
                continue
            owner = container.labels.get("kiln.owner", "")
            if owner.isdigit() and fsutil.pid_alive(int(owner)):
                continue
            log.warning(
                "removing container %s of a kiln build that is gone (pid %s)",
                container.short_id,
                owner or "unknown",
            )
            with contextlib.suppress(Exception):
                container.remove(force=True)

    def cancel(self) -> None:
        """Kill the containers of running steps (Ctrl-C while steps run in threads);
        each step's own cleanup then removes its container."""
        from docker.errors import APIError

        with self._live_lock:
            running = list(self._live)
        for container in running:
            with contextlib.suppress(APIError):
                container.kill()

    def builder_tag(self) -> str:
        return self._tag or self.ensure_builder()


def capabilities() -> Capabilities:
    return CAPABILITIES


def available(req: RunnerRequest) -> bool:
    """``--runner auto`` takes Docker where an image is named and a daemon answers."""
    return bool(req.image) and daemon_answers()


def make(req: RunnerRequest) -> DockerRunner:
    """The Docker runner of ``req``'s image (refused without one, or with the pip CUDA)."""
    if req.pypi_cuda:
        raise ConfigError(
            "--toolchain pypi is for the local runner; the Docker runner uses the image's CUDA"
        )
    if not req.image:
        raise ConfigError(
            "--runner docker needs an image: set profile.image in kiln.toml or pass --image"
        )
    return DockerRunner(
        req.image,
        allow_unpinned=req.allow_unpinned_image,
        docker_dir=req.docker_dir,
        build_args=req.build_args,
        mounts=[Mount.parse(m) for m in req.mounts],
        python=req.python or "python3",
        cuda_home=req.cuda_home or "/usr/local/cuda",
        keep_failed=req.keep_container,
        dry=req.dry,
    )


def image_digest(ref: str) -> str:
    """The registry's digest of ``ref``, asked through the daemon (``kiln lock``)."""
    digest: str = connect().images.get_registry_data(ref).id
    return digest
