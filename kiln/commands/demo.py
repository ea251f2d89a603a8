"""``kiln demo``: the full pipeline over the bundled example (``examples/demo``), offline."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from kiln.commands import build
from kiln.commands import flags as o
from kiln.commands.common import out

HELP = "the full pipeline over the bundled example, offline"

# The bundled example, with CUDA from PyPI: not $KILN_WORKSPACE or $KILN_TOOLCHAIN, which
# are for the user's own workspace.
DEMO = {
    o.WORKSPACE: replace(o.WORKSPACE, default=Path("examples/demo"), env=None),
    o.TOOLCHAIN: replace(o.TOOLCHAIN, default="pypi", env=None),
}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    o.add(parser, *(DEMO.get(opt, opt) for opt in o.BUILD))


def execute(args: argparse.Namespace) -> int:
    from kiln.orchestrate import stages
    from kiln.verbs import demo_workspace

    opts = build.options(args)
    mirrors = demo_workspace.prepare(args.workspace, opts.work / "demo-upstreams")
    out(stages.build(replace(opts, mirrors=mirrors, offline=True, bundles=None)))
    return 0
