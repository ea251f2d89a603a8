"""Many cores (issue 24): kiln against a careful user on the 16-core GPU machine, side by
side in one command, for FlashMLA with both archs (sm_90a + sm_100f) and for the three
public upstreams (DeepGEMM, DeepEP, FlashMLA) of examples/public, from their git bundles.

Runs, per workload, in this order (each in folders of its own):
- naive: each upstream cloned from its mirror with its submodules, then
  ``MAX_JOBS=<cores> NVCC_THREADS=2 pip wheel --no-build-isolation``, one after the
  other, with the environment fixes a user writes by hand (torch's pip CUDA headers and
  CCCL on the include path, a libnvrtc link name and a libcuda stub on LIBRARY_PATH,
  NCCL's lib folder, a compiler wrapper appending the recipe's C++ flags) and each
  recipe's own settings (its env, TORCH_CUDA_ARCH_LIST or arch toggles);
- kiln cold, nothing learned: ``kiln build`` with a fresh ``--cache``, no learned.json,
  ``--no-compiler-cache --no-artifact-cache`` (its timings report drawn afterwards,
  outside the measured wall, by ``kiln timings``);
- kiln cold from learned data: the same in other folders (another workspace copy, work
  tree, artifacts, fresh cache, caches off), ``--learned-from`` the previous run's
  manifest: another machine's first build, scheduled from what that run learned.

kiln's runs prove what they build (the import proof, as every build does): where there is
an index, in the consumer environment install.sh makes; on the GPU machine, which has none,
``--proof-env build-python`` (the build Python's own torch, checked against the
requirements).

Beside each kiln run its bound, from its manifest (``scheduler.bound``): the critical
path (longest unit + its step's links + packaging) and the CPU floor (compile CPU-s / CPU
slots); the naive row is read against the bound kiln measured for the same work. The
targets (issue 24): kiln from learned data within 1.15 x max(critical path, CPU floor)
and faster than naive; kiln with nothing learned no slower than naive.

Runbook (the device tool, ``/work/.library/device/README.md``; it needs no GPU, only
the machine's 16 cores, its CUDA 13.0 nvcc and its Python 3.12 torch 2.11+cu130). Here,
once, in the project's root::

    echo /.device/ >> .git/info/exclude
    ../shared/device/pack.sh .device/pack            # kiln's wheels + kiln-setup.sh
    mkdir -p .device/upstreams
    cp ../shared/upstreams/*.bundle .device/upstreams/   # all five: 53 MB, fits "only just"
    # FlashMLA alone needs only FlashMLA.bundle and cutlass.bundle (32 MB)

Then ``run`` with ``kind`` nvidia-h200, ``carry`` [".device"], ``timeout_s`` 600. The
three FlashMLA runs together take longer than one call's 10 minutes, so the first call
starts the benchmark in a process session of its own (``setsid``: it outlives the
call, until the machine goes back) and waits; the next call, made within the 30 s the
machine stays warm, waits for the end and brings the results back (at most 8 files
come back from $OUT: the records travel as one tarball)::

    set -e; source .device/pack/kiln-setup.sh .device/pack; B=build/bm; mkdir -p $B
    setsid nohup env PYTHONUNBUFFERED=1 /tmp/kiln-venv/bin/python benchmarks/manycore.py \
      --python "$PY" --bundles .device/upstreams --workload flashmla --out $B/out \
      --proof-env build-python \
      > $B/log 2>&1 < /dev/null & echo $! > $B/pid
    for i in $(seq 585); do kill -0 $(cat $B/pid) 2>/dev/null || break; sleep 1; done
    tail -3 $B/log

    B=build/bm; for i in $(seq 590); do kill -0 $(cat $B/pid) 2>/dev/null || break; sleep 1; done
    cat $B/log; cp $B/out/manycore.md $B/out/results.json $OUT/; tar czf $OUT/records.tgz -C $B out

The public three (``--workload public``) build DeepEP, which needs an NCCL whose
``nccl.h`` declares ``ncclCommProperties``: the GPU machine's torch 2.11 brings NCCL
2.28.9, which does not, and the 252 MB ``nvidia-nccl-cu13`` wheel that would does not fit
a carry; there, ``--vendors deepgemm flashmla``. ``--report`` prints (and writes to
``--out``/manycore.md) the table of every stored run; each workload's kiln cold run
leaves ``learned-<workload>.json`` in ``--out``: what to commit as
examples/public/learned.json. If the machine lacks DeepEP's ``infiniband/mlx5dv.h``
(libibverbs-dev), kiln's preflight says so and the public workload stops before building.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomlkit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from speed_public import measured  # noqa: E402

from kiln.config.mirrors import Mirrors  # noqa: E402
from kiln.config.workspace import Workspace, arch_to_torch  # noqa: E402
from kiln.orchestrate import learned  # noqa: E402
from kiln.plan import jobs  # noqa: E402
from kiln.plan.cpus import cpu_slots  # noqa: E402
from kiln.release import manifest as manifest_io  # noqa: E402
from kiln.sources import bundles  # noqa: E402

WORKLOADS = {"flashmla": ["flashmla"], "public": ["deepgemm", "deepep", "flashmla"]}
BUNDLES_OF = {"flashmla": {"FlashMLA.bundle", "cutlass.bundle"}}
RUNS = ("naive", "cold", "learned")
LABELS = {
    "naive": "naive: MAX_JOBS={cores} NVCC_THREADS=2 pip wheel, fixes by hand",
    "cold": "kiln cold, nothing learned",
    "learned": "kiln cold from another run's learned data",
}
TARGET_LEARNED = 1.15
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")


def python_facts(python: str) -> dict[str, str]:
    code = (
        "import json, sys, sysconfig, torch; print(json.dumps({'python': "
        "f'{sys.version_info[0]}.{sys.version_info[1]}', 'torch': torch.__version__, "
        "'site': sysconfig.get_paths()['purelib']}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    facts: dict[str, str] = json.loads(out.stdout)
    return facts


def workspace_copy(dest: Path, workload: str, vendors: list[str], facts: dict[str, str]) -> Path:
    """examples/public with the build Python's version and torch in its profile, only the
    vendors of ``workload`` (and their bundles), and no learned.json: nothing learned."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(REPO / "examples" / "public", dest)
    (dest / learned.FILE_NAME).unlink(missing_ok=True)
    doc = tomlkit.parse((dest / "kiln.toml").read_text())
    doc["profile"]["python"] = facts["python"]
    doc["profile"]["torch"] = facts["torch"]
    (dest / "kiln.toml").write_text(tomlkit.dumps(doc))
    for toml in (dest / "vendors").glob("*.toml"):
        if toml.stem not in vendors:
            toml.unlink()
    wanted = BUNDLES_OF.get(workload)
    if wanted:
        spec = tomlkit.parse((dest / bundles.SPEC_FILE).read_text())
        for url in [u for u, name in spec["bundles"].items() if name not in wanted]:
            del spec["bundles"][url]
        (dest / bundles.SPEC_FILE).write_text(tomlkit.dumps(spec))
    return dest


