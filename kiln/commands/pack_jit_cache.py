"""``kiln pack-jit-cache``: a GPU run's JIT caches packed into a release."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands import flags as o
from kiln.commands.common import out

HELP = "pack a GPU run's JIT caches into a release"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "cache_dir", type=Path, help="folder holding the caches kiln.toml's jit_caches name"
    )
    o.add(parser, o.JIT_NAME, o.JIT_RELEASE)


def execute(args: argparse.Namespace) -> int:
    from kiln.verbs.jitcache import pack_into_release

    out(pack_into_release(args.cache_dir, args.name, args.release))
    return 0
