"""Fault 4, out of memory: a compile job (a child of the step, as nvcc is of ninja)
allocates 1 GiB under a 64 MiB limit and the kernel kills it. kiln reports it as out of
memory, with the step, the limit and the advice to lower --jobs: for the local runner
through a cgroup of the step's own (kiln.memlimit, the kernel's oom_kill counter), for
the Docker runner through the container's limit."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from kiln.errors import BuildError
from kiln.runners import memlimit
from tests import require
from tests.conftest import artifacts_files, build_args, run_kiln
from tests.faults.conftest import make_tiny, mirrors_file, tiny_build_args, tiny_workspace
from tests.integration.test_docker import DOCKER_DIR, NO_TORCH, docker_args

LIMIT = 0.0625  # GiB
# The step starts a "compile job" that allocates 1 GiB and fails when that job dies.
HOG = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', '{}']))".format(
    "b = bytearray(1 << 30); print(len(b))"
)
OOM_LINE = re.compile(
    r"building tiny: killed: out of memory \(limit [0-9.]+ GiB\): lower --jobs or raise the "
    r"limit \(build\.mem_per_job_gib or --mem-limit\); full log: .*tiny-build\.log$"
)


@pytest.fixture
def cgroups() -> None:
    try:
        with memlimit.limited(1.0) as group:
            if group is None:
                raise OSError("no cgroup")
    except OSError as exc:
        require.missing("CGROUP", f"this machine cannot make a memory cgroup for a step: {exc}")


def _leftover_cgroups() -> list[Path]:
    parent, _ = memlimit._parent()
    return sorted(parent.glob(f"kiln-step-{os.getpid()}-*"))


def test_local_step_over_its_limit_is_out_of_memory(cgroups, tmp_path: Path) -> None:
    log = tmp_path / "tiny-build.log"
    with pytest.raises(BuildError) as info:
        memlimit.run_limited(
            [sys.executable, "-c", HOG], mem_gib=LIMIT, what="building tiny", log_file=log
        )
    msg = str(info.value)
    assert OOM_LINE.match(msg), msg
    assert f"(limit {LIMIT:g} GiB)" in msg
    assert _leftover_cgroups() == []


def test_same_step_within_its_limit_succeeds(cgroups) -> None:
    """The control: the limit, not the command, made the step above fail."""
    res = memlimit.run_limited([sys.executable, "-c", HOG], mem_gib=2.0, what="building tiny")
    assert res.output.strip() == str(1 << 30)
    assert _leftover_cgroups() == []


def test_a_plain_failure_is_not_called_out_of_memory(cgroups) -> None:
    with pytest.raises(BuildError) as info:
        memlimit.run_limited(
            [sys.executable, "-c", "import sys; sys.exit(3)"], mem_gib=LIMIT, what="building tiny"
        )
    assert "failed with exit code 3" in str(info.value)
    assert "out of memory" not in str(info.value)


def test_local_build_over_its_limit_reports_out_of_memory(cgroups, tmp_path: Path) -> None:
    up = tmp_path / "up"
    commit = make_tiny(up)
    ws = tiny_workspace(
        tmp_path / "ws", commit, command=[sys.executable, "-c", HOG], mem_per_job_gib=LIMIT
    )
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    args = tiny_build_args(ws, tmp_path, mirrors, "--offline", "--mem-limit", str(LIMIT))
    res = run_kiln(*args)
    assert res.returncode == 6, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert OOM_LINE.match(last.removeprefix("kiln: error: ")), last


def test_docker_build_over_its_limit_reports_out_of_memory(
    tmp_path: Path, client, test_image: str
) -> None:
    image = test_image
    up = tmp_path / "up"
    commit = make_tiny(up)
    ws = tiny_workspace(
        tmp_path / "ws", commit, command=["python3", "-c", HOG], mem_per_job_gib=LIMIT
    )
    assert NO_TORCH["cuda"] == "13.0"  # the image's CUDA, as in FAULT_PROFILE
    res = run_kiln(
        *build_args(
            ws,
            tmp_path,
            *("--mem-limit", str(LIMIT), *docker_args(image)),
            mirrors=mirrors_file(up / "mirrors.toml", f"{up}/"),
            runner=None,
        )
    )
    assert res.returncode == 6, res.stderr[-2000:]
    # The last line is kiln's verdict (above it, the step's own output is echoed, which
    # includes the failing command's "kiln: error:" from inside the container).
    last = res.stderr.strip().splitlines()[-1]
    assert OOM_LINE.match(last.removeprefix("kiln: error: ")), last
    assert [f for f in artifacts_files(tmp_path / "artifacts") if f != ".kiln.sources.lock"] == []
    assert client.containers.list(all=True, filters={"label": "kiln"}) == []
    assert DOCKER_DIR.is_dir()
