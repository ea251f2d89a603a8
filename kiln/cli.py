"""``python -m kiln`` / ``kiln``: the top-level parser, -v/-q, the examples and the
exit-code table, the one error handler. Each verb is a module of ``kiln/commands/``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

from kiln import commands
from kiln.commands import flags
from kiln.commands.common import Help, say_err, verbosity
from kiln.errors import Interrupted, KilnError
from kiln.inside import say

log = logging.getLogger("kiln")

EXAMPLES = """\
examples:
  kiln demo                                  the bundled example, offline (CUDA from PyPI)
  kiln build --dry-run                       what a build would do: cache hits, fetches, jobs
  kiln build NAME --runner docker            one upstream in the builder image
  kiln build --workspace examples/public --bundles ../shared/upstreams
  kiln verify artifacts/REL/manifest.json    rebuild elsewhere, compare every file
  kiln manifest check artifacts/REL/manifest.json
  kiln publish artifacts/REL --to hf://ORG/NAME --dry-run
  kiln plan --json                           the CI matrix: upstream x profile

Every option of a build also reads a KILN_* variable (--help of a command names it;
docs/options.md lists them): the command line wins, then the variable, then the default.
"""


def _sigterm(_signo: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _exit_codes() -> str:
    from kiln.errors import table

    rows = [f"  {code:>3}  {name}: {what}" for code, name, what in table()]
    return "exit codes:\n" + "\n".join(rows) + "\n"


def parser() -> argparse.ArgumentParser:
    from kiln import version_line

    common = verbosity()
    ap = argparse.ArgumentParser(
        prog="kiln",
        description="kiln: reproducible builds of CUDA wheels from pinned upstream sources. "
        "A workspace (kiln.toml, vendors/, patches/) goes in; a release folder with a "
        "manifest that records how every byte was made comes out.",
        epilog=EXAMPLES + "\n" + _exit_codes(),
        formatter_class=Help,
        parents=[common],
    )
    ap.add_argument("--version", action="version", version=version_line())
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_all(sub, common)
    return ap


def _fail(err: KilnError) -> int:
    """The one error report: a line on stderr (and a GitHub Actions annotation there)."""
    from kiln.orchestrate import github

    say_err(f"kiln: error: {err}")
    github.annotate_error(str(err), f"kiln: {type(err).__name__} (exit {err.exit_code})")
    return err.exit_code


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    # -v is kiln's own debug output (every command it runs), not its libraries': they
    # stay at INFO (cyclonedx alone logs some 800 DEBUG lines while it is imported).
    say.configure_logging(
        logging.WARNING if getattr(args, "quiet", False) and not verbose else logging.INFO
    )
    log.setLevel(logging.DEBUG if verbose else logging.NOTSET)
    os.umask(0o022)  # zip member modes follow the umask
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        flags.resolve(args)  # a KILN_* variable that does not parse: a ConfigError
        code: int = args.execute(args)
        return code
    except KeyboardInterrupt:
        return _fail(Interrupted("interrupted: partial output was removed"))
    except KilnError as err:
        return _fail(err)
    except OSError as exc:
        from kiln import fsutil

        full = fsutil.disk_full(exc, Path(exc.filename or "."))
        if full is None:
            raise
        return _fail(full)
