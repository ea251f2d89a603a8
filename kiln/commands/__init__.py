"""The verbs of ``kiln``, one module each (auditwheel's shape): ``HELP`` (one line),
``configure_parser(parser)`` (its arguments; options come from :mod:`.flags`) and
``execute(args) -> int`` (0, or the exit code of an error in ``kiln/errors.py``'s
table). ``kiln/cli.py`` only wires them; adding a verb is its module plus one line in
:data:`VERBS`."""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from kiln.commands.common import Help

# Each verb's command and its module kiln/commands/<module>.py, in --help's order.
VERBS: dict[str, str] = {
    "add": "add",
    "build": "build",
    "demo": "demo",
    "lock": "lock",
    "rebuild-c": "rebuild_c",
    "pack-jit-cache": "pack_jit_cache",
    "verify": "verify",
    "manifest": "manifest_check",
    "plan": "plan",
    "publish": "publish",
    "gpu-test": "gpu",
    "verify-wheel": "verify_wheel",
    "verify-release": "verify_release",
    "timings": "timings",
}


def module(name: str) -> ModuleType:
    return importlib.import_module(f"kiln.commands.{name}")


def add_all(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, argparse.ArgumentParser]:
    """A parser for every verb under ``sub`` (each also takes ``common``: -v/-q)."""
    parsers = {}
    for command, name in VERBS.items():
        verb = module(name)
        p = sub.add_parser(
            command, help=verb.HELP, description=verb.HELP, parents=[common], formatter_class=Help
        )
        verb.configure_parser(p)
        p.set_defaults(execute=verb.execute)
        parsers[command] = p
    return parsers
