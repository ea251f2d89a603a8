"""Every option of the command line, declared once (nox's ``_options.py`` is the model).

An :class:`Option` holds everything about one option: its flag, type, choices, default,
``KILN_*`` variable, help, and the :class:`~kiln.orchestrate.options.Options` field it fills.
From these declarations alone come the argparse arguments (:func:`add`), the ``--help``
text (the default and the variable appended), the values (:func:`resolve`: the command
line, else the variable, else the default), the build's ``Options`` (:func:`to_options`)
and the table in ``docs/options.md`` (``kiln.commands.docs``). An option several verbs
take (``--workspace``, ``--cache``, ``--offline``...) is one declaration they all add;
a verb that needs another default makes a variant with :func:`dataclasses.replace`.

Variables: an empty one counts as unset. A flag's variable is ``1``/``true``/``yes``/``on``
or ``0``/``false``/``no``/``off``; a list's is split like a shell line (``shlex``:
``KILN_DOCKER_MOUNTS='/usr/local/cuda:/usr/local/cuda:ro /data'``). A value that does not
parse is a :class:`~kiln.errors.ConfigError` naming the variable, read only by the verb
that takes the option (a bad ``KILN_JOBS`` does not stop ``kiln manifest check``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from kiln.errors import ConfigError
from kiln.fsutil import user_cache_dir
from kiln.orchestrate.options import Options

Kind = Literal["value", "flag", "list", "words"]

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
# The parsed arguments' attribute listing the options a verb took (resolve() reads it).
DECLARED = "_kiln_options"


class _NotGiven:
    """The argparse default of every option: tells "not on the command line" apart from
    any value one could give."""

    def __repr__(self) -> str:
        return "<not given>"


NOT_GIVEN: Any = _NotGiven()


@dataclass(frozen=True)
class Option:
    flag: str  # "--workspace"
    help: str  # what it is and does; the default and the variable are appended
    group: str = "options"  # the section of --help and of docs/options.md
    kind: Kind = "value"  # value | flag (on when given) | list (repeatable) | words (nargs +)
    type: Callable[[str], Any] = str
    default: Any = None  # when neither the command line nor the variable gives a value
    default_factory: Callable[[], Any] | None = None  # a default computed when it is needed
    default_text: str | None = None  # how a computed default is shown (help, docs)
    choices: tuple[str, ...] | None = None
    env: str | None = None  # KILN_*: the value when the command line gives none
    metavar: str | None = None
    dest: str | None = None  # the parsed attribute (default: from the flag)
    field: str | None = None  # the Options field it fills (None: the verb reads it)
    invert: bool = False  # the field is the flag's negation: --no-artifact-cache
    required: bool = False

    @property
    def name(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    def shown_default(self) -> str:
        """The default as --help and the docs show it."""
        if self.default_text is not None:
            return self.default_text
        if self.kind == "flag":
            return "off"
        if self.default in (None, (), []):
            return "none"
        return str(self.default)

    def help_text(self) -> str:
        env = ""
        if self.env:
            env = f"; ${self.env}=1" if self.kind == "flag" else f"; ${self.env}"
        if self.required:
            return f"{self.help} (required{env})".replace("%", "%%")
        return f"{self.help} (default: {self.shown_default()}{env})".replace("%", "%%")

    def from_env(self, environ: dict[str, str] | os._Environ[str]) -> Any:
        """The variable's value, parsed (NOT_GIVEN when it is unset or empty)."""
        raw = environ.get(self.env or "", "") if self.env else ""
        if not raw.strip():
            return NOT_GIVEN
        fix = f"${self.env}={raw!r}"
        if self.kind == "flag":
            if raw.strip().lower() in TRUE:
                return True
            if raw.strip().lower() in FALSE:
                return False
            raise ConfigError(f"{fix}: not a flag value: set it to 1 or 0 (or unset it)")
        words = shlex.split(raw) if self.kind in ("list", "words") else [raw]
        values = [self._parse(fix, w) for w in words]
        return values if self.kind in ("list", "words") else values[0]

    def _parse(self, fix: str, word: str) -> Any:
        if self.choices and word not in self.choices:
            raise ConfigError(f"{fix}: not one of {', '.join(self.choices)} ({self.flag})")
        try:
            return self.type(word)
        except ValueError:
            kind = (
                "whole number" if self.type is int else "number" if self.type is float else "value"
            )
            raise ConfigError(f"{fix}: not a {kind} ({self.flag} {self.metavar or ''})") from None

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        kw: dict[str, Any] = {"dest": self.name, "help": self.help_text()}
        if self.kind == "flag":
            kw.update(action="store_const", const=True, default=NOT_GIVEN)
        else:
            kw.update(type=self.type, metavar=self.metavar, choices=self.choices)
            if self.kind == "list":
                kw.update(action="append", default=None)
            elif self.kind == "words":
                kw.update(nargs="+", default=NOT_GIVEN)
            else:
                kw.update(default=None if self.required else NOT_GIVEN, required=self.required)
        parser.add_argument(self.flag, **kw)


