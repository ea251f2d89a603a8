"""``docs/options.md``, made from the option declarations (``kiln.commands.flags``) and
the verbs that take each: ``python -m kiln.commands.docs > docs/options.md``
(``tests/unit/test_options.py`` fails when the committed file is stale)."""

from __future__ import annotations

import argparse
import re

from kiln import commands
from kiln.commands import flags as o
from kiln.commands.common import verbosity
from kiln.inside import say
from kiln.orchestrate.options import Option

INTRO = """\
# Options

Every option of every `kiln` command, made from the one declaration of each
(`kiln/commands/flags.py`): `python -m kiln.commands.docs > docs/options.md` writes this
page, and a test fails when it is stale. `kiln COMMAND --help` shows the same defaults
and variables.

Where a value comes from: the command line, else the option's `KILN_*` variable, else its
default. Every option of a build has a variable (cibuildwheel's `CIBW_*` are the model),
so CI can set them per job (`ci/release.yml` sets `KILN_PROFILE`, `KILN_CACHE_STORE`,
`KILN_DISTRIBUTE`). How a variable is read:

- an empty variable counts as unset;
- a flag's variable is `1`, `true`, `yes` or `on` (on), or `0`, `false`, `no` or `off`
  (off: a flag set in the environment can be turned off by the variable alone);
- a list's (`--docker-mount`, `plan --profile`) is split like a shell line:
  `KILN_DOCKER_MOUNTS='/usr/local/cuda:/usr/local/cuda:ro /data:/data'`; the command
  line's list replaces it, it does not add to it;
- a value that does not parse (`KILN_JOBS=many`, `KILN_RUNNER=podman`) stops the command
  with exit code 2, naming the variable; only the command that takes the option reads it.

`--bundles` reads `KILN_FROM_BUNDLES`, not `KILN_BUNDLES`: the tests and
`nox -s build_public` use that one for where the public upstreams' bundles lie.
"""


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name (``manifest merge`` for a tool)."""
    ap = argparse.ArgumentParser(prog="kiln")
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if prefix:
            found[prefix] = parser
        for action in subs:
            for name, sub in action.choices.items():
                walk(f"{prefix} {name}".strip(), sub)

    commands.add_all(ap.add_subparsers(), verbosity())
    walk("", ap)
    return found


def _cell(text: str) -> str:
    """A table cell: placeholders such as ``<cache>/ccache`` as code (not HTML tags)."""
    if not text.startswith("`"):
        text = re.sub(r"[^\s(]*<[^<>\s]+>[^\s,;)]*", lambda m: f"`{m.group(0)}`", text)
    return text.replace("|", "\\|")


def _row(opt: Option, users: list[str]) -> str:
    flag = opt.flag + (f" {opt.metavar}" if opt.metavar else "")
    if opt.choices:
        flag += " {" + ",".join(opt.choices) + "}"
    env = f"`{opt.env}`" if opt.env else ""
    default = "required" if opt.required else opt.shown_default()
    cells = [f"`{flag}`", env, default, opt.help, ", ".join(users)]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def options_markdown() -> str:
    users: dict[Option, list[str]] = {}
    for name, parser in _parsers().items():
        for opt in parser.get_default(o.DECLARED) or ():
            users.setdefault(opt, []).append(name)
    head = "| option | variable | default | what | commands |\n| --- | --- | --- | --- | --- |"
    build = [opt for opt in users if opt in o.BUILD]
    lines = [
        INTRO,
        "## A build's options",
        "",
        "`kiln build`, `kiln demo` and `kiln verify` take all of them (the demo builds its",
        "own workspace with the PyPI CUDA); other commands take the ones they need.",
    ]
    for group in dict.fromkeys(opt.group for opt in build):
        lines += ["", f"### {group}", "", head]
        lines += [_row(opt, users[opt]) for opt in build if opt.group == group]
    lines += ["", "## Other commands' options", "", head]
    lines += [_row(opt, users[opt]) for opt in users if opt not in o.BUILD]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    say.result(options_markdown().removesuffix("\n"))
