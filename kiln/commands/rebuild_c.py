"""``kiln rebuild-c``: a patch re-applied to an installed tree, its extension rebuilt."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands import flags as o
from kiln.commands.common import out

HELP = "re-apply a patch to an installed tree, rebuild its extension"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "tree", type=Path, help="the installed tree (the folder install.sh unpacked)"
    )
    parser.add_argument(
        "patch",
        nargs="?",
        default=None,
        help="a patch file, or a name under patches/ (default: the vendor's last)",
    )
    o.add(
        parser,
        o.WORKSPACE,
        o.REBUILD_PYTHON,
        o.CUDA_HOME,
        o.CACHE,
        o.COMPILER_CACHE,
        o.NO_COMPILER_CACHE,
    )


def execute(args: argparse.Namespace) -> int:
    from kiln.config.workspace import Workspace
    from kiln.toolchain.checks import find_cuda_home
    from kiln.verbs.rebuild_ext import rebuild_c

    ws = Workspace(args.workspace)
    ccache_dir = None if args.no_compiler_cache else (args.compiler_cache or args.cache / "ccache")
    took, objects = rebuild_c(
        ws,
        args.tree,
        args.patch,
        args.python,
        str(find_cuda_home(args.cuda_home)),
        ccache_dir.resolve() if ccache_dir else None,
    )
    archs = sorted({a for obj in objects for a in obj.sass})
    out(f"rebuilt {', '.join(obj.path for obj in objects)} ({', '.join(archs)}) in {took:.1f} s")
    return 0
