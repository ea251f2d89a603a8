"""kiln against the naive serial recipe on the real upstreams (issue 12): the public
DeepGEMM, DeepEP and FlashMLA of examples/public, from their git bundles, on this machine.

- naive: each upstream cloned from its mirror with its submodules, the same patch
  applied (FlashMLA: one translation unit), ``pip wheel --no-build-isolation`` with
  ``MAX_JOBS=1``, one after the other, with the environment fixes a user writes by hand
  on a CPU-only host (torch's pip CUDA headers, CCCL, a libnvrtc link name, an empty
  libcuda stub, NCCL's lib folder, a compiler wrapper appending -std=c++20 for DeepGEMM);
- kiln cold: ``kiln build`` with empty compiler and artifact caches and no work trees
  (bare clones, the build venv and the learned per-unit figures of earlier runs kept);
- no-op, one patch changed (a new version of the FlashMLA patch), cache-warm clean
  (work trees, artifact cache and release deleted, ccache kept).

The floor is the naive run's CPU-seconds divided by the cores. Each command's CPU is its
whole process tree's (``RUSAGE_CHILDREN`` around it). Cold runs alternate.

    nox -s bench_speed -- --public [--profile sm100] [--rounds 1]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kiln.config.mirrors import Mirrors  # noqa: E402
from kiln.config.workspace import Workspace  # noqa: E402
from kiln.inside import memwatch  # noqa: E402
from kiln.release import manifest as manifest_io  # noqa: E402
from kiln.sources import bundles  # noqa: E402
from kiln.toolchain import buildenv  # noqa: E402

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
PATCH_FILE = "flashmla-bench.patch"
PATCHED = "csrc/smxx/decode/combine/combine.cu"


def patch_text(variant: int, first_line: str) -> str:
    """A comment added at the top of one FlashMLA unit: that unit compiles anew."""
    return (
        f"--- a/{PATCHED}\n+++ b/{PATCHED}\n@@ -1 +1,2 @@\n"
        f"+// kiln benchmark patch, variant {variant}\n {first_line}\n"
    )


def measured(cmd: list[str], cwd: Path = REPO, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Wall seconds, CPU seconds of the command's whole tree, peak RSS of the tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with memwatch.Watcher(proc.pid, interval=0.5) as watch:
        out, _ = proc.communicate()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{out[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_gib": watch.peak_kib / 2**20, "output": out}


class PublicBench:
    def __init__(self, root: Path, bundles_dir: Path, profile: str | None) -> None:
        self.root, self.profile = root, profile
        self.ws = root / "workspace"
        shutil.rmtree(self.ws, ignore_errors=True)
        shutil.copytree(REPO / "examples" / "public", self.ws)
        (self.ws / "patches" / "series.toml").write_text(
            f'[[patch]]\nfile = "{PATCH_FILE}"\ntarget = "flashmla"\n'
        )
        self.mirrors = bundles.mirrors_from_bundles(self.ws, bundles_dir, root / "mirrors")
        (self.ws / "patches" / PATCH_FILE).write_text("")
        workspace = Workspace(self.ws, profile)
        self.vendors = workspace.vendors
        flash = self.vendors["flashmla"].source
        text = subprocess.run(
            [
                "git",
                "-C",
                Mirrors.load(self.mirrors).map(flash.url),
                "show",
                f"{flash.commit}:{PATCHED}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.first_line = text.splitlines()[0]
        self.set_patch(0)
        self.python = buildenv.build_python(workspace.profile, REPO / ".kiln-cache", None, root)
        self.site = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.release = root / "artifacts" / "public-upstreams"

    def set_patch(self, variant: int) -> None:
        (self.ws / "patches" / PATCH_FILE).write_text(patch_text(variant, self.first_line))

    # ------------------------------------------------------------------ kiln
    def kiln(self, home: Path | None = None, extra: tuple[str, ...] = ()) -> dict[str, Any]:
        """``kiln build`` with its work, artifacts and caches under ``home`` (default:
        the benchmark's root), ``extra`` arguments after the rest."""
        home = home or self.root
        cmd = [
            *(sys.executable, "-m", "kiln", "build", "--workspace", str(self.ws)),
            *("--artifacts", str(home / "artifacts"), "--work", str(home / "work")),
            *("--mirrors", str(self.mirrors), "--offline", "--runner", "local"),
            *("--python", str(self.python), "--cuda-home", CUDA_HOME),
            *("--compiler-cache", str(home / "ccache")),
            *("--artifact-cache", str(home / "acache")),
            *(("--profile", self.profile) if self.profile else ()),
            *extra,
        ]
        run = measured(cmd)
        release = home / "artifacts" / self.release.name
        run["manifest"] = manifest_io.read(release / "manifest.json").data()
        run["logs"] = home / "artifacts" / "logs" / self.release.name
        return run

    def clean(self, keep_ccache: bool) -> None:
        for name in ("work", "artifacts", "acache", *(() if keep_ccache else ("ccache",))):
            shutil.rmtree(self.root / name, ignore_errors=True)

    # ----------------------------------------------------------------- naive
    def _hand_fixes(self) -> Path:
        """What a user writes by hand on this host (the issue's list)."""
        fix = self.root / "naive-fixes"
        shutil.rmtree(fix, ignore_errors=True)
        (fix / "lib").mkdir(parents=True)
        (fix / "bin").mkdir()
        nvrtc = Path(self.site) / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
        (fix / "lib" / "libnvrtc.so").symlink_to(nvrtc)
        (fix / "empty.c").write_text("")
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-o",
                fix / "lib" / "libcuda.so",
                "-Wl,-soname,libcuda.so.1",
                fix / "empty.c",
            ],
            check=True,
        )
        for cc in ("gcc", "g++"):  # DeepGEMM's setup.py hard-codes -std=c++17
            (fix / "bin" / cc).write_text(f'#!/bin/sh\nexec {cc} "$@" -std=c++20\n')
            (fix / "bin" / cc).chmod(0o755)
        return fix

    def naive(self) -> dict[str, Any]:
        fix = self._hand_fixes()
        rules = Mirrors.load(self.mirrors).rules
        insteadof = " ".join(f"-c url.{m}.insteadOf={u}" for u, m in sorted(rules.items()))
        cu13 = f"{self.site}/nvidia/cu13/include"
        base = (
            f"CCACHE_DISABLE=1 MAX_JOBS=1 NVCC_THREADS=1 CUDA_HOME={CUDA_HOME} "
            f"PATH={CUDA_HOME}/bin:$PATH"
        )
        includes = {"flashmla": f"{cu13}:{CUDA_HOME}/include/cccl"}
        per_vendor = {
            "deepgemm": f"CC={fix}/bin/gcc CXX={fix}/bin/g++ LIBRARY_PATH={fix}/lib "
            f"DG_FORCE_BUILD=1",
            "deepep": f"LIBRARY_PATH={fix}/lib:{self.site}/nvidia/nccl/lib "
            f"TORCH_CUDA_ARCH_LIST='10.0a;10.3a' DISABLE_AGGRESSIVE_PTX_INSTRS=1",
            "flashmla": " ".join(f"{k}={v}" for k, v in self.vendors["flashmla"].build.env.items()),
        }
        lines = ["set -euo pipefail", f'rm -rf "{self.root}/naive"']
        for name, vendor in sorted(self.vendors.items()):
            tree = self.root / "naive" / name
            src = Mirrors.load(self.mirrors).map(vendor.source.url)
            lines += [
                f'git clone --quiet "{src}" "{tree}"',
                f'git -C "{tree}" checkout --quiet {vendor.source.commit}',
                # file:// mirrors: git refuses the file transport for submodules unless allowed
                f'git -C "{tree}" -c protocol.file.allow=always {insteadof} '
                "submodule --quiet update --init --recursive",
            ]
            if name == "flashmla":
                lines.append(f'git -C "{tree}" apply "{self.ws}/patches/{PATCH_FILE}"')
            lines.append(
                f'(cd "{tree}" && env {base} CPLUS_INCLUDE_PATH={includes.get(name, cu13)} '
                f'{per_vendor[name]} "{self.python}" -m pip wheel '
                f'--no-build-isolation --no-deps --no-cache-dir -q -w "{self.root}/naive/wheels" .)'
            )
        script = self.root / "naive.sh"
        script.write_text("\n".join(lines) + "\n")
        return measured(["bash", str(script)])


