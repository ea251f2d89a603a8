"""What a step can be refused for before its compile (issue 40): what the wheel will
require, held against the consumer environment install.sh makes; what its
``[build-system] requires``, held against the build venv it is built in; and, for an
in-place build, the programs its own command runs (cmake, make), looked up where the
step runs.

The tree's PEP 517 metadata (``python -m kiln.inside metadata``: the backend's
``prepare_metadata_for_build_wheel``, setup.py run as the build runs it, in the step's
own environment and runner; seconds, nothing compiled) gives the wheel's
``Requires-Dist``. They are held against what the consumer environment holds: the
environment itself where it is made; else the pins of install.sh's requirements, where
they answer (a whole lock, or pins naming every requirement); else the environment is
made now, once (it is made for the import proof anyway). The import proof checks the
same again after the build, on the wheel itself (kiln's torch pin included); this one
finds it before minutes of compiling. A tree whose metadata cannot be read here (its
backend has no metadata hook, or setup.py fails) is built as before: the build's own
diagnosis explains a setup.py that fails.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kiln.errors import ConfigError
from kiln.inside import pep517
from kiln.orchestrate import importproof
from kiln.orchestrate.context import Context, Step
from kiln.runners.protocol import Command, step_env
from kiln.toolchain import consumerenv, vendortools
from kiln.verify import buildsystem, imports

log = logging.getLogger(__name__)


def wheel_requires(ctx: Context, step: Step) -> list[str] | None:
    """The ``Requires-Dist`` of the wheel ``step`` will build, read from its tree's
    metadata; None where it cannot be read before the build (said in the log)."""
    vendor = step.spec.vendor
    spec_file = step.log_file.with_suffix(".step.json")
    spec_file.write_text(step.spec.to_json())
    scratch = ctx.opts.work / ".kiln-metadata"
    scratch.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f"{vendor}-", dir=scratch))
    log_file = ctx.logs / f"{vendor}-metadata.log"
    log_file.unlink(missing_ok=True)
    try:
        res = ctx.runner.run(
            Command(
                [step.spec.python, "-m", "kiln.inside", "metadata", spec_file, out],
                Path(step.spec.tree),
                step_env(step.env),
                f"reading {vendor}'s wheel metadata",
                log_file=log_file,
                writable=[Path(step.spec.tree), out, ctx.logs],
                mem_gib=step.mem_gib,
                check=False,
            )
        )
        found = sorted(out.glob("*.dist-info/METADATA"))
        if res.returncode != 0 or len(found) != 1:
            why = (
                "its build backend has no metadata hook"
                if res.returncode == pep517.NO_METADATA_HOOK
                else f"the metadata hook exited {res.returncode} (log: {log_file})"
            )
            log.info("%s: requirements not checked before the compile: %s", vendor, why)
            return None
        return imports.requires_dist(found[0].read_text(encoding="utf-8", errors="replace"))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def environment_versions(ctx: Context, names: list[str]) -> dict[str, str]:
    """What the consumer environment holds of ``names`` (canonical): read from it where
    it is made or the requirements' pins cannot answer, else from those pins."""
    env = importproof.planned_environment(ctx)
    if not env.made():
        pins, whole = imports.pinned_versions(env.requirements)
        if whole or all(n in pins for n in names):
            return pins
        log.info(
            "import proof: the runtime requirements do not pin %s: making the consumer "
            "environment now to check the wheel's requirements before its compile",
            ", ".join(n for n in names if n not in pins),
        )
        env = importproof.environment(ctx)
    return consumerenv.distributions(env.site_packages())


