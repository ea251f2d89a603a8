"""What a step can be refused for before its compile (issue 40): what the wheel will
require, held against the consumer environment install.sh makes; what its
``[build-system] requires``, held against the build venv it is built in; and, for an
in-place build, the programs its own command runs (cmake, make), looked up where the
step runs.

The tree's PEP 517 metadata gives the wheel's ``Requires-Dist``: the step writes it
first, in the interpreter that then builds the wheel (the backend's
``prepare_metadata_for_build_wheel``, in the step's own environment and runner; setup.py
runs, nothing compiles), and waits while kiln checks (:class:`RequirementsCheck`). They
are held against what the consumer environment holds: the environment itself where it
is made; else the pins of install.sh's requirements, where they answer (a whole lock,
or pins naming every requirement); else the environment is made now, once (it is made
for the import proof anyway). The import proof checks the same again after the build,
on the wheel itself (kiln's torch pin included); this one finds it before minutes of
compiling. A tree whose metadata cannot be read (its backend has no metadata hook, or
the hook fails) is built as before: the proof checks the wheel.

Why in the step, not a process of its own before it: setup.py's start (torch imported,
the link stub made) cost a second interpreter 4 CPU-seconds per step, 13 for the three
public upstreams, before their first compile (process accounting of a cold build).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kiln import fsutil
from kiln.errors import BuildError, ConfigError, KilnError
from kiln.inside import pep517
from kiln.orchestrate import importproof
from kiln.orchestrate.context import Context, Step
from kiln.runners.protocol import Command, step_env
from kiln.toolchain import consumerenv, vendortools
from kiln.verify import buildsystem, cmakeswitch, imports

log = logging.getLogger(__name__)


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
    return env.distributions()


def unmet_requirements(ctx: Context, requires: list[str]) -> list[tuple[Requirement, str | None]]:
    """What of ``requires`` (``Requires-Dist`` lines) the consumer environment does not
    hold."""
    names: list[str] = []
    for text in requires:
        try:
            names.append(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
    return imports.unmet_requirements(requires, environment_versions(ctx, names))


class RequirementsCheck:
    """The wheel's ``Requires-Dist`` held against the consumer environment while its step
    waits, before its compile (a context manager around the step's run).

    The step writes the tree's metadata first, in the interpreter that then builds the
    wheel (:data:`kiln.inside.pep517.HOOK`: one setup.py start and one torch import for
    both), names its ``.dist-info`` in ``METADATA_DIR/ready`` and waits for the verdict
    this check writes: ``go``, or why it stops. A thread here waits for ``ready`` (or
    for the step's end: a step that failed before it has its own error) and checks. A
    refusal is raised by :meth:`refusal` once the step has stopped: the import proof's
    ``requirements-unmet`` screen, with the lines to add."""

    def __init__(self, ctx: Context, step: Step) -> None:
        self.ctx, self.step = ctx, step
        self.folder = Path(step.spec.out_dir) / ".kiln-metadata"
        self._ended = threading.Event()
        self._unmet: list[tuple[Requirement, str | None]] = []
        self._error: KilnError | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True, name="requirements")

    def __enter__(self) -> Step:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self._thread.start()
        spec = dataclasses.replace(self.step.spec, metadata_dir=str(self.folder))
        return dataclasses.replace(self.step, spec=spec)

    def __exit__(self, *exc: object) -> None:
        self._ended.set()
        self._thread.join()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _watch(self) -> None:
        ready = self.folder / pep517.READY
        while not ready.is_file():
            if self._ended.wait(0.05):
                return
        verdict = "go"
        try:
            verdict = self._check(ready.read_text().strip())
        except KilnError as exc:  # the consumer environment could not be made, say
            self._error, verdict = exc, str(exc).splitlines()[0]
        except Exception as exc:  # never a step left waiting for ever
            self._error = BuildError(f"checking {self.step.spec.vendor}'s requirements: {exc!r}")
            verdict = str(self._error)
        fsutil.write_atomic(self.folder / pep517.VERDICT, verdict)

    def _check(self, name: str) -> str:
        vendor = self.step.spec.vendor
        if not name:
            log.info("%s: requirements not checked before the compile: no metadata", vendor)
            return "go"
        meta = self.folder / name / "METADATA"
        requires = imports.requires_dist(meta.read_text(encoding="utf-8", errors="replace"))
        self._unmet = unmet_requirements(self.ctx, requires) if requires else []
        if self._unmet:
            return "the wheel requires what the consumer environment does not hold"
        if requires:
            log.info(
                "%s: the wheel's requirements (%s) are met where it lands: checked before "
                "the compile",
                vendor,
                ", ".join(requires),
            )
        return "go"

    def refusal(self) -> KilnError | None:
        """Why this check stopped the step, once it has ended; None where it did not."""
        self._ended.set()
        self._thread.join()
        if self._error is not None:
            return self._error
        if self._unmet:
            vendor = self.step.spec.vendor
            return importproof.requirements_refused(
                self.ctx, vendor, self._unmet, self.step.log_file, before_compile=True
            )
        return None


def check_build_system(ctx: Context, step: Step) -> None:
    """Refuse the step before its compile where the tree's ``[build-system] requires``
    and the build venv disagree (:mod:`kiln.verify.buildsystem`). Read where the build
    venv is on this machine (the local runner; the Docker runner's is the image's)."""
    if not ctx.runner.capabilities.host_paths or not Path(ctx.tc.site_packages).is_dir():
        return
    tree = Path(step.spec.tree)
    installed = dict(consumerenv.distributions(Path(ctx.tc.site_packages)))
    tools = tree / vendortools.TOOLS_DIR
    if tools.is_dir():  # the vendor's own build tools come first on its sys.path
        installed.update(consumerenv.distributions(tools))
        lacking = buildsystem.tools_unmet(tools, installed)
        if lacking:
            raise ConfigError(buildsystem.tools_refusal(step.spec.vendor, lacking))
    found = buildsystem.problems(tree, installed)
    if found:
        raise ConfigError(buildsystem.refusal(step.spec.vendor, found))


def check_cuda_switches(ctx: Context, step: Step) -> None:
    """Refuse the step before its first compile where the tree's CMake switch leaves its
    CUDA part out (:mod:`kiln.verify.cmakeswitch`) and the recipe, which builds device
    code (``archs``), does not set it: the switch named, with the line that sets it."""
    vendor = ctx.ws.vendors[step.spec.vendor]
    tree = Path(step.spec.tree)
    if not vendor.build.archs or not (tree / "CMakeLists.txt").is_file():
        return
    subs = [str(s.path) for s in vendor.source.submodules]
    env = dict(vendor.build.env)
    unset = [
        sw
        for sw in cmakeswitch.cuda_switches(tree, subs)
        if not cmakeswitch.set_by(sw, vendor.build.command or [], env)
    ]
    if not unset:
        return
    sw = unset[0]
    where = (
        f"add {sw.define()} to build.command's cmake configure line"
        if vendor.build.kind == "inplace"
        else f'set CMAKE_ARGS = "{sw.define()}" in [build.env]'
    )
    raise ConfigError(
        f"{vendor.name}: {sw.declared}: {sw.name} defaults to {sw.default or '(empty)'}, "
        f"which leaves the CUDA part out ({sw.gates} compiles it only for {sw.enables}), and "
        f"the recipe does not set it: the build would make no device code for "
        f"{', '.join(vendor.build.archs)}; fix: {where} of vendors/{vendor.name}.toml"
    )


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
    can = ctx.runner.capabilities
    where = can.programs_from
    packages = " ".join(_PACKAGES.get(p, p) for p in missing)
    how = f"apt-get install {packages}{can.install_in}"
    raise ConfigError(
        f"vendors/{vendor}.toml: build.command runs {', '.join(missing)}, not installed "
        f"where the build runs ({where}): install it there (Debian/Ubuntu: {how})"
    )
