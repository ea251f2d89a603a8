"""``kiln plan``: the release workflow's matrix, one job per upstream x profile."""

from __future__ import annotations

import argparse

from kiln.commands import flags as o
from kiln.commands.common import out

HELP = "the CI matrix: one job per vendor x profile ([profile] and each [profiles.NAME])"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    o.add(parser, o.WORKSPACE, o.PLAN_PROFILES, o.PLAN_JSON, o.PLAN_RELEASES, o.PLAN_RELEASE_NAME)


def execute(args: argparse.Namespace) -> int:
    from kiln.config.workspace import Workspace
    from kiln.plan import matrix

    if args.release_name:
        out(Workspace(args.workspace).release.name)
        return 0
    rows = (matrix.releases if args.releases else matrix.jobs)(args.workspace, args.profiles)
    out(matrix.as_json(rows) if args.json else matrix.as_table(rows))
    return 0
