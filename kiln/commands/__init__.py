"""The verbs of ``kiln``, one module each (auditwheel's shape): ``HELP`` (one line),
``configure_parser(parser)`` (its arguments; options come from :mod:`.options`) and
``execute(args) -> int`` (0, or the exit code of an error in ``kiln/errors.py``'s
table). ``kiln/cli.py`` only wires them; adding a verb is its module plus one name in
:data:`VERBS`."""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from kiln.commands.common import Help

# The module kiln/commands/<name>.py of each verb, in --help's order; the command is the
# name with '-' for '_'.
VERBS = (
    "add",
    "build",
    "demo",
    "lock",
    "rebuild_c",
    "pack_jit_cache",
    "verify",
    "manifest",
    "plan",
    "publish",
    "gpu_test",
    "verify_wheel",
    "timings",
)


def module(name: str) -> ModuleType:
    return importlib.import_module(f"kiln.commands.{name}")


def add_all(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, argparse.ArgumentParser]:
    """A parser for every verb under ``sub`` (each also takes ``common``: -v/-q)."""
    parsers = {}
    for name in VERBS:
        verb = module(name)
        command = name.replace("_", "-")
        p = sub.add_parser(
            command, help=verb.HELP, description=verb.HELP, parents=[common], formatter_class=Help
        )
        verb.configure_parser(p)
        p.set_defaults(execute=verb.execute)
        parsers[command] = p
    return parsers
