"""kiln's speed against the naive serial recipe (issue 6), on this machine.

A fixture of three upstreams (torch CUDA extensions, each ``--kernels`` translation
units of templated device code compiled for sm_100a and sm_103a, plus a binding)
is made as git repositories and served through a mirrors file, as a user behind a
firewall would. Then, ``--rounds`` times each (the table shows medians):

- cold: ``kiln build`` with empty compiler and artifact caches and no work trees,
  against the naive recipe (clone, ``git apply``, ``pip wheel`` with ``MAX_JOBS=1``,
  one upstream after the other), alternating;
- no-op: ``kiln build`` again, nothing changed;
- one patch changed: a new version of the one patch (it targets ops_a only);
- cache-warm clean: work trees, artifact cache and release deleted, ccache kept;
- the floor: the compile CPU-seconds of a cold build (kiln's compiler wrapper
  measures every compile) divided by the cores.

Peak memory is sampled over each run's whole process tree (kiln's memwatch, the
same sampler for both) and compared with the memory budget kiln planned with.

    nox -s bench_speed                  # or: python benchmarks/speed.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kiln.config.models import Profile  # noqa: E402
from kiln.inside import memwatch  # noqa: E402
from kiln.release import manifest as manifest_io  # noqa: E402
from kiln.sources import gitrepo  # noqa: E402
from kiln.toolchain import buildenv  # noqa: E402

BASE_URL = "https://bench.invalid/"
UPSTREAMS = ("ops_a", "ops_b", "ops_c")
ARCHS = ["sm_100a", "sm_103a"]
PROFILE = {
    "cuda": "13.0",
    "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    "torch": "2.14.1+cu130",
    "archs": ARCHS,
    "build_tools": ["setuptools==80.9.0", "wheel==0.45.1", "ninja==1.13.0"],
}
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

KERNEL = """\
#define SEED {seed}
#include <cuda_runtime.h>
// Templated device code, instantiated 18 ways: a few seconds of nvcc per arch.
template <int TILE, int UNROLL, typename T>
__global__ void kern_{name}_{i}(const T* __restrict__ a, T* __restrict__ b, int n) {{
  __shared__ T tile[TILE];
  int i = blockIdx.x * TILE + threadIdx.x;
  T acc = T(0);
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {{
    int j = (i + u * 7) % n;
    tile[threadIdx.x % TILE] = a[j] * T(u + 1);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; k += 4) acc += tile[(threadIdx.x + k) % TILE] * T(k + SEED);
    __syncthreads();
  }}
  if (i < n) b[i] = acc;
}}
#define INST(T, TILE, U) template __global__ void kern_{name}_{i}<TILE, U, T>(const T*, T*, int);
#define ALL_U(T, TILE) INST(T, TILE, 4) INST(T, TILE, 8) INST(T, TILE, 16)
#define ALL(T) ALL_U(T, 64) ALL_U(T, 128)
ALL(float) ALL(double) ALL(int)
"""

MIT = """\
MIT License

Copyright (c) 2026 kiln benchmark fixture

Permission is hereby granted, free of charge, to any person obtaining a copy of this
software, to deal in the Software without restriction, subject to the condition that
this notice is included in all copies. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT
WARRANTY OF ANY KIND.
"""

BINDING = """\
#include <Python.h>
static struct PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit__C(void) {{ return PyModule_Create(&mod); }}
"""

SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

sources = ["csrc/binding.cpp"] + ["csrc/k%d.cu" % i for i in range({kernels})]
setup(
    name="{name}",
    version="1.0.0",
    packages=["{name}"],
    ext_modules=[
        CUDAExtension(
            "{name}._C", sources, extra_compile_args={{"cxx": ["-O2"], "nvcc": ["-O3"]}}
        )
    ],
    cmdclass={{"build_ext": BuildExtension}},
)
"""


def patch_text(variant: int) -> str:
    """A patch of ops_a's first kernel: a new constant, so one TU compiles anew."""
    return (
        "diff --git a/csrc/k0.cu b/csrc/k0.cu\n"
        "--- a/csrc/k0.cu\n"
        "+++ b/csrc/k0.cu\n"
        "@@ -1,2 +1,2 @@\n"
        "-#define SEED 1\n"
        f"+#define SEED {1000 + variant}\n"
        " #include <cuda_runtime.h>\n"
    )