def _median(runs: list[dict[str, Any]], key: str = "wall_s") -> float:
    return float(statistics.median(r[key] for r in runs))


def _compile_cpu(run: dict[str, Any]) -> float:
    return float(sum(v["schedule"]["compile_cpu_s"] for v in run["manifest"]["vendors"].values()))


def main(args: Any) -> None:
    root = (args.root or REPO / "build" / "bench-speed-public").resolve()
    root.mkdir(parents=True, exist_ok=True)
    bench = PublicBench(root, args.bundles.resolve(), args.profile)
    cores = os.cpu_count() or 1
    naive, cold, noop, patched, warm, first = [], [], [], [], [], []
    if args.learn:  # the recipe's very first build: the gate knows no unit yet (FIFO)
        bench.clean(keep_ccache=False)
        peaks = REPO / ".kiln-cache" / "peaks.json"
        saved = peaks.read_text() if peaks.is_file() else None
        data = json.loads(saved) if saved else {}
        peaks.write_text(json.dumps({k: v for k, v in data.items() if k not in bench.vendors}))
        first.append(bench.kiln())
        print(f"kiln cold, nothing learned: {first[-1]['wall_s']:.0f} s", flush=True)
    for i in range(args.rounds):
        naive.append(bench.naive())
        print(
            f"round {i + 1}: naive {naive[-1]['wall_s']:.0f} s, {naive[-1]['cpu_s']:.0f} CPU-s",
            flush=True,
        )
        bench.clean(keep_ccache=False)
        cold.append(bench.kiln())
        print(
            f"round {i + 1}: kiln cold {cold[-1]['wall_s']:.0f} s, {cold[-1]['cpu_s']:.0f} CPU-s, "
            f"compiles {_compile_cpu(cold[-1]):.0f} CPU-s, at once "
            f"{cold[-1]['manifest']['scheduler'].get('compiles_at_once')}",
            flush=True,
        )
    noop.append(bench.kiln())
    print(f"no-op {noop[-1]['wall_s']:.1f} s", flush=True)
    bench.set_patch(1)
    patched.append(bench.kiln())
    bench.clean(keep_ccache=True)
    warm.append(bench.kiln())

    t_naive, t_cold = _median(naive), _median(cold)
    naive_cpu = _median(naive, "cpu_s")
    floor = naive_cpu / cores
    kiln_compile_cpu = statistics.median(_compile_cpu(r) for r in cold)
    budget = cold[-1]["manifest"]["scheduler"]["mem_gib"]
    at_once = max(r["manifest"]["scheduler"].get("compiles_at_once", 0) for r in cold)
    flash = [r["manifest"]["vendors"]["flashmla"] for r in patched]
    statuses = {
        n: v["caches"]["artifact"]["status"] for n, v in patched[-1]["manifest"]["vendors"].items()
    }
    arch = ", ".join(bench.vendors["flashmla"].build.archs)
    print()
    print(
        f"machine: {cores} cores, {memwatch_total_gib():.1f} GiB RAM; the public DeepGEMM "
        f"54e2261, DeepEP dd758ca, FlashMLA 9241ae3 (FlashMLA {arch}"
        f"{', profile ' + args.profile if args.profile else ''}); {args.rounds} round(s)"
    )
    print()
    print("| run | wall (s) | CPU (s) | result | target | peak memory (GiB) |")
    print("|---|---|---|---|---|---|")
    rows = [
        ("cold: naive serial (pip wheel, MAX_JOBS=1, fixes by hand)", naive, "", ""),
        *(
            [
                (
                    "cold: kiln build, the recipe's first (no learned unit times: FIFO)",
                    first,
                    f"{_median(first) / floor:.2f} x floor",
                    "",
                )
            ]
            if first
            else []
        ),
        (
            "cold: kiln build",
            cold,
            f"{t_cold / t_naive:.2f} of naive; {t_cold / floor:.2f} x floor",
            "<= 1.05 x floor",
        ),
        ("no-op: kiln build, nothing changed", noop, f"{_median(noop):.1f} s", "< 2 s"),
        (
            "one patch changed (FlashMLA rebuilds, 2 reused)",
            patched,
            f"FlashMLA {flash[-1]['schedule']['compiles']} compile(s), "
            f"{flash[-1]['caches']['compiler']['hits']} ccache hits; {statuses}",
            "",
        ),
        (
            "cache-warm clean build (ccache kept)",
            warm,
            f"{_median(warm) / t_cold:.0%} of cold",
            "<= 10%",
        ),
    ]
    for label, runs, result, target in rows:
        print(
            f"| {label} | {_median(runs):.1f} | {_median(runs, 'cpu_s'):.0f} | {result} | "
            f"{target} | {max(r['peak_gib'] for r in runs):.2f} |"
        )
    print()
    print(
        f"floor: the naive run's CPU-seconds {naive_cpu:.0f} / {cores} cores = {floor:.0f} s; "
        f"kiln cold {t_cold:.0f} s = {t_cold / floor:.2f} x floor (target <= 1.05)"
    )
    print(
        f"kiln's compile CPU-seconds {kiln_compile_cpu:.0f} = {kiln_compile_cpu / naive_cpu:.3f} "
        f"x the naive run's {naive_cpu:.0f} (target <= 1.02); most compiles at once "
        f"{at_once} on {cores} CPU slots; memory budget {budget:.1f} GiB, largest kiln peak "
        f"{max(r['peak_gib'] for r in cold + noop + patched + warm):.2f} GiB"
    )
    for r in cold:
        per = {
            n: (v["schedule"]["compile_cpu_s"], v["schedule"]["estimate_source"])
            for n, v in sorted(r["manifest"]["vendors"].items())
        }
        print(f"kiln cold per vendor (compile CPU-s, estimate): {per}")
    strip = ("output", "manifest", "logs")
    results = {
        k: [{x: y for x, y in r.items() if x not in strip} for r in v]
        for k, v in {
            "naive": naive,
            "first": first,
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
