"""Every option of the command line, declared once (nox's ``_options.py`` is the model).

An :class:`~kiln.orchestrate.options.Option` holds everything about one option: its flag,
type, choices, default, ``KILN_*`` variable, help, and the
:class:`~kiln.orchestrate.options.Options` field it fills: the build's options are declared
on those fields themselves (``FIELD_OPTIONS``, each default written once), the others here.
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
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kiln.inside.kit import contract
from kiln.orchestrate.options import FIELD_OPTIONS, NOT_GIVEN, Option, Options

# The parsed arguments' attribute listing the options a verb took (resolve() reads it).
DECLARED = "_kiln_options"


def add(parser: argparse.ArgumentParser, *options: Option) -> None:
    """Add ``options`` to a verb's parser, each in its --help group, and note them for
    :func:`resolve`."""
    groups = {g.title: g for g in parser._action_groups}
    for opt in options:
        group = groups.get(opt.group)
        if group is None:
            group = groups[opt.group] = parser.add_argument_group(opt.group)
        add_argument(group, opt)
    taken = parser.get_default(DECLARED) or ()
    parser.set_defaults(**{DECLARED: (*taken, *options)})


def add_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, opt: Option) -> None:
    """One option as an argparse argument: its default is :data:`NOT_GIVEN` (so the
    variable and the declared default are applied by :func:`resolve`, in that order)."""
    if opt.kind == "flag":
        parser.add_argument(
            opt.flag,
            dest=opt.name,
            help=opt.help_text(),
            action="store_const",
            const=True,
            default=NOT_GIVEN,
        )
        return
    action, nargs, default = "store", None, None if opt.required else NOT_GIVEN
    if opt.kind == "list":
        action, default = "append", None
    elif opt.kind == "words":
        nargs, default = "+", NOT_GIVEN
    parser.add_argument(
        opt.flag,
        dest=opt.name,
        help=opt.help_text(),
        type=opt.type,
        metavar=opt.metavar,
        choices=opt.choices,
        action=action,
        nargs=nargs,
        default=default,
        required=opt.required and opt.kind not in ("list", "words"),
    )


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

WORKSPACE = FIELD_OPTIONS["workspace"]
PROFILE = FIELD_OPTIONS["profile"]
ARTIFACTS = FIELD_OPTIONS["artifacts"]
CACHE = FIELD_OPTIONS["cache"]
WORK = FIELD_OPTIONS["work"]
MIRRORS = FIELD_OPTIONS["mirrors"]
OFFLINE = FIELD_OPTIONS["offline"]
BUNDLES = FIELD_OPTIONS["bundles"]
PYTHON = FIELD_OPTIONS["python"]
CUDA_HOME = FIELD_OPTIONS["cuda_home"]
TOOLCHAIN = FIELD_OPTIONS["toolchain"]
RUNNER = FIELD_OPTIONS["runner"]
IMAGE = FIELD_OPTIONS["image"]
ALLOW_UNPINNED_IMAGE = FIELD_OPTIONS["allow_unpinned_image"]
DOCKER_DIR = FIELD_OPTIONS["docker_dir"]
DOCKER_MOUNT = FIELD_OPTIONS["docker_mounts"]
KEEP_CONTAINER = FIELD_OPTIONS["keep_container"]
MEM_LIMIT = FIELD_OPTIONS["mem_limit_gib"]
JOBS = FIELD_OPTIONS["jobs"]
MEM_BUDGET = FIELD_OPTIONS["mem_budget_gib"]
COMPILER_CACHE = FIELD_OPTIONS["compiler_cache"]
NO_COMPILER_CACHE = FIELD_OPTIONS["no_compiler_cache"]
COMPILER_CACHE_BACKEND = FIELD_OPTIONS["cache_backend"]
CACHE_STORE = FIELD_OPTIONS["cache_store"]
DISTRIBUTE = FIELD_OPTIONS["distribute"]
ARTIFACT_CACHE = FIELD_OPTIONS["artifact_cache_dir"]
NO_ARTIFACT_CACHE = FIELD_OPTIONS["artifact_cache"]
WAIT = FIELD_OPTIONS["wait"]
LEARNED_FROM = FIELD_OPTIONS["learned_from"]
SAVE_LEARNED = FIELD_OPTIONS["save_learned"]
TIMINGS = FIELD_OPTIONS["timings"]
NO_IMPORT_PROOF = FIELD_OPTIONS["import_proof"]
PROOF_ENV = FIELD_OPTIONS["proof_env"]
SIGN = FIELD_OPTIONS["sign"]
ALLOW_NETWORK = FIELD_OPTIONS["allow_network"]

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
    ALLOW_NETWORK,
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
    PROOF_ENV,
    SIGN,
)

# --------------------------------------------------------------------------- other verbs' options

DRY_RUN = Option(
    "--dry-run",
    "say what the build would do (cache hits and misses and why, what would be fetched, "
    "jobs, threads and memory) and build nothing",
    kind="flag",
)
JSON = Option("--json", "with --dry-run: the plan as JSON", kind="flag")
FIX = Option(
    "--fix",
    "where the build fails, apply the fixes it printed that are mechanical (a key of a "
    "vendor TOML, lines of runtime-requirements.txt), show each as a diff, and build again "
    "once",
    kind="flag",
)
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
    env=contract.PROFILE,
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
    env=contract.GPU_PYTHON,
    metavar="PYTHON",
)
WHEEL_VENDOR = Option(
    "--vendor",
    "expect this vendor's recipe archs",
    default_text="the profile's",
    env=contract.VENDOR,
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
ADD_NO_CHECK = Option(
    "--no-check",
    "write the recipe without compiling its first .cu and C++ unit with the drafted archs "
    "and flags first",
    kind="flag",
)


def options_of(parsers: Iterable[argparse.ArgumentParser]) -> list[Option]:
    """The options the given parsers took, each once, in the order first seen."""
    seen: list[Option] = []
    for p in parsers:
        for opt in p.get_default(DECLARED) or ():
            if opt not in seen:
                seen.append(opt)
    return seen
