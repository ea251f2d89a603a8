"""What the import proof costs (issue 34): kiln's build with and without it, side by side
in one run, on the demo (vecadd, tinyinfer) and the public three (DeepGEMM, DeepEP,
FlashMLA, offline from their bundles).

Per workspace, each run in folders of its own (artifacts, work, artifact cache), the
machine's build venvs and toolchains from ``--cache``:

1. ``proof``: a build with the proof, every vendor an artifact-cache miss; its consumer
   environment is made first if ``--cache`` has none (that making is timed on its own,
   from the build's own log line, and left out of nothing: the row says so);
2. ``no proof``: the same build with ``--no-import-proof``;
3. ``proof`` again, then the no-op: the same build once more into the same folders,
   every vendor an artifact-cache hit that keeps its proof.

``--cold`` builds without the compiler cache (every unit compiled: minutes per
workspace); by default the compiler cache is on, so the vendors finish close together and
their proofs run at the same time (the proof's worst case for the wall on 2 cores), and
the runs are short. Rows print as they finish; nothing is written elsewhere.

    python benchmarks/importproof.py [--cache .kiln-cache] [--workloads demo,public] [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import kilnrun

from kiln.release import manifest as manifest_io

REPO = Path(__file__).resolve().parents[1]
MADE = re.compile(r"consumer environment made in ([0-9.]+) s")


def _kiln(args: list[str], log: Path) -> tuple[float, str]:
    rc, wall, err = kilnrun.run(args, log)
    if rc != 0:
        sys.exit(f"kiln {' '.join(args)} failed ({rc}); see {log}")
    return wall, err


def _proofs(release: Path) -> dict[str, float]:
    m = manifest_io.read(release / "manifest.json")
    return {
        name: sum(o.import_proof.seconds or 0.0 for o in v.outputs if o.import_proof)
        for name, v in m.vendors.items()
    }


def workload(name: str, cache: Path, root: Path, cold: bool, bundles: Path) -> None:
    if name == "demo":
        base = ["demo"]
        release_name = "kiln-demo"
    else:
        base = ["build", "--workspace", "examples/public", "--bundles", str(bundles)]
        base += ["--profile", "sm100", "--runner", "local"]
        release_name = "public-upstreams"
    speed = ["--no-compiler-cache"] if cold else []
    rows = []
    for label, extra in (("proof", []), ("no proof", ["--no-import-proof"]), ("proof", [])):
        run = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
        folders = ["--artifacts", str(run / "a"), "--work", str(run / "w"), "--cache", str(cache)]
        folders += ["--artifact-cache", str(run / "ac")]
        wall, err = _kiln([*base, *folders, *speed, *extra], run / "build.log")
        made = MADE.search(err)
        proofs = _proofs(run / "a" / release_name) if label == "proof" else {}
        rows.append((label, wall, proofs, float(made[1]) if made else None))
        print(
            f"{name}: build, {label}: wall {wall:.1f} s"
            + (
                f"; proofs {json.dumps({k: round(v, 1) for k, v in proofs.items()})}"
                if proofs
                else ""
            )
            + (f"; consumer environment made first, in {made[1]} s" if made else ""),
            flush=True,
        )
        if label == "proof" and len(rows) == 3:
            noop, _ = _kiln([*base, *folders, *speed], run / "noop.log")
            print(
                f"{name}: no-op (every vendor reused, proofs kept): wall {noop:.2f} s", flush=True
            )
        shutil.rmtree(run / "w", ignore_errors=True)
    with_env = rows[0][1] - (rows[0][3] or 0.0)
    print(
        f"{name}: the proof adds {rows[2][1] - rows[1][1]:+.1f} s to the build "
        f"(second proof run {rows[2][1]:.1f} s against {rows[1][1]:.1f} s without; the first "
        f"proof run {rows[0][1]:.1f} s, {with_env:.1f} s without its environment's making)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=REPO / ".kiln-cache")
    ap.add_argument("--workloads", default="demo,public")
    ap.add_argument("--cold", action="store_true", help="no compiler cache: every unit compiled")
    ap.add_argument(
        "--bundles",
        type=Path,
        default=Path(os.environ.get("KILN_BUNDLES", REPO.parent / "shared/upstreams")),
    )
    ap.add_argument("--out", type=Path, default=None, help="keep the runs' folders here")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="kiln-bench-proof-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} CPUs; cache {args.cache}; runs under {root}", flush=True)
    for name in args.workloads.split(","):
        workload(name, args.cache.resolve(), root, args.cold, args.bundles.resolve())
    if args.out is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