def add(parser: argparse.ArgumentParser, *options: Option) -> None:
    """Add ``options`` to a verb's parser, each in its --help group, and note them for
    :func:`resolve`."""
    groups = {g.title: g for g in parser._action_groups}
    for opt in options:
        group = groups.get(opt.group)
        if group is None:
            group = groups[opt.group] = parser.add_argument_group(opt.group)
        opt.add_to(group)
    taken = parser.get_default(DECLARED) or ()
    parser.set_defaults(**{DECLARED: (*taken, *options)})


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> None:
    """Fill each option the command line left out: its variable, else its default."""
    env = os.environ if environ is None else environ
    for opt in getattr(args, DECLARED, ()):
        value = getattr(args, opt.name, NOT_GIVEN)
        if value is NOT_GIVEN or (opt.kind == "list" and value is None):
            value = opt.from_env(env)
        if value is NOT_GIVEN:
            value = False if opt.kind == "flag" else opt.default
            if opt.default_factory is not None:
                value = opt.default_factory()
            if opt.kind in ("list", "words") and value is not None:
                value = list(value)
        setattr(args, opt.name, value)


def to_options(args: argparse.Namespace, **fields: Any) -> Options:
    """The build's ``Options`` from the resolved arguments (``fields``: what no option
    gives, such as the vendors)."""
    values: dict[str, Any] = {}
    for opt in getattr(args, DECLARED, ()):
        if opt.field is None:
            continue
        value = getattr(args, opt.name)
        if opt.invert:
            value = not value
        elif opt.kind in ("list", "words"):
            value = tuple(value or ())
        values[opt.field] = value
    return Options(**{**values, **fields})


# --------------------------------------------------------------------------- build options
# What a build takes (build, demo, verify); the first ones also serve other verbs.