def check_requirements(ctx: Context, step: Step) -> None:
    """Refuse the step before its compile when the wheel it builds requires what the
    consumer environment does not hold (:class:`kiln.errors.ImportFailed`, the import
    proof's ``requirements-unmet`` screen with the lines to add)."""
    requires = wheel_requires(ctx, step)
    if not requires:
        return
    names: list[str] = []
    for text in requires:
        try:
            names.append(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
    unmet = imports.unmet_requirements(requires, environment_versions(ctx, names))
    if unmet:
        vendor = step.spec.vendor
        raise importproof.requirements_refused(
            ctx, vendor, unmet, ctx.logs / f"{vendor}-metadata.log", before_compile=True
        )
    log.info(
        "%s: the wheel's requirements (%s) are met where it lands: checked before the compile",
        step.spec.vendor,
        ", ".join(requires),
    )


def check_build_system(ctx: Context, step: Step) -> None:
    """Refuse the step before its compile where the tree's ``[build-system] requires``
    and the build venv disagree (:mod:`kiln.verify.buildsystem`). Read where the build
    venv is on this machine (the local runner; the Docker runner's is the image's)."""
    if ctx.runner.kind != "local" or not Path(ctx.tc.site_packages).is_dir():
        return
    tree = Path(step.spec.tree)
    installed = dict(consumerenv.distributions(Path(ctx.tc.site_packages)))
    tools = tree / vendortools.TOOLS_DIR
    if tools.is_dir():  # the vendor's own build tools come first on its sys.path
        installed.update(consumerenv.distributions(tools))
    found = buildsystem.problems(tree, installed)
    if found:
        raise ConfigError(buildsystem.refusal(step.spec.vendor, found))


# What a shell runs itself, never a program to look up.
_SHELL_WORDS = frozenset({
    "cd", "export", "set", "unset", "echo", "printf", "test", "true", "false", "exit",
    "return", "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done",
    "case", "esac", "in", "command", "exec", "eval", "source", ".", ":", "[", "{", "}", "!",
    "env", "time",
})  # fmt: skip
# The Debian/Ubuntu package of a build program where its name differs or is worth saying.
_PACKAGES = {"cmake": "cmake", "make": "make", "ninja": "ninja-build", "meson": "meson"}


def command_programs(command: Sequence[str]) -> list[str]:
    """The programs an in-place ``command`` runs by name: its first word, or for ``sh -c
    SCRIPT``/``bash -c SCRIPT`` the first word of each of the script's commands (after
    ``&&``, ``||``, ``;``, ``|`` or a newline; leading ``VAR=value`` assignments skipped).
    A word with a path, a quote or a ``$`` is the build's own to resolve: not listed."""
    if len(command) >= 3 and command[0] in ("sh", "bash") and command[1] == "-c":
        segments = re.split(r"&&|\|\||;|\||\n", command[2])
    else:
        segments = [command[0]]
    found: list[str] = []
    for segment in segments:
        words = segment.split()
        while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
            words.pop(0)
        if not words:
            continue
        word = words[0]
        plain = re.fullmatch(r"[A-Za-z][\w.+-]*", word)
        if plain and word not in _SHELL_WORDS and word not in found:
            found.append(word)
    return found


def check_programs(ctx: Context, step: Step, command: Sequence[str]) -> None:
    """Refuse an in-place step before its compile where a program its command runs by
    name is not on the step's PATH where it runs (this machine for the local runner, the
    builder image for Docker), instead of the shell's ``cmake: not found`` after it."""
    programs = command_programs(command)
    if not programs:
        return
    probe = 'for p in "$@"; do command -v "$p" >/dev/null 2>&1 || echo "$p"; done'
    vendor = step.spec.vendor
    res = ctx.runner.run(
        Command(
            ["sh", "-c", probe, "kiln-programs", *programs],
            Path(step.spec.tree),
            step_env(step.env),
            f"looking up the programs {vendor}'s command runs",
            check=False,
        )
    )
    missing = [p for p in res.output.split() if p in programs]
    if not missing:
        return
    docker = ctx.runner.kind == "docker"
    where = "the builder image" if docker else "this machine's PATH"
    packages = " ".join(_PACKAGES.get(p, p) for p in missing)
    how = f"apt-get install {packages}" + (" in the image's Dockerfile" if docker else "")
    raise ConfigError(
        f"vendors/{vendor}.toml: build.command runs {', '.join(missing)}, not installed "
        f"where the build runs ({where}): install it there (Debian/Ubuntu: {how})"
    )