def make_fixture(root: Path, kernels: int) -> tuple[Path, Path]:
    """(workspace, mirrors file): three upstream repositories and a kiln workspace."""
    ups = root / "upstreams"
    ws = root / "workspace"
    shutil.rmtree(ws, ignore_errors=True)
    (ws / "vendors").mkdir(parents=True)
    (ws / "patches").mkdir()
    for name in UPSTREAMS:
        files: dict[str, bytes | str] = {
            "setup.py": SETUP.format(name=name, kernels=kernels),
            f"{name}/__init__.py": "from . import _C  # noqa: F401\n",
            "LICENSE": MIT,
            "csrc/binding.cpp": BINDING.format(),
        }
        for i in range(kernels):
            files[f"csrc/k{i}.cu"] = KERNEL.format(seed=i + 1, name=name, i=i)
        (sha,) = gitrepo.make_repo(ups / name, [gitrepo.CommitSpec(f"{name}", files)])
        (ws / "vendors" / f"{name}.toml").write_text(
            f'[source]\nurl = "{BASE_URL}{name}"\ncommit = "{sha}"\n'
            f'license = "LICENSE"\nlicense_id = "MIT"\n\n'
            f'[build]\nkind = "wheel"\narchs = {json.dumps(ARCHS)}\n'
            f'arch_control = "torch-arch-list"\nmem_per_job_gib = 1.0\n'
        )
    (ws / "kiln.toml").write_text(
        '[release]\nname = "kiln-bench"\n\n[profile]\n'
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in PROFILE.items())
    )
    (ws / "patches" / "series.toml").write_text(
        '[[patch]]\nfile = "ops_a-seed.patch"\ntarget = "ops_a"\n'
    )
    (ws / "patches" / "ops_a-seed.patch").write_text(patch_text(0))
    mirrors = root / "mirrors.toml"
    mirrors.write_text(f'[mirrors]\n"{BASE_URL}" = "{ups}/"\n')
    return ws, mirrors


