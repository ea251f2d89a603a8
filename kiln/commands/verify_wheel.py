"""``kiln verify-wheel``: wheels built elsewhere (cibuildwheel), or every wheel a release
lists, checked against their recipe."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands import flags as o
from kiln.commands.common import out
from kiln.errors import KilnError

HELP = "verify wheels built elsewhere (cibuildwheel)"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("wheels", nargs="*", type=Path, help="the wheels")
    o.add(parser, o.WORKSPACE, o.WHEEL_VENDOR, o.WHEEL_ARCHS, o.WHEEL_MANIFEST)


def execute(args: argparse.Namespace) -> int:
    from kiln.config.workspace import Workspace
    from kiln.verbs.wheel_check import verify_release, verify_wheels
    from kiln.verify import wheels as wheelcheck

    if args.manifest:
        lines = verify_release(args.manifest)
    else:
        if not args.wheels:
            raise KilnError("verify-wheel: name the wheel(s), or a release's --manifest")
        ws = Workspace(args.workspace)
        archs = wheelcheck.expected_archs(ws, args.vendor, args.archs)
        lines = verify_wheels(args.wheels, ws.profile, archs)
    out("\n".join(lines) if lines else "verify-wheel: no wheels")
    return 0
