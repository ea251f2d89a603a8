"""``kiln publish``: a release checked, then put into a folder or a Hub repository."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands import flags as o
from kiln.commands.common import out

HELP = "check a release, then put it into a folder or a Hub repository"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("release", type=Path, help="the release folder (holds manifest.json)")
    o.add(parser, o.PUBLISH_TO, o.PUBLISH_DRY_RUN, o.PUBLISH_FORCE)


def execute(args: argparse.Namespace) -> int:
    from kiln.verbs import hub_publish

    out(hub_publish.publish(args.release, args.to, args.dry_run, force=args.force))
    return 0
