"""Fault 4, out of memory: a compile job (a child of the step, as nvcc is of ninja)
allocates 1 GiB under a 64 MiB limit and the kernel kills it. kiln reports it as out of
memory, with the step, the limit and the advice to lower --jobs: for the local runner
through a cgroup of the step's own (kiln.memlimit, the kernel's oom_kill counter), for
the Docker runner through the container's limit."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.errors import BuildError
from kiln.inside.causes.resources import OOM_FIX
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
# The same job, then the upstream's own build (build.py): a build that releases once the
# job has the memory it needs.
HOG_THEN_BUILD = (
    "import subprocess, sys; job = 'b = bytearray(1 << 30); print(len(b))'; "
    "sys.exit(subprocess.call([sys.executable, '-c', job]) "
    "or subprocess.call([sys.executable, 'build.py']))"
)
OOM_LINE = re.compile(
    r"building tiny: killed: out of memory \(limit [0-9.]+ GiB\): "
    + re.escape(OOM_FIX)
    + r"; full log: .*tiny-build\.log$"
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


def test_the_printed_fix_raising_the_limit_builds(cgroups, tmp_path: Path) -> None:
    """The out-of-memory fix applied as printed (issue 41 (2)): "raise --mem-limit (the
    step's limit; without it, the memory budget: --mem-budget)", each way; the step's
    job needs 1 GiB, then the upstream's own build runs, and the build releases."""
    up = tmp_path / "up"
    commit = make_tiny(up)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    command = [sys.executable, "-c", HOG_THEN_BUILD]
    ws = tiny_workspace(tmp_path / "ws", commit, command=command, mem_per_job_gib=LIMIT)

    def build(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        args = tiny_build_args(ws, tmp_path / name, mirrors, "--offline", *extra)
        return run_kiln(*args)

    res = build("failed", "--mem-limit", str(LIMIT))
    assert res.returncode == 6, res.stderr[-2000:]
    fix = res.stderr.strip().splitlines()[-1]
    assert OOM_FIX in fix and "raise --mem-limit" in fix, fix
    # --mem-limit raised
    res = build("option", "--mem-limit", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "release ready" in res.stderr
    # no --mem-limit: the step's limit is the memory budget, which fails as small and
    # builds when raised
    res = build("small-budget", "--mem-budget", "0.1")
    assert res.returncode == 6, res.stderr[-2000:]
    res = build("budget", "--mem-budget", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "release ready" in res.stderr


def test_a_compiler_killed_for_memory_gets_the_killed_row_and_compiles_with_more(
    cgroups, tmp_path: Path
) -> None:
    """The cause table's ``killed`` row on a real nvcc killed by the kernel (its step
    under 30 MiB), read from the step's log as the failed build reads it; its fix ("raise
    --mem-limit") applied: the same compile, with 2 GiB, writes its object."""
    from kiln.inside import diagnose

    (tmp_path / "k.cu").write_text("__global__ void k(float* x) { x[0] = 1; }\n")
    nvcc = ["/usr/local/cuda/bin/nvcc", "-c", "k.cu", "-o", "k.o", "-arch=sm_100a"]
    cmd = ["sh", "-c", f'cd "{tmp_path}" && exec "$@"', "compile", *nvcc]
    log = tmp_path / "k-build.log"
    with pytest.raises(BuildError):
        memlimit.run_limited(cmd, mem_gib=0.03, what="building k", log_file=log)
    d = diagnose.diagnose(log.read_text(), tmp_path, {}, "k")
    assert d.cause is not None and d.cause.row == "killed", log.read_text()[-2000:]
    assert d.cause.fix == OOM_FIX
    memlimit.run_limited(cmd, mem_gib=2.0, what="building k")
    assert (tmp_path / "k.o").stat().st_size > 0


def test_docker_build_over_its_limit_reports_out_of_memory(
    tmp_path: Path, client, test_image: str
) -> None:
    image = test_image
    up = tmp_path / "up"
    commit = make_tiny(up)
    ws = tiny_workspace(
        tmp_path / "ws", commit, command=["python3", "-c", HOG_THEN_BUILD], mem_per_job_gib=LIMIT
    )
    assert NO_TORCH["cuda"] == "13.0"  # the image's CUDA, as in FAULT_PROFILE

    def build(limit: float) -> subprocess.CompletedProcess[str]:
        return run_kiln(
            *build_args(
                ws,
                tmp_path,
                *("--mem-limit", str(limit), *docker_args(image)),
                mirrors=mirrors_file(up / "mirrors.toml", f"{up}/"),
                runner=None,
            )
        )

    res = build(LIMIT)
    assert res.returncode == 6, res.stderr[-2000:]
    # The last line is kiln's verdict (above it, the step's own output is echoed, which
    # includes the failing command's "kiln: error:" from inside the container).
    last = res.stderr.strip().splitlines()[-1]
    assert OOM_LINE.match(last.removeprefix("kiln: error: ")), last
    assert [f for f in artifacts_files(tmp_path / "artifacts") if f != ".kiln.sources.lock"] == []
    assert client.containers.list(all=True, filters={"label": "kiln"}) == []
    assert DOCKER_DIR.is_dir()
    # the printed fix applied: the container's limit raised, the same build releases
    res = build(2.0)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "release ready" in res.stderr


# Two C++ units whose compiles each take about 0.5 GiB (a constexpr table GCC builds in
# memory), compiled side by side through kiln's wrapper ($CXX), then linked.
HOG_UNIT = """#include <array>
constexpr int N = 550000;
constexpr std::array<long long, N> make() {{
  std::array<long long, N> a{{}};
  for (int i = 0; i < N; i++) a[i] = i * 3LL + (i >> 2) + {salt};
  return a;
}}
constexpr auto table = make();
long long {name}(int i) {{ return table[i]; }}
"""
TWO_HOGS_PY = """\
import os, subprocess, sys
names = ["hog_a", "hog_b"]
flags = ["-std=c++20", "-fconstexpr-ops-limit=4000000000", "-fconstexpr-loop-limit=100000000",
         "-O0", "-fPIC", "-c"]
procs = [subprocess.Popen([os.environ["CXX"], *flags, f"{n}.cpp", "-o", f"{n}.o"]) for n in names]
if max(p.wait() for p in procs):
    sys.exit(1)
subprocess.check_call([os.environ["CXX"], "-shared", "-o", "libtiny.so", "hog_a.o", "hog_b.o"])
"""


@pytest.mark.timeout(600)
def test_a_compile_killed_for_memory_beside_another_is_compiled_again_alone(
    cgroups, tmp_path: Path
) -> None:
    """Issue 53 (1): two units the recipe guesses at 0.25 GiB each take 0.5 GiB; the
    gate, told of 4 GiB, admits both at once, and the step's 0.8 GiB limit is where the
    kernel kills one of them. The wrapper compiles the killed one again alone (it
    reserves the whole budget and goes first) and the build goes on to its release: the
    killed compile is recorded as such, the units compiled once each after it, and the
    manifest counts the rerun."""
    from tests.releases import manifest_json

    up = tmp_path / "up"
    files: dict[str, bytes | str] = {
        "build.py": TWO_HOGS_PY,
        "hog_a.cpp": HOG_UNIT.format(salt=1, name="hog_a"),
        "hog_b.cpp": HOG_UNIT.format(salt=2, name="hog_b"),
    }
    commit = make_tiny(up, files=files)
    ws = tiny_workspace(tmp_path / "ws", commit, mem_per_job_gib=0.25)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    extra = ("--offline", "--mem-budget", "4", "--mem-limit", "0.8", "--jobs", "2")
    res = run_kiln(*tiny_build_args(ws, tmp_path, mirrors, *extra), "-v")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "release ready" in res.stderr
    logs = tmp_path / "artifacts" / "logs" / "test-release"
    runs = [json.loads(line) for line in (logs / "tiny.jobs").read_text().splitlines()]
    killed = [r for r in runs if r["result"] == "oom-killed"]
    compiled = sorted(r["source"] for r in runs if r["result"] == "compiled" and r["rc"] == 0)
    assert killed and compiled == ["hog_a.cpp", "hog_b.cpp"], runs
    assert "compiling it again alone" in (logs / "tiny-build.log").read_text()
    assert "killed for memory and compiled again alone" in res.stderr
    # the rerun ran by itself: it started once no other compile was running
    rerun = next(
        r for r in runs if r["result"] == "compiled" and r["source"] == killed[0]["source"]
    )
    other = next(r for r in runs if r["result"] == "compiled" and r is not rerun)
    assert rerun["start"] >= other["start"] + other["wall_s"] - 0.5, runs
    schedule = manifest_json(tmp_path / "artifacts" / "test-release")["vendors"]["tiny"]["schedule"]
    assert schedule["oom_reruns"] == len(killed)


ROOM_CHILD = """
import os, sys
sys.path.insert(0, sys.argv[1])
import treemem
block = os.urandom(1 << 20)
with open(sys.argv[2], "wb") as fh:  # 300 MiB into the page cache, charged to this cgroup
    for _ in range(300):
        fh.write(block)
print(treemem._own_cgroup_room_kib())
"""


@pytest.mark.parametrize("name", ["kiln-room-probe", "kiln-step-room-probe"])
def test_the_gate_reads_a_cgroups_room_beside_its_working_set(
    cgroups, tmp_path: Path, name: str
) -> None:
    """Issue 53 (1): the machine's room the gate reads under a cgroup's limit (a
    container's, a CI job's) leaves out the page cache the kernel gives back: a build's
    reads and writes fill a cgroup's usage up to its limit (the first cold public build
    with the room read from usage ran one compile at a time for minutes). kiln's own step
    cgroups are left out: their limit is the budget, which the gate counts itself."""
    from kiln.inside.kit import treemem

    parent, version = memlimit._parent()
    if version != 1 and not (parent / "cgroup.subtree_control").exists():
        require.missing("CGROUP", "no writable memory cgroup for the probe")
    big = tmp_path / "big"
    group = parent / f"{name}-{os.getpid()}"
    group.mkdir()
    limit = 2 << 30
    try:
        (group / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(limit))
        kit = str(Path(treemem.__file__).parent)
        enter = f'echo $$ > {group / "cgroup.procs"}; exec "$@"'
        res = subprocess.run(
            ["sh", "-c", enter, "sh", sys.executable, "-S", "-c", ROOM_CHILD, kit, str(big)],
            capture_output=True,
            text=True,
            check=True,
        )
        used = int(
            (group / ("memory.usage_in_bytes" if version == 1 else "memory.current")).read_text()
        )
        room = res.stdout.strip()
        if name.startswith("kiln-step-"):
            assert room == "None" or int(room) * 1024 > limit, room  # not this one's
        else:
            assert used > 250 << 20  # the file's pages are charged to the group
            assert int(room) * 1024 > limit - (100 << 20), (room, used)  # but not counted
    finally:
        with contextlib.suppress(OSError):
            (group / ("memory.force_empty")).write_text("1")
        group.rmdir()
