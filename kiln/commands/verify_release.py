"""``kiln verify-release RELEASE --key PUBKEY`` (or ``--identity ID`` for a Sigstore
keyless signature): a received release checked against its signature
(kiln/release/signing.py): the DSSE envelope signed by that key or identity, every
file's sha256 against the signed statement, the statement's recipes against the
manifest, and no file in the folder that the statement does not name."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands.common import out

HELP = "check a release's signature and every file it vouches for"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("release", type=Path, help="the release folder")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--key",
        type=Path,
        metavar="PUBKEY",
        help="the signer's public key (PEM: -----BEGIN PUBLIC KEY-----)",
    )
    who.add_argument(
        "--identity",
        metavar="ID",
        help="a Sigstore keyless signature's signer: the workflow that signed "
        "(https://github.com/OWNER/REPO/.github/workflows/release.yml@refs/heads/main); "
        "checking it needs 'kiln[sigstore]' and Sigstore's public services",
    )
    parser.add_argument(
        "--issuer",
        metavar="URL",
        help="with --identity: its OIDC issuer (default: GitHub Actions', "
        "https://token.actions.githubusercontent.com)",
    )


def execute(args: argparse.Namespace) -> int:
    from securesystemslib.signer import Key

    from kiln.release import keyless, signing

    key: Key
    if args.key is not None:
        key, signer = signing.public_key(args.key), f"the key {args.key}"
    else:
        key = keyless.identity_key(args.identity, args.issuer or keyless.GITHUB_ISSUER)
        signer = f"the identity {keyless.described(key)}"
    checked = signing.verify(args.release, key, signer)
    out(
        f"{args.release}: signed by {signer.removeprefix('the key ')}; {len(checked)} files "
        f"checked against {signing.ENVELOPE_FILE}, nothing else in the folder"
    )
    return 0