WORKSPACE = Option(
    "--workspace",
    "folder with kiln.toml, vendors/ and patches/",
    group="folders",
    type=Path,
    default=Path("."),
    env="KILN_WORKSPACE",
    metavar="DIR",
    field="workspace",
)
PROFILE = Option(
    "--profile",
    "which profile: a [profiles.NAME] variant of kiln.toml's [profile], or 'default' (itself)",
    group="folders",
    default=None,
    default_text="[profile]",
    env="KILN_PROFILE",
    metavar="NAME",
    field="profile",
)
ARTIFACTS = Option(
    "--artifacts",
    "where releases and their logs go: <artifacts>/<release>/",
    group="folders",
    type=Path,
    default=Path("artifacts"),
    env="KILN_ARTIFACTS",
    metavar="DIR",
    field="artifacts",
)
CACHE = Option(
    "--cache",
    "kiln's cache: bare clones, build venvs, the PyPI CUDA, the compiler and artifact caches",
    group="folders",
    type=Path,
    default_factory=user_cache_dir,
    default_text="$XDG_CACHE_HOME/kiln, else ~/.cache/kiln",
    env="KILN_CACHE_DIR",
    metavar="DIR",
    field="cache",
)
WORK = Option(
    "--work",
    "where work trees are checked out",
    group="folders",
    type=Path,
    default=Path("build/work"),
    env="KILN_WORK",
    metavar="DIR",
    field="work",
)
MIRRORS = Option(
    "--mirrors",
    "TOML mapping upstream URL prefixes to mirrors",
    group="sources",
    type=Path,
    env="KILN_MIRRORS",
    metavar="FILE",
    field="mirrors",
)
OFFLINE = Option(
    "--offline",
    "never use the network: only the cache and local mirrors",
    group="sources",
    kind="flag",
    env="KILN_OFFLINE",
    field="offline",
)
# Not $KILN_BUNDLES: the tests and nox -s build_public use that for where the bundles of
# the public upstreams lie, which must not turn every build into a build from bundles.
BUNDLES = Option(
    "--bundles",
    "upstreams from the git bundles in DIR, as the workspace's bundles.toml names them "
    "(made into mirrors; implies --offline)",
    group="sources",
    type=Path,
    env="KILN_FROM_BUNDLES",
    metavar="DIR",
    field="bundles",  # made mirrors by the build's inputs stage, never by a dry run
)
PYTHON = Option(
    "--python",
    "build Python holding the profile's torch",
    group="toolchain",
    default_text="a venv kiln provisions once",
    env="KILN_BUILD_PYTHON",
    metavar="PYTHON",
    field="python",
)
CUDA_HOME = Option(
    "--cuda-home",
    "the CUDA toolkit to compile with",
    group="toolchain",
    default_text="$CUDA_HOME, nvcc on PATH, /usr/local/cuda",
    env="KILN_CUDA_HOME",
    metavar="DIR",
    field="cuda_home",
)
TOOLCHAIN = Option(
    "--toolchain",
    "pypi: the profile's CUDA from NVIDIA's hash-pinned PyPI wheels, local runner only",
    group="toolchain",
    default="system",
    choices=("system", "pypi"),
    env="KILN_TOOLCHAIN",
    field="toolchain",
)
RUNNER = Option(
    "--runner",
    "where builds run; auto: docker when the profile names an image and a daemon answers, "
    "else local",
    group="where builds run",
    default="auto",
    choices=("auto", "local", "docker"),
    env="KILN_RUNNER",
    field="runner",
)
IMAGE = Option(
    "--image",
    "base image for the Docker runner, NAME:TAG@sha256:DIGEST",
    group="where builds run",
    default_text="profile.image",
    env="KILN_IMAGE",
    metavar="REF",
    field="image",
)
ALLOW_UNPINNED_IMAGE = Option(
    "--allow-unpinned-image",
    "accept an image without a digest (the manifest says 'unpinned')",
    group="where builds run",
    kind="flag",
    env="KILN_ALLOW_UNPINNED_IMAGE",
    field="allow_unpinned_image",
)
DOCKER_DIR = Option(
    "--docker-dir",
    "the builder image's folder",
    group="where builds run",
    type=Path,
    default_text="<workspace>/docker",
    env="KILN_DOCKER_DIR",
    metavar="DIR",
    field="docker_dir",
)
DOCKER_MOUNT = Option(
    "--docker-mount",
    "an extra bind mount for build containers, e.g. a CUDA toolkit; repeatable",
    group="where builds run",
    kind="list",
    env="KILN_DOCKER_MOUNTS",
    metavar="SRC[:DST[:ro|rw]]",
    field="docker_mounts",
)
KEEP_CONTAINER = Option(
    "--keep-container",
    "keep a failed step's build container (docker start -ai it to look inside)",
    group="where builds run",
    kind="flag",
    env="KILN_KEEP_CONTAINER",
    field="keep_container",
)
MEM_LIMIT = Option(
    "--mem-limit",
    "memory limit of a build step",
    group="where builds run",
    type=float,
    default_text="what the scheduler planned",
    env="KILN_MEM_LIMIT",
    metavar="GIB",
    field="mem_limit_gib",
)
JOBS = Option(
    "--jobs",
    "CPU slots for compiles across all steps",
    group="speed and caches",
    type=int,
    default_text="this machine's usable CPUs: its affinity and cgroup CPU quota",
    env="KILN_JOBS",
    metavar="N",
    field="jobs",
)
MEM_BUDGET = Option(
    "--mem-budget",
    "memory all compiles together may use",
    group="speed and caches",
    type=float,
    default_text="available memory minus a margin",
    env="KILN_MEM_BUDGET",
    metavar="GIB",
    field="mem_budget_gib",
)
COMPILER_CACHE = Option(
    "--compiler-cache",
    "the compiler cache's folder (a volume for the Docker runner; rebuild-c shares it)",
    group="speed and caches",
    type=Path,
    default_text="<cache>/ccache or <cache>/sccache",
    env="KILN_COMPILER_CACHE",
    metavar="DIR",
    field="compiler_cache",
)
NO_COMPILER_CACHE = Option(
    "--no-compiler-cache",
    "compile without ccache or sccache",
    group="speed and caches",
    kind="flag",
    env="KILN_NO_COMPILER_CACHE",
    field="no_compiler_cache",
)
COMPILER_CACHE_BACKEND = Option(
    "--compiler-cache-backend",
    "ccache, or sccache (implied by --distribute and s3:// or gha:// stores)",
    group="speed and caches",
    choices=("ccache", "sccache"),
    default_text="ccache",
    env="KILN_COMPILER_CACHE_BACKEND",
    field="cache_backend",
)
CACHE_STORE = Option(
    "--cache-store",
    "a compiler cache shared by builders: redis://HOST:PORT or http:// (ccache, sccache), "
    "s3://BUCKET/PREFIX[?endpoint=URL] or gha:// (sccache), or a folder; credentials from "
    "the environment",
    group="speed and caches",
    env="KILN_CACHE_STORE",
    metavar="URL",
    field="cache_store",
)
DISTRIBUTE = Option(
    "--distribute",
    "send compiles to this sccache-dist scheduler (its token: $KILN_DIST_TOKEN)",
    group="speed and caches",
    env="KILN_DISTRIBUTE",
    metavar="URL",
    field="distribute",
)
ARTIFACT_CACHE = Option(
    "--artifact-cache",
    "the cache of verified outputs by input hash",
    group="speed and caches",
    type=Path,
    default_text="<cache>/artifacts",
    env="KILN_ARTIFACT_CACHE",
    metavar="DIR",
    field="artifact_cache_dir",
)
NO_ARTIFACT_CACHE = Option(
    "--no-artifact-cache",
    "rebuild every vendor even when its inputs are unchanged",
    group="speed and caches",
    kind="flag",
    env="KILN_NO_ARTIFACT_CACHE",
    field="artifact_cache",
    invert=True,
)
WAIT = Option(
    "--wait",
    "wait for another build using the same artifacts/ or work folder instead of refusing",
    group="folders",
    kind="flag",
    env="KILN_WAIT",
    field="wait",
)
LEARNED_FROM = Option(
    "--learned-from",
    "schedule from another build's learned unit times and memory: a manifest.json or a "
    "learned.json (default: what the cache learned, else <workspace>/learned.json)",
    group="speed and caches",
    type=Path,
    env="KILN_LEARNED_FROM",
    metavar="FILE",
    field="learned_from",
)
SAVE_LEARNED = Option(
    "--save-learned",
    "write what this build learned into <workspace>/learned.json (to commit: a fresh "
    "machine's first build is then scheduled like the tenth)",
    group="speed and caches",
    kind="flag",
    env="KILN_SAVE_LEARNED",
    field="save_learned",
)
TIMINGS = Option(
    "--timings",
    "write the build's timings into its logs folder: timings.html (a Gantt chart of every "
    "compile per slot, phases, concurrency and memory against the budget; opens offline) "
    "and timings.trace.json (for ui.perfetto.dev or chrome://tracing); docs/timings.md",
    group="speed and caches",
    kind="flag",
    env="KILN_TIMINGS",
    field="timings",
)
NO_IMPORT_PROOF = Option(
    "--no-import-proof",
    "skip the import proof (each output installed as install.sh installs it into the "
    "consumer's environment and imported there before anything is published)",
    group="verification",
    kind="flag",
    env="KILN_NO_IMPORT_PROOF",
    field="import_proof",
    invert=True,
)

