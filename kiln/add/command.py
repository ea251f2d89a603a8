"""``kiln add URL[@REV]``: the command (its options, and what it prints).

``configure_parser`` and ``execute`` follow the shape of ``kiln/commands/<verb>.py``;
the CLI wires them in. The result (the file written) goes to stdout, the dry run's plan
after it; what happens on the way is logged on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kiln.add import add_recipe, dry_run, revision
from kiln.build import dryrun
from kiln.errors import PreflightError

HELP = "write vendors/NAME.toml for an upstream from reading its tree, then dry-run it"


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Fetch URL at REV (a branch, a tag, a commit SHA; default: the upstream's default "
        "branch) through kiln's mirrors, read the tree (build backend, setup.py, "
        ".gitmodules, licenses, how archs reach nvcc, MAX_JOBS/NVCC_THREADS, the system "
        "headers its sources need) and write vendors/NAME.toml with every choice "
        "commented; then run the build's dry run for it. docs/add.md."
    )
    p.add_argument("url", metavar="URL[@REV]", help="the upstream's git URL, optionally @REV")
    p.add_argument(
        "--name", default=None, help="the vendor's name (default: the repository's, lowercased)"
    )
    p.add_argument(
        "--workspace",
        type=Path,
        default=Path("."),
        help="folder with kiln.toml and vendors/ (default: .)",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="NAME",
        help="decide the archs for the [profiles.NAME] variant of kiln.toml's profile "
        "(default: [profile])",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("KILN_CACHE_DIR", ".kiln-cache")),
        help="bare clones and build venvs (default: $KILN_CACHE_DIR or .kiln-cache)",
    )
    p.add_argument(
        "--mirrors",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML mapping upstream URL prefixes to mirrors (default: $KILN_MIRRORS, else none)",
    )
    p.add_argument(
        "--offline", action="store_true", help="never use the network: the cache and local mirrors"
    )
    p.add_argument(
        "--bundles",
        type=Path,
        default=None,
        metavar="DIR",
        help="upstreams from the git bundles in DIR, as the workspace's bundles.toml names "
        "them (made into mirrors; implies --offline)",
    )
    p.add_argument(
        "--python",
        default=None,
        help="the build Python whose torch and packages the headers come from "
        "(default: $KILN_BUILD_PYTHON, else the venv kiln provisions for the profile)",
    )
    p.add_argument(
        "--cuda-home", default=None, help="(default: $CUDA_HOME, nvcc on PATH, /usr/local/cuda)"
    )
    p.add_argument(
        "--toolchain",
        default="system",
        choices=["system", "pypi"],
        help="for the dry run, as `kiln build --toolchain` (default: system)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing vendors/NAME.toml")
    p.add_argument("--no-dry-run", action="store_true", help="write the recipe, do not dry-run it")


def execute(args: argparse.Namespace) -> int:
    url, rev = revision.split(args.url)
    mirrors, offline = args.mirrors, args.offline
    if args.bundles is not None:
        from kiln.sources.bundles import mirrors_from_bundles

        mirrors = mirrors_from_bundles(
            args.workspace, args.bundles, args.cache / "mirrors-from-bundles"
        )
        offline = True
    added = add_recipe(
        args.workspace, url, rev, args.name, args.cache, mirrors, offline, args.force,
        profile=args.profile, python=args.python, cuda_home=args.cuda_home,
    )  # fmt: skip
    sys.stdout.write(f"{added.path}\n")
    if args.no_dry_run:
        return 0
    plan = dry_run(
        args.workspace, added.name, args.cache, mirrors, offline,
        profile=args.profile, python=args.python, cuda_home=args.cuda_home,
        toolchain=args.toolchain,
    )  # fmt: skip
    sys.stdout.write(dryrun.render(plan) + "\n")
    return PreflightError.exit_code if plan["problems"] else 0
