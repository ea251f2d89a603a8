from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from kiln.config.models import Profile
from kiln.orchestrate.options import Options
from kiln.plan.jobs import JobLine, job_stats
from kiln.toolchain import buildenv, cudapypi
from tests import fleet, require
from tests import upstreams as fixture_upstreams
from tests.workspace import PROFILE

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

# Time limits (pytest-timeout), by folder unless a test says otherwise with
# @pytest.mark.timeout(N): a hang fails its own test with a traceback instead of spending
# the rest of CI's 90 minutes. Tight for unit tests, generous where whole builds run (the
# slowest seen there take a few minutes on 2 cores; the public upstreams' builds mark
# their own).
# A limit covers the test's own function (pyproject: timeout_func_only): what a session
# fixture provisions once (torch, a CUDA toolchain, the tests' image) is not charged to
# whichever test happens to need it first; each such fixture has a limit of its own
# (:func:`provisioned`).
TIME_LIMITS_S = {"unit": 120, "integration": 900, "faults": 900}
PROVISION_LIMIT_S = 1800  # torch from PyPI: 5.7 GB, a few minutes where the network is slow

T = TypeVar("T")


def provisioned(what: str, make: Callable[[], T], limit_s: float = PROVISION_LIMIT_S) -> T:
    """``make()`` within ``limit_s``: a session fixture's own time limit (a hang fails the
    tests that need it, with what hung, instead of spending CI's 90 minutes)."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = make()
        except BaseException as exc:  # handed to the fixture's caller below
            done["error"] = exc

    worker = threading.Thread(target=run, name=f"provision {what}", daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        pytest.fail(f"provisioning {what} took over {limit_s:g} s", pytrace=False)
    if "error" in done:
        raise done["error"]
    return cast(T, done["value"])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None:
            folder = item.path.relative_to(TESTS).parts[0]
            item.add_marker(pytest.mark.timeout(TIME_LIMITS_S.get(folder, 300)))


# Shared across test runs: the provisioned torch venv and CUDA toolchain live here.
CACHE = Path(os.environ.get("KILN_CACHE_DIR") or REPO / ".kiln-cache")
# Every kiln the tests start without --cache uses it too, never the user's ~/.cache/kiln
# (kiln's default): a test run leaves nothing in the home folder.
os.environ["KILN_CACHE_DIR"] = str(CACHE)


@pytest.fixture(scope="session")
def build_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the test profile's torch (provisioned once into kiln's cache)."""
    profile = Profile.model_validate(PROFILE)
    where = tmp_path_factory.mktemp("provision")
    return provisioned(
        "the tests' torch", lambda: buildenv.build_python(profile, CACHE, None, where)
    )


@pytest.fixture(scope="session")
def public_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with examples/public's torch and build tools (NVSHMEM for DeepEP)."""
    from kiln.config.workspace import Workspace

    profile = Workspace(REPO / "examples" / "public").profile
    where = tmp_path_factory.mktemp("provision")
    return provisioned(
        "examples/public's torch", lambda: buildenv.build_python(profile, CACHE, None, where)
    )


@pytest.fixture(scope="session")
def pypi_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CUDA home of the tests' CUDA 13.2 (hash-pinned PyPI wheels, made once)."""
    where = tmp_path_factory.mktemp("cuda")
    return provisioned("CUDA from PyPI", lambda: cudapypi.provision(PROFILE["cuda"], CACHE, where))


@pytest.fixture(scope="session")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> fixture_upstreams.Upstreams:
    where = tmp_path_factory.mktemp("upstreams")
    return provisioned("the upstreams' bare repositories", lambda: fixture_upstreams.make(where))


def shared_cache(cache: Path) -> Path:
    """A test's own kiln cache that reuses what the session provisioned once: the pinned
    CUDA toolchains (each 13 s to install from PyPI), the build Pythons' probed facts
    (3 s of importing torch) and the import proof's consumer environments, linked in.
    kiln keys them by content (a toolchain by its lock's hash, facts by the Python's
    install stamp, an environment by its inputs), so a shared entry is the one the test
    would make; git clones, the compiler and artifact caches stay the test's own.
    Tests of provisioning itself use an empty cache instead."""
    cudapypi.provision(PROFILE["cuda"], CACHE, CACHE / "logs")  # once: then a marker check
    (cache / "toolchains").mkdir(parents=True, exist_ok=True)
    for made in (CACHE / "toolchains").glob("*"):
        link = cache / "toolchains" / made.name
        if (made / cudapypi.MARKER).exists() and not link.exists():
            link.symlink_to(made)
    (CACHE / "facts").mkdir(parents=True, exist_ok=True)
    if not (cache / "facts").exists():
        (cache / "facts").symlink_to(CACHE / "facts")
    # The import proof's consumer environments (torch: a minute and 5 GB each), keyed by
    # their inputs (kiln/toolchain/consumerenv.py): made once, under their lock, by the
    # first test that needs each. (No test here makes a build venv in its own cache.)
    (CACHE / "envs").mkdir(parents=True, exist_ok=True)
    if not (cache / "envs").exists():
        (cache / "envs").symlink_to(CACHE / "envs")
    return cache


