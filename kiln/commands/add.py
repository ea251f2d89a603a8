"""``kiln add URL[@REV]``: write ``vendors/NAME.toml`` for an upstream from reading its
tree (every choice commented: ``docs/add.md``), then dry-run it as ``kiln build
--dry-run NAME`` would. The file written goes to stdout, the dry run's plan after it."""

from __future__ import annotations

import argparse
from dataclasses import replace

from kiln.commands import flags as o
from kiln.commands.common import out

HELP = "write vendors/NAME.toml for an upstream from reading its tree, then dry-run it"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        metavar="URL[@REV]",
        help="the upstream's git URL, optionally @REV (a branch, a tag, a commit SHA; "
        "default: the upstream's default branch)",
    )
    o.add(
        parser,
        o.ADD_NAME,
        o.ADD_FORCE,
        o.ADD_NO_DRY_RUN,
        o.ADD_NO_CHECK,
        o.WORKSPACE,
        o.PROFILE,
        o.CACHE,
        o.WORK,
        o.MIRRORS,
        o.OFFLINE,
        o.BUNDLES,
        o.PYTHON,
        o.CUDA_HOME,
        o.TOOLCHAIN,
    )


def execute(args: argparse.Namespace) -> int:
    from kiln.orchestrate import dryrun, stages
    from kiln.verbs.add import add_recipe, revision

    opts = o.to_options(args)
    if opts.bundles is not None:  # the upstream is read now: unbundle, as the build would
        from kiln.orchestrate.pipeline import decide_origins

        made = decide_origins(opts)
        opts = replace(opts, mirrors=made.mirrors_file, offline=made.offline, bundles=None)
    url, rev = revision.split(args.url)
    added = add_recipe(
        opts.workspace, url, rev, args.name, opts.cache, opts.mirrors,
        offline=opts.offline, force=args.force,
        profile=opts.profile, python=opts.python, cuda_home=opts.cuda_home,
        check=not args.no_check,
    )  # fmt: skip
    out(added.path)
    if args.no_dry_run:
        return 0
    plan = stages.dry_run(replace(opts, vendors=(added.name,)))
    out(dryrun.render(plan))
    return dryrun.exit_code(plan)