BUILD: tuple[Option, ...] = (
    WORKSPACE,
    PROFILE,
    ARTIFACTS,
    CACHE,
    WORK,
    WAIT,
    MIRRORS,
    OFFLINE,
    BUNDLES,
    PYTHON,
    CUDA_HOME,
    TOOLCHAIN,
    RUNNER,
    IMAGE,
    ALLOW_UNPINNED_IMAGE,
    DOCKER_DIR,
    DOCKER_MOUNT,
    KEEP_CONTAINER,
    MEM_LIMIT,
    JOBS,
    MEM_BUDGET,
    LEARNED_FROM,
    SAVE_LEARNED,
    TIMINGS,
    COMPILER_CACHE,
    NO_COMPILER_CACHE,
    COMPILER_CACHE_BACKEND,
    CACHE_STORE,
    DISTRIBUTE,
    ARTIFACT_CACHE,
    NO_ARTIFACT_CACHE,
    NO_IMPORT_PROOF,
)

# --------------------------------------------------------------------------- other verbs' options

DRY_RUN = Option(
    "--dry-run",
    "say what the build would do (cache hits and misses and why, what would be fetched, "
    "jobs, threads and memory) and build nothing",
    kind="flag",
)
JSON = Option("--json", "with --dry-run: the plan as JSON", kind="flag")
TIMINGS_OUT = Option(
    "--out",
    "folder for timings.html and timings.trace.json",
    type=Path,
    default_text="the build's logs folder",
    metavar="DIR",
    dest="timings_out",
)
INTO = Option(
    "--into",
    "folder for the rebuild",
    type=Path,
    default_text="a new temporary folder",
    metavar="DIR",
)
REBUILT = Option(
    "--rebuilt",
    "compare against this earlier rebuild instead of building again",
    type=Path,
    metavar="DIR",
)
REBUILD_PYTHON = Option(
    "--python",
    "the Python with torch",
    default_text="the one install.sh recorded",
    metavar="PYTHON",
)
JIT_NAME = Option(
    "--name", "label: jit-cache/jit-cache-<name>.tar.zst", required=True, metavar="LABEL"
)
JIT_RELEASE = Option(
    "--release",
    "release folder",
    type=Path,
    default_text="artifacts/<release>, the release of ./kiln.toml",
    metavar="DIR",
)
MERGE_OUT = Option("--out", "the merged release folder", type=Path, required=True, metavar="DIR")
MERGE_WORKSPACE = replace(
    WORKSPACE,
    help="also require the partials to cover exactly this workspace's vendors and profile "
    "(--profile)",
    default=None,
    default_text="no such check",
    env=None,
    field=None,
)
PLAN_PROFILES = Option(
    "--profile",
    "only this profile ('default': [profile]; a [profiles.NAME] name); repeatable",
    kind="list",
    default_text="[profile] and every [profiles.NAME]",
    env="KILN_PROFILE",
    metavar="NAME",
    dest="profiles",
)
PLAN_JSON = Option("--json", '{"include": [...]} on one line, for fromJSON', kind="flag")
PLAN_RELEASES = Option(
    "--releases",
    "one row per profile (the release job's matrix: the merged release of each) "
    "instead of one per upstream x profile",
    kind="flag",
)
PLAN_RELEASE_NAME = Option("--release-name", "print the release's name only", kind="flag")
PUBLISH_TO = Option(
    "--to", "a folder, file:///PATH, or hf://ORG/NAME", required=True, metavar="TARGET"
)
PUBLISH_DRY_RUN = Option("--dry-run", "list what would be uploaded", kind="flag")
PUBLISH_FORCE = Option(
    "--force",
    "publish even into a target whose files kiln did not write (else refused)",
    kind="flag",
)
GPU_PYTHON = Option(
    "--python",
    "the Python whose torch (with CUDA) the test environment builds on",
    default=sys.executable,
    default_text="this one",
    env="KILN_GPU_PYTHON",
    metavar="PYTHON",
)
WHEEL_VENDOR = Option(
    "--vendor",
    "expect this vendor's recipe archs",
    default_text="the profile's",
    env="KILN_VENDOR",
    metavar="NAME",
)
WHEEL_ARCHS = Option(
    "--archs",
    "expect exactly these SASS archs",
    kind="words",
    default_text="the vendor's or the profile's",
    metavar="ARCH",
)
WHEEL_MANIFEST = Option(
    "--manifest",
    "verify every wheel a release lists, against its recipe and the record",
    type=Path,
    metavar="FILE",
)
ADD_NAME = Option(
    "--name",
    "the vendor's name: vendors/NAME.toml",
    default_text="the repository's name, lowercased",
    metavar="NAME",
)
ADD_FORCE = Option("--force", "overwrite an existing vendors/NAME.toml", kind="flag")
ADD_NO_DRY_RUN = Option("--no-dry-run", "write the recipe, do not dry-run it", kind="flag")


def options_of(parsers: Iterable[argparse.ArgumentParser]) -> list[Option]:
    """The options the given parsers took, each once, in the order first seen."""
    seen: list[Option] = []
    for p in parsers:
        for opt in p.get_default(DECLARED) or ():
            if opt not in seen:
                seen.append(opt)
    return seen