def measured(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> dict[str, Any]:
    """Run ``cmd``: wall seconds, CPU seconds of its whole tree, peak RSS of the tree."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with memwatch.Watcher(proc.pid, interval=0.25) as watch:
        out, _ = proc.communicate()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    return {"wall_s": wall, "peak_gib": watch.peak_kib / 2**20, "output": out}


class Bench:
    def __init__(self, root: Path, ws: Path, mirrors: Path, python: Path) -> None:
        self.root, self.ws, self.mirrors, self.python = root, ws, mirrors, python
        self.release = root / "artifacts" / "kiln-bench"

    def kiln(self) -> dict[str, Any]:
        cmd = [
            *(sys.executable, "-m", "kiln", "build", "--workspace", str(self.ws)),
            *("--artifacts", str(self.root / "artifacts"), "--work", str(self.root / "work")),
            *("--mirrors", str(self.mirrors), "--offline", "--runner", "local"),
            *("--python", str(self.python), "--cuda-home", CUDA_HOME),
            *("--compiler-cache", str(self.root / "ccache")),
            *("--artifact-cache", str(self.root / "acache")),
        ]
        run = measured(cmd)
        run["manifest"] = manifest_io.read(self.release / "manifest.json").data()
        return run

    def clean(self, keep_ccache: bool) -> None:
        for name in ("work", "artifacts", "acache", *(() if keep_ccache else ("ccache",))):
            shutil.rmtree(self.root / name, ignore_errors=True)

    def naive(self) -> dict[str, Any]:
        """The serial recipe: each upstream cloned, patched and `pip wheel`ed in turn."""
        script = self.root / "naive.sh"
        lines = ["set -euo pipefail", f'rm -rf "{self.root}/naive"']
        for name in UPSTREAMS:
            src = self.root / "upstreams" / name
            tree = self.root / "naive" / name
            lines.append(f'git clone --quiet "{src}" "{tree}"')
            if name == "ops_a":
                lines.append(f'git -C "{tree}" apply "{self.ws}/patches/ops_a-seed.patch"')
            lines.append(
                # CCACHE_DISABLE: torch puts ccache in front of the compiler when it is
                # installed; the naive recipe's runs must be cold too.
                f'(cd "{tree}" && CCACHE_DISABLE=1 MAX_JOBS=1 TORCH_CUDA_ARCH_LIST="10.0a;10.3a" '
                f'CUDA_HOME="{CUDA_HOME}" "{self.python}" -m pip wheel --no-build-isolation '
                f'--no-deps --no-cache-dir -q -w "{self.root}/naive/wheels" .)'
            )
        script.write_text("\n".join(lines) + "\n")
        return measured(["bash", str(script)])


def _median(runs: list[dict[str, Any]]) -> float:
    return float(statistics.median(r["wall_s"] for r in runs))


def _statuses(run: dict[str, Any]) -> dict[str, str]:
    vendors = run["manifest"]["vendors"]
    return {n: v["caches"]["artifact"]["status"] for n, v in vendors.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernels", type=int, default=8, help="translation units per upstream")
    ap.add_argument("--root", type=Path, default=None)
    ap.add_argument(
        "--public",
        action="store_true",
        help="the real upstreams of examples/public instead of the fixture (speed_public.py)",
    )
    ap.add_argument(
        "--bundles",
        type=Path,
        default=Path(os.environ.get("KILN_BUNDLES", REPO.parent / "shared" / "upstreams")),
        help="with --public: the folder of the upstreams' git bundles",
    )
    ap.add_argument("--profile", default=None, help="with --public: a [profiles.NAME] of it")
    ap.add_argument(
        "--learn",
        action="store_true",
        help="with --public: first a kiln build with nothing learned (reported apart)",
    )
    args = ap.parse_args()
    if args.public:
        import speed_public

        speed_public.main(args)
        return
    args.root = args.root or REPO / "build" / "bench-speed"
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    ws, mirrors = make_fixture(root, args.kernels)
    profile = Profile.model_validate(PROFILE)
    python = buildenv.build_python(profile, REPO / ".kiln-cache", None, root / "logs")
    bench = Bench(root, ws, mirrors, python)
    cores = os.cpu_count() or 1

    cold, naive, noop, patched, warm = [], [], [], [], []
    for i in range(args.rounds):
        naive.append(bench.naive())
        bench.clean(keep_ccache=False)
        cold.append(bench.kiln())
        print(
            f"round {i + 1}: naive {naive[-1]['wall_s']:.1f} s, "
            f"kiln cold {cold[-1]['wall_s']:.1f} s"
        )
    for _ in range(args.rounds):
        noop.append(bench.kiln())
        assert set(_statuses(noop[-1]).values()) == {"hit"}, _statuses(noop[-1])
    for i in range(args.rounds):
        (ws / "patches" / "ops_a-seed.patch").write_text(patch_text(i + 1))
        patched.append(bench.kiln())
        got = _statuses(patched[-1])
        assert got == {"ops_a": "miss", "ops_b": "hit", "ops_c": "hit"}, got
    for _ in range(args.rounds):
        bench.clean(keep_ccache=True)
        warm.append(bench.kiln())

    vendors = cold[-1]["manifest"]["vendors"]
    cpu = [
        sum(v["schedule"]["compile_cpu_s"] for v in r["manifest"]["vendors"].values()) for r in cold
    ]
    floor = statistics.median(cpu) / cores
    budget = cold[-1]["manifest"]["scheduler"]["mem_gib"]
    ops_a_cold = statistics.median(
        sum(r["manifest"]["vendors"]["ops_a"]["timings"].values()) for r in cold
    )
    ops_a_patch = statistics.median(
        sum(r["manifest"]["vendors"]["ops_a"]["timings"].values()) for r in patched
    )
    t_cold, t_naive = _median(cold), _median(naive)
    rows = [
        ("cold: naive serial (pip wheel, MAX_JOBS=1)", naive, "", ""),
        ("cold: kiln build", cold, f"{t_cold / t_naive:.2f} of naive", "<= 0.60"),
        ("no-op: kiln build, nothing changed", noop, f"{_median(noop):.1f} s", "< 3 s"),
        (
            "one patch changed (ops_a rebuilds, 2 reused)",
            patched,
            f"ops_a {ops_a_patch:.1f} s vs {ops_a_cold:.1f} s cold",
            "",
        ),
        (
            "cache-warm clean build (ccache kept)",
            warm,
            f"{_median(warm) / t_cold:.0%} of cold",
            "<= 15%",
        ),
    ]
    print()
    print(
        f"machine: {cores} cores, {memwatch_total_gib():.1f} GiB RAM; fixture: "
        f"{len(UPSTREAMS)} upstreams x {args.kernels} kernels + binding, archs "
        f"{', '.join(ARCHS)}; medians of {args.rounds}"
    )
    print()
    print("| run | median wall (s) | all runs (s) | result | target | peak memory (GiB) |")
    print("|---|---|---|---|---|---|")
    for label, runs, result, target in rows:
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in runs)
        peak = max(r["peak_gib"] for r in runs)
        print(f"| {label} | {_median(runs):.1f} | {walls} | {result} | {target} | {peak:.2f} |")
    over = [r for runs in (cold, noop, patched, warm) for r in runs if r["peak_gib"] > budget]
    print()
    print(
        f"memory budget kiln planned with: {budget:.1f} GiB; kiln runs over it: {len(over)} "
        f"(largest kiln peak {max(r['peak_gib'] for r in cold + noop + patched + warm):.2f} GiB)"
    )
    print(
        f"floor: compile CPU-seconds of a cold build {statistics.median(cpu):.1f} / {cores} "
        f"cores = {floor:.1f} s; kiln cold {t_cold:.1f} s = {t_cold / floor:.2f} x floor "
        f"(target <= 1.2)"
    )
    print(
        "scheduler's choices (cold): "
        + "; ".join(
            f"{n}: MAX_JOBS {v['schedule']['max_jobs']}, "
            f"{v['schedule']['mem_per_job_gib']} GiB/job "
            f"({v['schedule']['estimate_source']}), measured job peak "
            f"{v['schedule']['peak_job_gib']} GiB"
            for n, v in sorted(vendors.items())
        )
    )
    strip = ("output", "manifest")
    results = {
        k: [{x: y for x, y in r.items() if x not in strip} for r in v]
        for k, v in {
            "naive": naive,
            "cold": cold,
            "noop": noop,
            "patch": patched,
            "warm": warm,
        }.items()
    }
    (root / "results.json").write_text(json.dumps(results, indent=1))


def memwatch_total_gib() -> float:
    with open("/proc/meminfo") as fh:
        return int(fh.readline().split()[1]) / 2**20


if __name__ == "__main__":
    main()
