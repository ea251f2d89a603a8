"""``kiln timings``: a finished (or failed) build's timings report from its logs folder:
``timings.html`` and ``timings.trace.json`` (kiln/timings/, docs/timings.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands import flags as o
from kiln.commands.common import out, say_err

HELP = "a build's timings as pictures: timings.html and a Perfetto trace, from its logs"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "where",
        type=Path,
        metavar="LOGS_DIR_OR_RELEASE",
        help="the build's logs folder (artifacts/logs/<release>) or its release folder "
        "(artifacts/<release>)",
    )
    o.add(parser, o.TIMINGS_OUT)


def execute(args: argparse.Namespace) -> int:
    from kiln import timings
    from kiln.timings import records

    logs, manifest = records.locate(args.where)
    timeline = records.load(logs, manifest)
    page, trace = timings.write(timeline, args.timings_out or logs)
    for note in timeline.notes:
        say_err(f"note: {note}")
    out(page)
    out(trace)
    return 0
