"""``python -m kiln.inside step|probe|prove ...``: what runners run.

Standard library only (as all of ``kiln.inside``): in a builder container kiln's
dependencies are not installed; the container gets kiln's source, read-only, on
``PYTHONPATH`` and nothing else. A failure prints one ``kiln: error:`` line and exits
with its code from :mod:`kiln.errors`, as the CLI does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kiln.errors import KilnError
from kiln.inside import say


def _step(args: argparse.Namespace) -> None:
    from kiln.inside import step

    step.run(step.StepSpec.from_file(args.spec), step.own_environment(os.environ))


def _probe(args: argparse.Namespace) -> None:
    from kiln.inside import facts

    if args.system:  # {"requirements": [...], "include_dirs": [...]}: which are missing
        asked = json.loads(args.system)
        missing = facts.missing_system(asked["requirements"], asked["include_dirs"])
        say.result(json.dumps(missing))
        return
    python = Path(args.python or sys.executable)
    found = facts.probe(python, facts.find_cuda_home(args.cuda_home))
    say.result(json.dumps(found))


def _prove(args: argparse.Namespace) -> None:
    from kiln.inside import import_child

    import_child.main(args.spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kiln.inside", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("step", help="run one build step from its JSON spec")
    p.add_argument("spec", type=Path)
    p.set_defaults(func=_step)
    p = sub.add_parser("probe", help="print this machine's toolchain facts as JSON")
    p.add_argument("--python", default=None)
    p.add_argument("--cuda-home", default=None)
    p.add_argument("--system", default=None, help="JSON: which of these system files are missing")
    p.set_defaults(func=_probe)
    p = sub.add_parser("prove", help="import a release's modules in its consumer environment")
    p.add_argument("spec", type=Path)
    p.set_defaults(func=_prove)
    args = ap.parse_args(argv)
    os.umask(0o022)
    try:
        args.func(args)
    except KilnError as err:
        say.report(f"kiln: error: {err}")
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
