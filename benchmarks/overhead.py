"""What kiln costs per compile (issue 12): its compiler wrapper, the compile gate and the
memory sampler, measured on real translation units of the public upstreams.

Run after a build of examples/public (``nox -s build_public``), whose work trees and logs
it reads: DeepGEMM's one g++ unit (``csrc/python_api.cpp``, the command as setuptools
ran it) and one of DeepEP's nvcc units (from its ``build.ninja``). Each is compiled

- directly (the compiler alone, with the environment fixes a user would write by hand);
- through kiln's wrapper as it was before this change (``git show REV:...``: the object
  cache learned the dependencies with a second ``-M`` run of the preprocessor);
- through kiln's wrapper now (dependencies from the compile itself), object cache on;
- the same with a cold ccache in front (what a first ``kiln build`` does).

CPU seconds are the compile's whole process tree (``wait4``), so the wrapper's own
Python is counted. The gate and the sampler are measured apart, with synthetic load.

    python benchmarks/overhead.py --work build/work/public-upstreams \\
        --logs artifacts/logs/public-upstreams [--before REV] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kiln.inside import memwatch  # noqa: E402
from kiln.inside.kit import compilegate  # noqa: E402
from kiln.orchestrate.kit import KIT_FILES  # noqa: E402
from kiln.release import manifest as manifest_io  # noqa: E402


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the whole process tree) of one run of ``cmd``."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    _, status, use = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {shlex.join(cmd)[:300]}")
    return time.monotonic() - start, use.ru_utime + use.ru_stime


def _kit_path(rev: str) -> str:
    """Where the wrapper's files lie at ``rev`` (kiln/shipped before the stage packages)."""
    res = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{rev}:kiln/inside/kit/objcache.py"],
        capture_output=True,
        check=False,
    )
    return "kiln/inside/kit" if res.returncode == 0 else "kiln/shipped"


