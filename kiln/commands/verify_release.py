"""``kiln verify-release RELEASE --key PUBKEY``: a received release checked against its
signature (kiln/release/signing.py): the DSSE envelope signed by that key, every file's
sha256 against the signed statement, the statement's recipes against the manifest, and
no file in the folder that the statement does not name."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands.common import out

HELP = "check a release's signature and every file it vouches for"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("release", type=Path, help="the release folder")
    parser.add_argument(
        "--key",
        type=Path,
        required=True,
        metavar="PUBKEY",
        help="the signer's public key (PEM: -----BEGIN PUBLIC KEY-----)",
    )


def execute(args: argparse.Namespace) -> int:
    from kiln.release import signing

    checked = signing.verify(args.release, args.key)
    out(
        f"{args.release}: signed by {args.key}; {len(checked)} files checked against "
        f"{signing.ENVELOPE_FILE}, nothing else in the folder"
    )
    return 0