class Bench:
    def __init__(self, root: Path, workload: str, vendors: list[str], args: Any) -> None:
        self.root = root / workload
        self.root.mkdir(parents=True, exist_ok=True)
        self.workload, self.vendors, self.python = workload, vendors, args.python
        self.profile: str | None = args.profile
        self.proof_env: str = args.proof_env
        self.out: Path | None = args.out
        self.cores = cpu_slots(None).count
        self.facts = python_facts(args.python)
        self.template = workspace_copy(self.root / "workspace", workload, vendors, self.facts)
        self.mirrors = bundles.mirrors_from_bundles(
            self.template, args.bundles.resolve(), root / "mirrors"
        )
        self.ws = Workspace(self.template, self.profile)

    # ------------------------------------------------------------------ kiln
    def kiln(self, run: str, learned_from: Path | None = None) -> dict[str, Any]:
        home = self.root / run
        shutil.rmtree(home, ignore_errors=True)
        ws = workspace_copy(home / "workspace", self.workload, self.vendors, self.facts)
        cmd = [
            *(sys.executable, "-m", "kiln", "build", "--workspace", str(ws)),
            *("--artifacts", str(home / "artifacts"), "--work", str(home / "work")),
            *("--cache", str(home / "cache"), "--mirrors", str(self.mirrors), "--offline"),
            *("--runner", "local", "--python", self.python),
            *("--no-compiler-cache", "--no-artifact-cache"),
            *(("--learned-from", str(learned_from)) if learned_from else ()),
            *("--proof-env", self.proof_env),
            *(("--profile", self.profile) if self.profile else ()),
            *self.vendors,
        ]
        began = time.time()
        out = measured(cmd)
        release = home / "artifacts" / self.ws.release.name
        m: dict[str, Any] = manifest_io.read(release / "manifest.json").data()
        sched = m["scheduler"]
        summary = [ln for ln in out["output"].splitlines() if ln.startswith("bound: ")]
        logs = home / "artifacts" / "logs" / self.ws.release.name
        # The timings report is drawn after the measured wall (``kiln timings`` on the
        # logs): a user's build does not draw it unless asked (``--timings``).
        subprocess.run([sys.executable, "-m", "kiln", "timings", str(release)], check=False)
        self._keep(
            run,
            [
                release / "manifest.json",
                logs / "run.json",
                *logs.glob("*.jobs"),
                *logs.glob("timings*"),
            ],
        )
        return {
            "timeline": kiln_timeline(logs, began, out["wall_s"]),
            "wall_s": out["wall_s"],
            "cpu_s": out["cpu_s"],
            "peak_gib": out["peak_gib"],
            "bound": sched.get("bound"),
            "bound_line": summary[-1] if summary else "",
            "compiles_at_once": sched.get("compiles_at_once"),
            "cpus": sched.get("cpus"),
            "mem_gib": sched.get("mem_gib"),
            "manifest": str(release / "manifest.json"),
            "vendors": {
                name: {
                    k: v["schedule"].get(k)
                    for k in (
                        "max_jobs",
                        "nvcc_threads",
                        "estimate_source",
                        "mem_per_job_gib",
                        "compile_cpu_s",
                        "longest_unit",
                        "longest_unit_s",
                        "critical_path_s",
                    )
                }
                for name, v in sorted(m["vendors"].items())
            },
        }

    def _keep(self, run: str, files: list[Path]) -> None:
        """Copies of a run's records beside the results (they travel back in $OUT)."""
        if self.out is None:
            return
        dest = self.out / f"{self.workload}-{run}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for f in files:
            if f.is_file():
                shutil.copy2(f, dest / f.name)

    # ----------------------------------------------------------------- naive
    def _hand_fixes(self) -> Path:
        """What a user writes by hand on this host (as speed_public.py's naive run)."""
        fix = self.root / "naive-fixes"
        shutil.rmtree(fix, ignore_errors=True)
        (fix / "lib").mkdir(parents=True)
        (fix / "bin").mkdir()
        nvrtc = Path(self.facts["site"]) / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
        (fix / "lib" / "libnvrtc.so").symlink_to(nvrtc)
        (fix / "empty.c").write_text("")
        stub = fix / "lib" / "libcuda.so"
        subprocess.run(
            ["gcc", "-shared", "-o", stub, "-Wl,-soname,libcuda.so.1", fix / "empty.c"], check=True
        )
        return fix

    def _env(self, name: str, fix: Path) -> dict[str, str]:
        """The recipe's own settings, as a user reads them off its README, plus the fixes."""
        b = self.ws.vendors[name].build
        site = self.facts["site"]
        env = dict(b.env)  # with a toggles recipe, its toggles for the archs left out
        if b.arch_control == "torch-arch-list":
            env["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_to_torch(a) for a in b.archs)
        includes = [f"{site}/nvidia/cu13/include", f"{CUDA_HOME}/include/cccl"]
        env["CPLUS_INCLUDE_PATH"] = ":".join(includes)
        env["LIBRARY_PATH"] = f"{fix}/lib:{site}/nvidia/nccl/lib"
        if b.cxx_append_flags:
            flags = " ".join(b.cxx_append_flags)
            for cc in ("gcc", "g++"):
                wrapper = fix / "bin" / f"{name}-{cc}"
                wrapper.write_text(f'#!/bin/sh\nexec {cc} "$@" {flags}\n')
                wrapper.chmod(0o755)
            env["CC"], env["CXX"] = (
                str(fix / "bin" / f"{name}-gcc"),
                str(fix / "bin" / f"{name}-g++"),
            )
        return env

    def naive(self) -> dict[str, Any]:
        fix = self._hand_fixes()
        rules = Mirrors.load(self.mirrors).rules
        insteadof = " ".join(f"-c url.{m}.insteadOf={u}" for u, m in sorted(rules.items()))
        base = {
            "CCACHE_DISABLE": "1",
            "MAX_JOBS": str(self.cores),
            "NVCC_THREADS": "2",
            "CUDA_HOME": CUDA_HOME,
        }
        stamps = self.root / "naive-stamps.txt"
        lines = ["set -euo pipefail", f'rm -rf "{self.root}/naive"', f': > "{stamps}"']
        for name in self.vendors:
            vendor = self.ws.vendors[name]
            tree = self.root / "naive" / name
            src = Mirrors.load(self.mirrors).map(vendor.source.url)
            env = " ".join(f"{k}='{v}'" for k, v in {**base, **self._env(name, fix)}.items())
            lines += [
                f'echo "{name} clone $(date +%s.%N)" >> "{stamps}"',
                f'git clone --quiet "{src}" "{tree}"',
                f'git -C "{tree}" checkout --quiet {vendor.source.commit}',
                f'git -C "{tree}" -c protocol.file.allow=always {insteadof} '
                "submodule --quiet update --init --recursive",
                f'echo "{name} pip $(date +%s.%N)" >> "{stamps}"',
                f'(cd "{tree}" && env PATH="{CUDA_HOME}/bin:$PATH" {env} "{self.python}" -m pip '
                "wheel --no-build-isolation --no-deps --no-cache-dir -q "
                f'-w "{self.root}/naive/wheels" .)',
                f'echo "{name} done $(date +%s.%N)" >> "{stamps}"',
            ]
        script = self.root / "naive.sh"
        script.write_text("\n".join(lines) + "\n")
        began = time.time()
        out = measured(["bash", str(script)])
        ninja_logs = sorted((self.root / "naive").glob("*/build/*/.ninja_log"))
        self._keep("naive", [stamps, *ninja_logs])
        return {
            **{k: out[k] for k in ("wall_s", "cpu_s", "peak_gib")},
            "timeline": naive_timeline(stamps, ninja_logs, began),
        }


def kiln_timeline(logs: Path, began: float, wall: float) -> dict[str, Any]:
    """Where a kiln run's wall went: from its start to the first compile, the longest
    compile (its start and wall), the last compile's end, and the run's end (seconds from
    the start, from the compiler wrapper's records)."""
    runs = [j for f in sorted(logs.glob("*.jobs")) for j in jobs.job_stats(f)]
    compiled = [j for j in runs if j.get("result") == "compiled" and "start" in j]
    if not compiled:
        return {}
    longest = max(compiled, key=lambda j: j["wall_s"])
    last = max(j["start"] + j["wall_s"] for j in runs if "start" in j)
    return {
        "first_compile_s": round(min(j["start"] for j in compiled) - began, 1),
        "longest_unit": longest["source"],
        "longest_start_s": round(longest["start"] - began, 1),
        "longest_wall_s": round(longest["wall_s"], 1),
        "longest_cpu_s": round(longest["cpu_s"], 1),
        "last_compiler_end_s": round(last - began, 1),
        "end_s": round(wall, 1),
    }


def naive_timeline(stamps: Path, ninja_logs: list[Path], began: float) -> dict[str, Any]:
    """The same for the naive run: each upstream's clone, pip start and end (seconds from
    the start), and from ninja's own log its span and its longest unit."""
    out: dict[str, Any] = {}
    for line in stamps.read_text().splitlines():
        name, what, at = line.split()
        out.setdefault(name, {})[what + "_s"] = round(float(at) - began, 1)
    for log in ninja_logs:
        rows = [ln.split("\t") for ln in log.read_text().splitlines() if not ln.startswith("#")]
        spans = [(int(r[0]) / 1000, int(r[1]) / 1000, r[3]) for r in rows if len(r) >= 4]
        if not spans:
            continue
        longest = max(spans, key=lambda r: r[1] - r[0])
        out.setdefault(log.parents[2].name, {}).update(
            ninja_span_s=round(max(e for _, e, _ in spans), 1),
            longest_unit=longest[2],
            longest_start_s=round(longest[0], 1),
            longest_wall_s=round(longest[1] - longest[0], 1),
        )
    return out


def threads_per_core() -> int | None:
    """CPUs per physical core (2: hyperthreads share one core's units), None unknown."""
    siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    try:
        text = siblings.read_text().strip()
    except OSError:
        return None
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi) - int(lo) + 1 if hi else 1
    return count