@pytest.fixture
def options(
    tmp_path: Path, upstreams: fixture_upstreams.Upstreams, build_python: Path, pypi_cuda: Path
):
    def make(workspace: Path, **overrides: Any) -> Options:
        opts = Options(
            workspace=workspace,
            artifacts=tmp_path / "artifacts",
            cache=shared_cache(tmp_path / "cache"),
            work=tmp_path / "work",
            mirrors=upstreams.mirrors,
            offline=True,
            python=str(build_python),
            toolchain="pypi",
        )
        return replace(opts, **overrides)

    return make


def build_args(
    ws: Path,
    root: Path,
    *extra: str | Path,
    mirrors: Path | None = None,
    offline: bool = True,
    runner: str | None = "local",
    toolchain: str | None = None,
    python: str | Path | None = None,
    cache: Path | None = None,
    artifacts: Path | None = None,
    work: Path | None = None,
) -> list[str]:
    """The arguments of ``kiln build`` of ``ws`` that every test building through the CLI
    starts from: its folders under ``root`` (artifacts/, cache/, work/) unless given, the
    mirrors (offline unless told), the runner, toolchain and build Python; ``extra`` last
    (vendor names, other options)."""
    args: list[str | Path] = ["build", "--workspace", ws]
    args += ["--artifacts", artifacts or root / "artifacts"]
    args += ["--cache", cache or root / "cache", "--work", work or root / "work"]
    if mirrors is not None:
        args += ["--mirrors", mirrors]
    if offline and mirrors is not None:
        args.append("--offline")
    for flag, value in (("--runner", runner), ("--toolchain", toolchain), ("--python", python)):
        if value is not None:
            args += [flag, value]
    return [str(a) for a in (*args, *extra)]


def run_kiln(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln", *map(str, args)],
        cwd=cwd or REPO,
        text=True,
        capture_output=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


# A refusal that comes before any fetch or compile takes seconds; the smallest compile of
# the real upstreams takes minutes. The bound is generous (a loaded 2-core CI machine runs
# several times slower than a developer's) and only tells "stopped first" from "stopped
# after a compile"; the tests that use it also check that nothing was compiled.
BEFORE_ANY_COMPILE_S = 120.0


def compiled_units(artifacts: Path) -> list[JobLine]:
    """The compiles the build's steps recorded (its logs' ``*.jobs`` lines naming a
    source): none for a build refused before it compiled. A line without a source is a
    link or a probe (``$CC`` asked for its version), not a compile."""
    return [j for jobs in artifacts.rglob("*.jobs") for j in job_stats(jobs) if j.get("source")]


def artifacts_files(artifacts: Path) -> list[str]:
    """Everything under artifacts/ except logs (which are kept on failure, on purpose)."""
    if not artifacts.exists():
        return []
    return sorted(
        str(p.relative_to(artifacts))
        for p in artifacts.rglob("*")
        if p.is_file() and p.relative_to(artifacts).parts[0] != "logs"
    )


def step_marker(root: Path, name: str, release: str = "test-release") -> Path:
    """A file a build step writes (or reads) to signal a test: in the release's logs
    folder under ``root``'s artifacts, one of the few places an isolated step may write
    (it has a /tmp of its own; its tree, its outputs and its logs are the machine's)."""
    return root / "artifacts" / "logs" / release / name


def start_kiln_until(
    marker: Path, *args: str | Path, timeout: float = 180
) -> subprocess.Popen[str]:
    """Start ``python -m kiln ARGS`` and return once ``marker`` exists (the build is then
    mid-compile), for tests that interrupt it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as on a terminal, even where the tests run in a background job (a shell
        # starts those with SIGINT ignored, and Python then never raises KeyboardInterrupt).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the build never started compiling"
        time.sleep(0.2)
    return proc


@pytest.fixture(scope="session")
def client():
    """A docker-py client of a running daemon (skip without one, unless
    KILN_REQUIRE_DOCKER=1 or KILN_REQUIRE_ALL=1); at the end, no kiln container may be left."""
    docker = pytest.importorskip("docker")
    try:
        c = docker.from_env()
        c.ping()
    except docker.errors.DockerException as exc:
        require.missing("DOCKER", f"no Docker daemon answers: {exc}")
    yield c
    leftovers = c.containers.list(all=True, filters={"label": "kiln"})
    assert leftovers == [], f"containers left behind: {[x.name for x in leftovers]}"


@pytest.fixture(scope="session")
def test_image(client) -> str:
    """The tests' builder-like image (tests/dockerimage.py), made once."""
    from tests import dockerimage

    return provisioned("the tests' image", lambda: dockerimage.ensure(client))


@pytest.fixture
def redis_server(tmp_path: Path):
    """A fresh ``redis-server`` on a free loopback port (tests/fleet.py)."""
    server = fleet.start_redis(tmp_path / "redis")
    yield server
    server.kill()


@pytest.fixture
def dist_servers(tmp_path: Path):
    """An ``sccache-dist`` scheduler and two build servers on loopback (tests/fleet.py)."""
    servers = fleet.start_dist(tmp_path / "dist")
    yield servers
    servers.stop()


@pytest.fixture
def server(tmp_path: Path):
    """A "prebuilt" file served on this machine's loopback (which the tests' own process
    reaches and a build step's network namespace does not): its URL."""
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "prebuilt.so").write_bytes(b"not built from pinned sources")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    def handler(*args: object, **kwargs: object) -> Quiet:
        return Quiet(*args, directory=str(tmp_path / "served"), **kwargs)  # type: ignore[arg-type]

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/prebuilt.so"
    httpd.shutdown()
