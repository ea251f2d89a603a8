"""``kiln gpu-test``: the upstreams' own GPU tests against a release's wheels."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands import flags as o
from kiln.commands.common import out
from kiln.errors import GpuTestError

HELP = "run the upstreams' own GPU tests against a release's wheels"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("release", type=Path, help="the release folder (holds manifest.json)")
    parser.add_argument("vendor", nargs="*", help="vendors to test (default: all that declare one)")
    o.add(parser, o.GPU_PYTHON, o.WORKSPACE, o.CACHE, o.WORK, o.MIRRORS, o.OFFLINE, o.BUNDLES)


def execute(args: argparse.Namespace) -> int:
    from kiln.sources import origins
    from kiln.verbs import gpu_check as gputest

    cache = origins.decide(
        args.workspace,
        mirrors=args.mirrors,
        offline=args.offline,
        bundles_dir=args.bundles,
        bundle_mirrors=args.work / "gpu-test-mirrors",
    ).git_cache(args.cache)
    results = gputest.gpu_test(args.release, args.vendor or None, args.python, cache)
    for r in results:
        verdict = "passed" if r["passed"] else f"FAILED (exit {r['returncode']})"
        out(
            f"gpu-test {r['vendor']}: {verdict} in {r['duration_s']} s on {r['gpus'][0]['name']} "
            f"({args.release / gputest.RESULTS_DIR / (r['vendor'] + '.json')})"
        )
    failed = [r["vendor"] for r in results if not r["passed"]]
    if failed:
        raise GpuTestError(f"the GPU test of {', '.join(failed)} failed: see its log")
    return 0