def _load(root: Path) -> dict[str, Any]:
    path = root / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _save(root: Path, results: dict[str, Any]) -> None:
    (root / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def report(results: dict[str, Any]) -> str:
    """The table: each run's wall against its bound (the naive run against kiln's)."""
    machine = results.get("machine", {})
    lines = [
        f"machine: {machine.get('cores')} CPU slots ({machine.get('threads_per_core')} per "
        f"core), {machine.get('mem_gib', 0):.0f} GiB; "
        f"build Python {machine.get('python')} with torch {machine.get('torch')}; "
        f"nvcc from {CUDA_HOME}; profile {machine.get('profile', 'default')}",
        "",
        "| workload | run | wall (s) | CPU (s) | CPU floor (s) | critical path (s) | "
        "wall / bound | vs naive | compiles at once | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for workload in WORKLOADS:
        runs = results.get(workload, {})
        if not runs:
            continue
        reference = (runs.get("cold") or runs.get("learned") or {}).get("bound") or {}
        naive = runs.get("naive", {}).get("wall_s")
        for run in RUNS:
            r = runs.get(run)
            if not r:
                continue
            b = r.get("bound") or reference
            limit = max(b.get("critical_path_s", 0.0), b.get("cpu_floor_s", 0.0))
            ratio = r["wall_s"] / limit if limit else 0.0
            vs = f"{r['wall_s'] / naive:.2f}" if naive and run != "naive" else ""
            if run == "learned":
                ok = ratio <= TARGET_LEARNED and (not naive or r["wall_s"] < naive)
                target = f"<= {TARGET_LEARNED} x bound, < naive: {'met' if ok else 'missed'}"
            elif run == "cold" and naive:
                target = f"<= naive: {'met' if r['wall_s'] <= naive else 'missed'}"
            else:
                target = ""
            own = "" if r.get("bound") else " (kiln's)"
            lines.append(
                f"| {workload} | {LABELS[run].format(cores=machine.get('cores'))} | "
                f"{r['wall_s']:.1f} | {r['cpu_s']:.0f} | {b.get('cpu_floor_s', 0):.1f}{own} | "
                f"{b.get('critical_path_s', 0):.1f}{own} | {ratio:.2f} | {vs} | "
                f"{r.get('compiles_at_once') or ''} | {target} |"
            )
            if r.get("bound_line"):
                notes.append(f"- {workload}, {run}: {r['bound_line']}")
            if r.get("timeline"):
                notes.append(f"  - timeline (s from its start): {json.dumps(r['timeline'])}")
            for name, v in (r.get("vendors") or {}).items():
                notes.append(
                    f"  - {name}: MAX_JOBS {v['max_jobs']}, NVCC_THREADS {v['nvcc_threads']}, "
                    f"{v['mem_per_job_gib']} GiB/job ({v['estimate_source']}), compiles "
                    f"{v['compile_cpu_s']} CPU-s, longest {v['longest_unit']} "
                    f"{v['longest_unit_s']} s"
                )
    return "\n".join([*lines, "", *notes]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="flashmla")
    ap.add_argument("--runs", default=",".join(RUNS), help="of naive,cold,learned (in order)")
    ap.add_argument("--vendors", nargs="+", default=None, help="the public workload's vendors")
    ap.add_argument("--python", default="python3", help="the build Python (torch in it)")
    ap.add_argument(
        "--profile",
        default=None,
        help="the workspace profile (sm100: FlashMLA without its sm_90a kernels, as CI "
        "builds; for 2 cores, where both archs double FlashMLA's time)",
    )
    ap.add_argument(
        "--bundles",
        type=Path,
        default=Path(os.environ.get("KILN_BUNDLES", REPO.parent / "shared" / "upstreams")),
    )
    ap.add_argument(
        "--proof-env",
        choices=["install", "build-python"],
        default="install",
        help="kiln's import proof's consumer environment (build-python: the build Python's "
        "own torch, for the GPU machine, which has no index to install from)",
    )
    ap.add_argument("--root", type=Path, default=REPO / "build" / "bench-manycore")
    ap.add_argument("--out", type=Path, default=None, help="copy the results here ($OUT)")
    ap.add_argument("--report", action="store_true", help="only print the stored results")
    ap.add_argument(
        "--learned-from",
        type=Path,
        default=None,
        help="the learned run's data when the cold run's manifest is not on this machine "
        "(a manifest, or the learned-<workload>.json a cold run left in $OUT)",
    )
    args = ap.parse_args()
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    results = _load(root)
    if not args.report:
        vendors = args.vendors or WORKLOADS[args.workload]
        bench = Bench(root, args.workload, vendors, args)
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) / 2**20
        results["machine"] = {
            "cores": bench.cores,
            "threads_per_core": threads_per_core(),
            "mem_gib": mem,
            "profile": args.profile or "default",
            **bench.facts,
        }
        runs = results.setdefault(args.workload, {})
        for run in args.runs.split(","):
            if run == "naive":
                runs["naive"] = bench.naive()
            elif run == "cold":
                runs["cold"] = bench.kiln("cold")
                if args.out:
                    data = learned.read(Path(runs["cold"]["manifest"]), "the cold run's")
                    (args.out / f"learned-{args.workload}.json").write_text(
                        json.dumps({"schema": learned.SCHEMA_ID, "vendors": data}, indent=1)
                    )
            elif run == "learned":
                source = args.learned_from or runs.get("cold", {}).get("manifest")
                if not source or not Path(source).is_file():
                    sys.exit("the learned run reads the cold run's manifest: run cold first")
                runs["learned"] = bench.kiln("learned", Path(source).resolve())
            else:
                sys.exit(f"--runs: unknown run {run!r} (naive, cold, learned)")
            print(f"{args.workload} {run}: {runs[run]['wall_s']:.1f} s", flush=True)
            _save(root, results)
            if args.out:  # after each run: a call cut short still brings back what ran
                shutil.copy2(root / "results.json", args.out / "results.json")
    table = report(results)
    print(table)
    if args.out:
        (args.out / "manycore.md").write_text(table)
        shutil.copy2(root / "results.json", args.out / "results.json")


if __name__ == "__main__":
    main()
