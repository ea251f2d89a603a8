"""``kiln manifest check|schema|merge``: a release's manifest re-hashed, its JSON Schema,
partial releases (CI jobs) merged into one."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from kiln.commands import flags as o
from kiln.commands.common import Help, out, say_err, verbosity
from kiln.errors import ManifestError

HELP = "manifest tools: check, schema, merge"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    common = verbosity()
    tools = parser.add_subparsers(dest="manifest_command", required=True, metavar="TOOL")

    def tool(
        name: str, help: str, run: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        p = tools.add_parser(
            name, help=help, description=help, parents=[common], formatter_class=Help
        )
        p.set_defaults(manifest_tool=run)
        return p

    p = tool("check", "re-hash every file a manifest lists", check)
    p.add_argument("manifest", type=Path, help="the release's manifest.json")
    tool("schema", "print the manifest's JSON Schema (made from its models)", schema)
    p = tool("merge", "merge partial release folders (CI jobs) into one release", merge)
    p.add_argument("partials", nargs="+", type=Path, help="partial release folders")
    o.add(p, o.MERGE_OUT, o.MERGE_WORKSPACE, o.PROFILE, o.SIGN)


def execute(args: argparse.Namespace) -> int:
    run: Callable[[argparse.Namespace], int] = args.manifest_tool
    return run(args)


def check(args: argparse.Namespace) -> int:
    from kiln.release import manifest

    problems = manifest.check(args.manifest)
    for p in problems:
        say_err(f"{p.path}: {p.problem}")
    if problems:
        raise ManifestError(
            f"{args.manifest}: {len(problems)} file(s) differ from the manifest (listed "
            f"above): copy the release again from where it was built"
        )
    out(f"{args.manifest}: every file matches")
    return 0


def schema(args: argparse.Namespace) -> int:
    from kiln.release import manifest

    out(manifest.schema_text().rstrip("\n"))
    return 0


def merge(args: argparse.Namespace) -> int:
    from kiln.verbs import merge as merging

    merged = merging.merge(args.partials, args.out, args.workspace, args.profile, args.sign)
    out(f"merged {len(args.partials)} partial(s) into {merged}")
    return 0
