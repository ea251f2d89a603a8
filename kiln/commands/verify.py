"""``kiln verify``: a release rebuilt from its manifest, every file compared."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from kiln.commands import build
from kiln.commands import flags as o
from kiln.commands.common import out, say_err
from kiln.errors import NotReproduced

HELP = "rebuild a release from its manifest and compare every file"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", type=Path, help="the release's manifest.json")
    o.add(parser, *o.BUILD, o.INTO, o.REBUILT)


def execute(args: argparse.Namespace) -> int:
    import tempfile

    from kiln.release import manifest
    from kiln.verbs import rebuild_check

    data = manifest.read(args.manifest)
    if args.rebuilt:
        rebuilt = args.rebuilt
    else:
        work = args.into or Path(tempfile.mkdtemp(prefix="kiln-verify-"))
        opts = replace(build.options(args), work=work.resolve())
        rebuilt = rebuild_check.rebuild(args.manifest, opts)
    report = rebuild_check.compare(data, args.manifest.parent, rebuilt)
    note = rebuild_check.builder_note(args.manifest.parent, rebuilt)
    if note:
        say_err(note)
    if report:
        say_err("\n".join(report))
        raise NotReproduced(
            f"verify: {args.manifest.parent} is NOT reproduced by {rebuilt}: the "
            f"differences are listed above, member by member"
        )
    out(f"verify: every file of {args.manifest.parent} is reproduced bit for bit ({rebuilt})")
    return 0