def kit(dest: Path, rev: str | None) -> Path:
    """The wrapper's files as of ``rev`` (None: the working tree) in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in KIT_FILES:
        if rev is None:
            shutil.copy(REPO / "kiln" / "inside" / "kit" / name, dest / name)
            continue
        res = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{_kit_path(rev)}/{name}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode == 0:
            (dest / name).write_text(res.stdout)
    return dest / "objcache.py"


def fixes_env(manifest: dict[str, Any], vendor: str) -> dict[str, str]:
    """The manifest's recorded pip-CUDA fixes, with this machine's paths put back."""
    tc = manifest["toolchain"]
    fixes = manifest["vendors"][vendor].get("toolchain_fixes", {}).get("env", {})
    out = {}
    for key, value in fixes.items():
        out[key] = (
            value.replace("${SITE_PACKAGES}", tc["site_packages"])
            .replace("${CUDA_HOME}", tc["cuda_home"])
            .replace("${KILN_LINKS}", "/nonexistent")
        )
    return out


def deepgemm_unit(work: Path, logs: Path) -> tuple[Path, list[str]]:
    line = next(
        ln.strip()
        for ln in (logs / "deepgemm-build.log").read_text().splitlines()
        if "python_api.cpp" in ln and " -c " in ln and ln.strip().startswith("/")
    )
    args = shlex.split(line)[1:]
    args[args.index("-o") + 1] = "OUT.o"
    return work / "deepgemm", ["g++", *args, "-std=c++20"]  # the recipe's appended flag


def deepep_unit(work: Path, source: str) -> tuple[Path, list[str]]:
    tree = work / "deepep"
    ninja = next((tree / "build").glob("temp.*/build.ninja"))
    values = {}
    for ln in ninja.read_text().splitlines():
        key, eq, value = ln.partition(" = ")
        if eq and not ln.startswith(" "):
            values[key] = value
    post = values["cuda_post_cflags"].replace(f"-ccbin {tree}/.kiln/bin/gcc", "-ccbin gcc")
    cmd = (
        f"/usr/local/cuda/bin/nvcc -MD -MF OUT.o.d {values['cuda_cflags']} -c {tree / source} "
        f"-o OUT.o {post}"
    )
    return ninja.parent, shlex.split(cmd)


def measure_unit(
    name: str, cwd: Path, cmd: list[str], env: dict[str, str], before: str, rounds: int, tmp: Path
) -> list[dict[str, Any]]:
    roots = {
        "KILN_OBJCACHE_ROOTS": f"TREE={cwd if name != 'deepep' else cwd.parent.parent};"
        f"SITE={env['SITE']};CUDA=/usr/local/cuda",
        "KILN_OBJCACHE_PYTHON": sys.executable,
    }
    base = {k: v for k, v in env.items() if k != "SITE"}
    rows: list[dict[str, Any]] = []
    configs = [
        ("direct", None, {}),
        (f"kiln wrapper before ({before})", kit(tmp / "before", before), {"OBJ": "1"}),
        ("kiln wrapper now", kit(tmp / "now", None), {"OBJ": "1"}),
        ("kiln wrapper now + cold ccache", kit(tmp / "now", None), {"OBJ": "1", "CC": "1"}),
    ]
    for label, wrapper, opts in configs:
        walls, cpus = [], []
        for i in range(rounds):
            out = tmp / f"{name}-{len(rows)}-{i}.o"
            run_cmd = [a.replace("OUT.o", str(out)) for a in cmd]
            run_env = {**base}
            if wrapper is not None:
                run_cmd = [sys.executable, str(wrapper), *run_cmd]
                run_env.update(roots)
            if opts.get("OBJ"):
                run_env["KILN_OBJCACHE_DIR"] = str(tmp / f"objcache-{len(rows)}-{i}")
            if opts.get("CC"):
                run_env.update(
                    {
                        "KILN_CCACHE": shutil.which("ccache") or "ccache",
                        "CCACHE_DIR": str(tmp / f"ccache-{len(rows)}-{i}"),
                        "CCACHE_BASEDIR": str(roots["KILN_OBJCACHE_ROOTS"].split(";")[0][5:]),
                        "CCACHE_NOHASHDIR": "1",
                        "CCACHE_COMPILERCHECK": "content",
                        "CCACHE_SLOPPINESS": "include_file_mtime,include_file_ctime",
                        "CCACHE_IGNOREOPTIONS": "--keep-dir=*",
                    }
                )
            wall, cpu = timed(run_cmd, cwd, run_env)
            walls.append(wall)
            cpus.append(cpu)
            print(f"  {name}: {label}: {wall:.1f} s wall, {cpu:.1f} CPU-s", flush=True)
        rows.append(
            {
                "unit": name,
                "config": label,
                "wall_s": statistics.median(walls),
                "cpu_s": statistics.median(cpus),
            }
        )
    return rows


def fixed_cost(tmp: Path, rounds: int) -> list[dict[str, Any]]:
    """What the wrapper adds to any compile, apart from the compiler's own work: an empty
    C file (gcc) and an empty kernel (nvcc, through the shim CUDA home), many times."""
    tree = tmp / "fixed"
    tree.mkdir()
    (tree / "e.c").write_text("int f(void) { return 0; }\n")
    (tree / "e.cu").write_text("__global__ void k(int* p) { p[0] = 1; }\n")
    env = {
        **os.environ,
        "KILN_OBJCACHE_ROOTS": f"TREE={tree};CUDA=/usr/local/cuda",
        "KILN_OBJCACHE_PYTHON": sys.executable,
    }
    now = kit(tmp / "now", None)
    rows = []
    for name, cmd in (
        ("gcc, empty file", ["gcc", "-c", "e.c", "-o", "OUT.o"]),
        (
            "nvcc, empty kernel",
            ["/usr/local/cuda/bin/nvcc", "-c", "e.cu", "-o", "OUT.o", "-arch=sm_100a"],
        ),
    ):
        for label, wrap, extra in (
            ("direct", False, {}),
            ("kiln wrapper", True, {}),
            ("kiln wrapper + object cache", True, {"KILN_OBJCACHE_DIR": str(tmp / "oc")}),
        ):
            cpus = []
            for i in range(rounds):
                args = [a.replace("OUT.o", f"{label[:4]}{i}.o") for a in cmd]
                run = [sys.executable, str(now), *args] if wrap else args
                extra_env = {
                    k: f"{v}-{i}" if k == "KILN_OBJCACHE_DIR" else v for k, v in extra.items()
                }
                cpus.append(timed(run, tree, {**env, **extra_env})[1])
            rows.append({"unit": name, "config": label, "cpu_s": statistics.median(cpus)})
    return rows


def extra_passes(cwd: Path, cmd: list[str], env: dict[str, str], rounds: int) -> dict[str, Any]:
    """The second preprocessor runs a wrapper can add to a compile: ``-M`` (how kiln's
    object cache learned dependencies before) and ``-E`` (what ccache's preprocessor
    mode runs on a miss)."""
    base = [a for a in cmd if a not in ("-c",)]
    out = base.index("-o")
    no_out = base[:out] + base[out + 2 :]
    runs = {
        "-M": [*no_out, "-M", "-o", "/dev/null"],
        "-E": [*no_out, "-E", "-o", "/dev/null"],
    }
    return {
        k: statistics.median(timed(v, cwd, env)[1] for _ in range(rounds)) for k, v in runs.items()
    }


GATE_WAITER = """
import sys, time
from pathlib import Path
from kiln.inside.kit import compilegate
with compilegate.slot(Path(sys.argv[1]), 0.1, 1, float(sys.argv[2])):
    pass
