"""``kiln lock``: short SHAs resolved, submodule and patch hashes recorded (network)."""

from __future__ import annotations

import argparse

from kiln.commands import flags as o
from kiln.commands.common import out

HELP = "resolve short SHAs, record submodule and patch hashes (network)"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    o.add(parser, o.WORKSPACE, o.CACHE, o.MIRRORS, o.OFFLINE)


def execute(args: argparse.Namespace) -> int:
    from kiln.config.workspace import Workspace
    from kiln.sources import origins
    from kiln.verbs import runtime_lock

    ws = Workspace(args.workspace)
    cache = origins.decide(ws.root, mirrors=args.mirrors, offline=args.offline).git_cache(
        args.cache
    )
    for line in runtime_lock.lock(ws, cache):
        out(line)
    return 0
