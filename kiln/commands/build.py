"""``kiln build``: vendors of a workspace into a release folder (or, with ``--dry-run``,
what that would do)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from kiln.commands import flags as o
from kiln.commands.common import out, say_err
from kiln.errors import KilnError
from kiln.orchestrate.options import Options

if TYPE_CHECKING:
    from kiln.orchestrate.fixes import Pending

HELP = "build vendors of a workspace into a release folder"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("vendor", nargs="*", help="vendor names (default: every vendor)")
    o.add(parser, *o.BUILD, o.DRY_RUN, o.JSON, o.FIX)


def options(args: argparse.Namespace, **fields: Any) -> Options:
    """The build's ``Options`` from the arguments. ``--bundles`` (which implies
    ``--offline``, decided by ``kiln.sources.origins.decide``): the build's inputs stage
    makes them mirrors (a dry run only reads them)."""
    return o.to_options(args, **fields)


def execute(args: argparse.Namespace) -> int:
    from kiln.orchestrate import stages

    if args.json and not args.dry_run:
        raise KilnError("build --json: only with --dry-run (a build prints its release folder)")
    vendors = tuple(args.vendor) if args.vendor else None
    if args.dry_run:
        from kiln.orchestrate import dryrun

        plan = stages.dry_run(options(args, vendors=vendors))
        out(dryrun.as_json(plan) if args.json else dryrun.render(plan))
        return dryrun.exit_code(plan)
    opts = options(args, vendors=vendors)
    if not args.fix:
        out(stages.build(opts))
        return 0
    started = time.time() - 1.0  # a record's mtime may round below the clock's now
    try:
        out(stages.build(opts))
        return 0
    except KilnError as exc:
        found = _fixes(opts, started)
        if not found.edits:
            why = "; ".join(found.skipped) or "this run wrote no failure record"
            say_err(f"kiln build --fix: nothing applied ({why})")
            raise
        say_err(str(exc))
        for line in found.skipped:
            say_err(f"kiln build --fix: not applied: {line}")
    from kiln.orchestrate import fixes

    edits = found.edits
    for edit in edits:
        diff = fixes.apply(opts.workspace, edit)
        say_err(f"kiln build --fix: {edit.vendor} ({edit.row}):\n{diff or '(already so)'}")
    many = "es" if len(edits) != 1 else ""
    say_err(f"kiln build --fix: {len(edits)} fix{many} applied; building again")
    out(stages.build(opts))
    return 0


def _fixes(opts: Options, since: float) -> Pending:
    """The mechanical fixes the records of this failed build carry, for its vendors."""
    from kiln.config.workspace import Workspace
    from kiln.orchestrate import fixes

    try:
        ws = Workspace(opts.workspace)
        name = ws.release.name
        vendors = set(opts.vendors) if opts.vendors else set(ws.vendors)
    except KilnError:
        return fixes.Pending([], ["the workspace does not read: nothing to apply"])
    return fixes.pending(opts.artifacts / "logs" / name, opts.workspace, since, vendors)