"""


def gate_cost(tmp: Path, waiters: int, seconds: float) -> dict[str, float]:
    """CPU of ``waiters`` compiles waiting at a full gate for ``seconds``, and the delay
    from a slot coming free to the next compile starting."""
    gate = tmp / "gate"
    compilegate.write_budget(gate, mem_gib=100.0, cpus=1)
    holder_ready = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with compilegate.slot(gate, 0.1, 1, compilegate.FIRST):
            holder_ready.set()
            release.wait()

    t = threading.Thread(target=hold)
    t.start()
    holder_ready.wait()
    procs = [
        subprocess.Popen([sys.executable, "-c", GATE_WAITER, str(gate), str(i)], cwd=REPO)
        for i in range(waiters)
    ]
    time.sleep(2)  # all started and waiting
    cpu_at = [_cpu_of(p.pid) for p in procs]
    time.sleep(seconds)
    cpu = sum(_cpu_of(p.pid) - c for p, c in zip(procs, cpu_at, strict=True))
    release.set()
    t.join()
    freed = time.monotonic()
    for p in procs:  # each runs in turn once a slot is free: the whole queue drains
        p.wait()
    drain = time.monotonic() - freed
    elapsed = seconds
    return {
        "waiters": waiters,
        "cpu_per_waiter_s_per_s": cpu / (waiters * elapsed),
        "drain_s_per_compile": drain / waiters,
    }


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sampler_cost(seconds: float, children: int) -> float:
    """CPU seconds per second that memwatch's sampler takes over a tree of processes."""
    procs = [subprocess.Popen(["sleep", str(seconds + 5)]) for _ in range(children)]
    before = resource.getrusage(resource.RUSAGE_SELF)
    with memwatch.Watcher(os.getpid()):
        time.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    for p in procs:
        p.kill()
        p.wait()
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "build/work/public-upstreams")
    ap.add_argument("--logs", type=Path, default=REPO / "artifacts/logs/public-upstreams")
    ap.add_argument(
        "--manifest", type=Path, default=REPO / "artifacts/public-upstreams/manifest.json"
    )
    ap.add_argument("--before", default="f2f616c", help="kiln revision to compare with")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--nvcc-unit", default="csrc/kernels/legacy/layout.cu")
    args = ap.parse_args()
    manifest: dict[str, Any] = manifest_io.read(args.manifest).data()  # with run.json's paths
    site = manifest["toolchain"]["site_packages"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, **fixes_env(manifest, "deepgemm"), "SITE": site}
        cwd, cmd = deepep_unit(args.work, args.nvcc_unit)
        rows += measure_unit("deepep", cwd, cmd, env, args.before, max(args.rounds, 3), tmp)
        cwd, cmd = deepgemm_unit(args.work, args.logs)
        passes = extra_passes(cwd, cmd, {k: v for k, v in env.items() if k != "SITE"}, 3)
        rows += measure_unit("deepgemm", cwd, cmd, env, args.before, args.rounds, tmp)
        fixed = fixed_cost(tmp, 20)
        gate = gate_cost(tmp, waiters=24, seconds=20)
    sampler = sampler_cost(20, 30)
    print()
    print("| unit | how | wall (s) | CPU (s) | CPU vs direct |")
    print("|---|---|---|---|---|")
    for r in rows:
        direct = next(x for x in rows if x["unit"] == r["unit"] and x["config"] == "direct")
        print(
            f"| {r['unit']} | {r['config']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{r['cpu_s'] / direct['cpu_s'] - 1:+.1%} |"
        )
    print()
    print("| what the wrapper adds to any compile | how | CPU (ms, median of 20) |")
    print("|---|---|---|")
    for r in fixed:
        print(f"| {r['unit']} | {r['config']} | {r['cpu_s'] * 1000:.0f} |")
    print()
    print(
        f"second preprocessor passes over DeepGEMM's unit (median of 3): -M (kiln's object "
        f"cache before this change, on every compile without a depfile) {passes['-M']:.1f} "
        f"CPU-s; -E (ccache's preprocessor mode on a cold miss) {passes['-E']:.1f} CPU-s"
    )
    print(
        f"compile gate: {gate['waiters']} compiles waiting use "
        f"{gate['cpu_per_waiter_s_per_s'] * 1000:.2f} ms CPU per second each "
        f"({gate['cpu_per_waiter_s_per_s'] * gate['waiters']:.1%} of a core for all of them); "
        f"draining the queue through one slot: {gate['drain_s_per_compile'] * 1000:.0f} ms "
        f"per compile (admission + Python start of an empty compile)"
    )
    print(f"memory sampler: {sampler * 1000:.2f} ms CPU per second over 30 processes")
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / "bench-overhead.json").write_text(
        json.dumps(
            {
                "units": rows,
                "fixed": fixed,
                "passes": passes,
                "gate": gate,
                "sampler_cpu_per_s": sampler,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
