"""``python -m kiln.commands.toml_reference --write [REPO_ROOT]`` (``--check``: exit 1
where a file is stale): the workspace TOMLs' JSON Schemas and reference pages, made by
:mod:`kiln.config.reference` from the config models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kiln.config.reference import stale, write_all
from kiln.errors import ConfigError
from kiln.inside import say

COMMAND = "python -m kiln.commands.toml_reference"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="write (or check) the TOML files' JSON Schemas and reference pages",
    )
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).parents[2])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the files that differ")
    mode.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    args = parser.parse_args(argv)
    if args.write:
        for rel in write_all(args.root):
            say.report(f"wrote {rel}")
        return 0
    old = stale(args.root)
    if old:
        raise ConfigError(
            f"{', '.join(old)}: stale (made from kiln/config/models.py): {COMMAND} --write"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as exc:
        say.report(f"kiln: error: {exc}")
        sys.exit(exc.exit_code)
