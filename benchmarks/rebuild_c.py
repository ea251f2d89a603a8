"""Benchmark: a full in-place build of a DeepInfer-shaped tree vs `rebuild_c` after a
one-line patch edit, median of 3 each, printed as a table.

    python benchmarks/rebuild_c.py [--variants 2] [--runs 3]

The fixture is examples/demo's tinyinfer (a package whose `_C` has twelve CUDA
translation units and one C++ module), compiled for sm_100a and sm_103a with
TINYINFER_VARIANTS template instantiations per CUDA file (the compile weight). Each
full build starts from an empty work tree and an empty object cache; each rebuild_c
runs on a tree freshly unpacked from the tarball that build made (as install.sh
would), with the prefix-cache patch edited by one line in a C++ source.
Targets (issue #3): rebuild_c under 10% of the full build and under 15 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import tomlkit

from kiln.config.models import Profile
from kiln.config.workspace import Workspace
from kiln.orchestrate import stages
from kiln.orchestrate.options import Options
from kiln.release import archive
from kiln.release import manifest as manifest_io
from kiln.toolchain import buildenv, cudapypi
from kiln.verbs import demo_workspace
from kiln.verbs.rebuild_ext import rebuild_c

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "demo"
PATCH = "tinyinfer-prefix-cache.patch"


def workspace(root: Path, variants: int) -> Path:
    ws = root / "ws"
    (ws / "vendors").mkdir(parents=True)
    (ws / "patches").mkdir()
    meta = tomllib.loads((DEMO / "kiln.toml").read_text())
    meta["release"]["name"] = "bench-rebuild-c"
    (ws / "kiln.toml").write_text(tomlkit.dumps(meta))
    vendor = tomllib.loads((DEMO / "vendors/tinyinfer.toml").read_text())
    vendor["build"]["env"]["TINYINFER_VARIANTS"] = str(variants)
    (ws / "vendors/tinyinfer.toml").write_text(tomlkit.dumps(vendor))
    (ws / "patches" / PATCH).write_text((DEMO / "patches" / PATCH).read_text())
    (ws / "patches/series.toml").write_text(
        f'tags = {{ tinyinfer = "prefixcache" }}\n\n[[patch]]\nfile = "{PATCH}"\n'
        f'target = "tinyinfer"\n'
    )
    return ws


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cache = Path(os.environ.get("KILN_CACHE_DIR", REPO / ".kiln-cache"))
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        root = Path(tmp)
        ws = workspace(root, args.variants)
        profile: Profile = Workspace(ws).profile
        python = buildenv.build_python(profile, cache, None, root / "logs")
        mirrors = demo_workspace.prepare(DEMO, root / "upstreams")
        # the demo profile's CUDA 13.2, from NVIDIA's hash-pinned PyPI wheels
        cuda_home = str(cudapypi.provision(profile.cuda, cache, root / "logs"))
        full, rebuild = [], []
        for run in range(args.runs):
            opts = Options(
                workspace=ws,
                artifacts=root / f"a{run}",
                cache=root / "git-cache",
                work=root / f"w{run}",
                mirrors=mirrors,
                offline=True,
                python=str(python),
                toolchain="pypi",
                # a full build each time: no outputs or objects from the previous run
                no_compiler_cache=True,
                artifact_cache=False,
            )
            start = time.monotonic()
            release = stages.build(opts)
            full_wall = time.monotonic() - start
            m = manifest_io.read(release / "manifest.json")
            build_s = (m.vendors["tinyinfer"].timings or {})["build"]
            full.append(build_s)
            (tarball,) = release.glob("*.tar.zst")
            installed = root / f"installed{run}"
            archive.unpack(tarball, installed)
            edited = root / f"edit{run}" / PATCH
            edited.parent.mkdir()
            edited.write_text(
                (ws / "patches" / PATCH)
                .read_text()
                .replace(
                    "prefix_cache_block_tokens = 64", f"prefix_cache_block_tokens = {65 + run}"
                )
            )
            took, _ = rebuild_c(
                Workspace(ws), installed / "tinyinfer", str(edited), str(python), cuda_home
            )
            rebuild.append(took)
            print(
                f"run {run + 1}: full build {build_s:.1f} s (pipeline {full_wall:.1f} s), "
                f"rebuild_c {took:.1f} s",
                file=sys.stderr,
            )
    f_med, r_med = statistics.median(full), statistics.median(rebuild)
    ratio = r_med / f_med
    print(
        f"\nrebuild_c benchmark: tinyinfer, 12 CUDA TUs (TINYINFER_VARIANTS={args.variants}) "
        f"+ 1 C++ TU, sm_100a + sm_103a, MAX_JOBS=2, {args.runs} runs\n"
    )
    print("| measure | " + " | ".join(f"run {i + 1}" for i in range(args.runs)) + " | median |")
    print("| --- | " + " | ".join("---" for _ in range(args.runs)) + " | --- |")
    print(
        "| full in-place build (s) | " + " | ".join(f"{x:.1f}" for x in full) + f" | {f_med:.1f} |"
    )
    print(
        "| rebuild_c after a one-line patch edit (s) | "
        + " | ".join(f"{x:.1f}" for x in rebuild)
        + f" | {r_med:.1f} |"
    )
    print(
        f"\nrebuild_c / full build = {ratio:.1%} (target < 10%: "
        f"{'met' if ratio < 0.10 else 'NOT met'}); rebuild_c median {r_med:.1f} s "
        f"(target < 15 s: {'met' if r_med < 15 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
