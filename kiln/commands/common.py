"""What every verb shares: its output (results on stdout, reports on stderr), the help
formatter, and -v/-q."""

from __future__ import annotations

import argparse

from kiln.inside import say

# kiln's one output channel (kiln/inside/say.py): a result on stdout, a report on stderr
out = say.result
say_err = say.report


class Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and the epilog's lines as written."""


def verbosity() -> argparse.ArgumentParser:
    """-v/-q, a parent of the top-level parser and of every verb's, so they are accepted
    before the command and after it (SUPPRESS: a subcommand's absent flag does not undo
    the one given before it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also show every command kiln runs (debug logging)",
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="only warnings and errors",
    )
    return common
