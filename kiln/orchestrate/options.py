"""What a build was asked to do: the command line as one frozen value, and each option
declared once, on the field it fills (nox's ``_options.py`` is the model).

Each field of :class:`Options` that the command line sets is declared with
:func:`option`: its flag, help, group, type, choices, ``KILN_*`` variable and its default,
written once (the field's default is the option's). ``kiln.commands.flags`` reads the
declarations back (:data:`FIELD_OPTIONS`) to make the parser, ``--help``, the values and
``docs/options.md``; options no build field takes (``--dry-run``, ``--to``) are declared
there. Made once (by the CLI, a test, ``kiln verify``) and never changed afterwards;
``kiln verify`` rebuilds a release with another value made by :func:`dataclasses.replace`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, overload

from kiln.errors import ConfigError
from kiln.fsutil import user_cache_dir
from kiln.inside.kit import contract

Kind = Literal["value", "flag", "list", "words"]
# The choices of the options that take one: each a Literal, its values written once (the
# field's type, the parser's choices and --help all read it).
# auto and kiln.runners.registry.RUNNERS' names (not imported here: it costs the CLI the
# runners' imports; tests/unit/test_runner_registry.py holds them equal)
RunnerChoice = Literal["auto", "local", "docker"]
ToolchainChoice = Literal["system", "pypi"]
ProofEnvChoice = Literal["install", "build-python"]
CacheBackend = Literal["ccache", "sccache"]

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class _NotGiven:
    """The parser's default of every option (kiln.commands.flags): tells "not on the
    command line" apart from any value one could give."""

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


T = TypeVar("T")


@overload
def option(flag: str, help: str, *, default: T, **declared: Any) -> T: ...


@overload
def option(flag: str, help: str, *, default_factory: Callable[[], T], **declared: Any) -> T: ...


def option(
    flag: str,
    help: str,
    *,
    default: Any = None,
    default_factory: Callable[[], Any] | None = None,
    **declared: Any,
) -> Any:
    """A field of :class:`Options` that an option sets: its default is the option's, and
    its type is the field's own (the annotation, checked against the default)."""
    decl = Option(flag, help, default=default, default_factory=default_factory, **declared)
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={"option": decl})
    return field(default=default, metadata={"option": decl})


@dataclass(frozen=True)
class Options:
    workspace: Path = option(
        "--workspace",
        "folder with kiln.toml, vendors/ and patches/",
        group="folders",
        type=Path,
        default=Path("."),
        env=contract.WORKSPACE,
        metavar="DIR",
    )
    vendors: tuple[str, ...] | None = None
    profile: str | None = option(
        "--profile",
        "which profile: a [profiles.NAME] variant of kiln.toml's [profile], or 'default' (itself)",
        group="folders",
        default=None,
        default_text="[profile]",
        env=contract.PROFILE,
        metavar="NAME",
    )
    artifacts: Path = option(
        "--artifacts",
        "where releases and their logs go: <artifacts>/<release>/",
        group="folders",
        type=Path,
        default=Path("artifacts"),
        env=contract.ARTIFACTS,
        metavar="DIR",
    )
    cache: Path = option(
        "--cache",
        "kiln's cache: bare clones, build venvs, the PyPI CUDA, the compiler and artifact caches",
        group="folders",
        type=Path,
        default_factory=user_cache_dir,
        default_text="$XDG_CACHE_HOME/kiln, else ~/.cache/kiln",
        env=contract.CACHE_DIR,
        metavar="DIR",
    )
    work: Path = option(
        "--work",
        "where work trees are checked out",
        group="folders",
        type=Path,
        default=Path("build/work"),
        env=contract.WORK,
        metavar="DIR",
    )
    mirrors: Path | None = option(
        "--mirrors",
        "TOML mapping upstream URL prefixes to mirrors",
        group="sources",
        type=Path,
        env=contract.MIRRORS,
        metavar="FILE",
        default=None,
    )
    offline: bool = option(
        "--offline",
        "sources only from the git cache and local mirrors (no upstream, no network "
        "mirror) and vendors' build_tools only from PIP_FIND_LINKS; build steps never reach "
        "the network, offline or not; what kiln provisions with pip (the build venv, the pip "
        "CUDA, the import proof's consumer environment) still reads the profile's index: "
        "point that at a local one",
        group="sources",
        kind="flag",
        env=contract.OFFLINE,
        default=False,
    )
    # --bundles DIR: upstreams from the git bundles there (the workspace's bundles.toml);
    # the build makes them mirrors in its inputs stage (a dry run only reads them)
    # Not $KILN_BUNDLES: the tests and nox -s build_public use that for where the bundles of
    # the public upstreams lie, which must not turn every build into a build from bundles.
    bundles: Path | None = option(
        "--bundles",
        "upstreams from the git bundles in DIR, as the workspace's bundles.toml names them "
        "(made into mirrors; implies --offline)",
        group="sources",
        type=Path,
        env=contract.FROM_BUNDLES,
        metavar="DIR",
        default=None,
    )
    python: str | None = option(
        "--python",
        "build Python holding the profile's torch",
        group="toolchain",
        default_text="a venv kiln provisions once",
        env=contract.BUILD_PYTHON,
        metavar="PYTHON",
        default=None,
    )
    cuda_home: str | None = option(
        "--cuda-home",
        "the CUDA toolkit to compile with",
        group="toolchain",
        default_text="$CUDA_HOME, nvcc on PATH, /usr/local/cuda",
        env=contract.CUDA_HOME,
        metavar="DIR",
        default=None,
    )
    runner: RunnerChoice = option(
        "--runner",
        "where builds run; auto: docker when the profile names an image and a daemon answers, "
        "else local",
        group="where builds run",
        default="auto",
        choices=get_args(RunnerChoice),
        env=contract.RUNNER,
    )
    image: str | None = option(
        "--image",
        "base image for the Docker runner, NAME:TAG@sha256:DIGEST",
        group="where builds run",
        default_text="profile.image",
        env=contract.IMAGE,
        metavar="REF",
        default=None,
    )
    allow_unpinned_image: bool = option(
        "--allow-unpinned-image",
        "accept an image without a digest (the manifest says 'unpinned')",
        group="where builds run",
        kind="flag",
        env=contract.ALLOW_UNPINNED_IMAGE,
        default=False,
    )
    allow_network: bool = option(
        "--allow-network",
        "let the local runner's build steps run with the network where this machine can "
        "isolate none (no bubblewrap, no unshare as root: an unprivileged container); "
        "without it such a build stops before its first step (the manifest records the "
        "steps as not isolated)",
        group="where builds run",
        kind="flag",
        env=contract.ALLOW_NETWORK,
        default=False,
    )
    docker_dir: Path | None = option(
        "--docker-dir",
        "the builder image's folder",
        group="where builds run",
        type=Path,
        default_text="<workspace>/docker",
        env=contract.DOCKER_DIR,
        metavar="DIR",
        default=None,
    )
    docker_mounts: tuple[str, ...] = option(
        "--docker-mount",
        "an extra bind mount for build containers, e.g. a CUDA toolkit; repeatable",
        group="where builds run",
        kind="list",
        env=contract.DOCKER_MOUNTS,
        metavar="SRC[:DST[:ro|rw]]",
        default_factory=tuple,
    )
    mem_limit_gib: float | None = option(
        "--mem-limit",
        "memory limit of a build step",
        group="where builds run",
        type=float,
        default_text="what the scheduler planned",
        env=contract.MEM_LIMIT,
        metavar="GIB",
        default=None,
    )
    toolchain: ToolchainChoice = option(
        "--toolchain",
        "pypi: the profile's CUDA from NVIDIA's hash-pinned PyPI wheels, local runner only",
        group="toolchain",
        default="system",
        choices=get_args(ToolchainChoice),
        env=contract.TOOLCHAIN,
    )
    jobs: int | None = option(
        "--jobs",
        "CPU slots for compiles across all steps",
        group="speed and caches",
        type=int,
        default_text="this machine's usable CPUs: its affinity and cgroup CPU quota",
        env=contract.JOBS,
        metavar="N",
        default=None,
    )
    mem_budget_gib: float | None = option(
        "--mem-budget",
        "memory all compiles together may use",
        group="speed and caches",
        type=float,
        default_text="available memory minus a margin",
        env=contract.MEM_BUDGET,
        metavar="GIB",
        default=None,
    )
    compiler_cache: Path | None = option(
        "--compiler-cache",
        "the compiler cache's folder (a volume for the Docker runner; rebuild-c shares it)",
        group="speed and caches",
        type=Path,
        default_text="<cache>/ccache or <cache>/sccache",
        env=contract.COMPILER_CACHE,
        metavar="DIR",
        default=None,
    )
    no_compiler_cache: bool = option(
        "--no-compiler-cache",
        "compile without ccache or sccache",
        group="speed and caches",
        kind="flag",
        env=contract.NO_COMPILER_CACHE,
        default=False,
    )
    # "ccache", or "sccache" (implied by --distribute and S3/GHA stores): compilercache.py
    cache_backend: CacheBackend | None = option(
        "--compiler-cache-backend",
        "ccache, or sccache (implied by --distribute and s3:// or gha:// stores)",
        group="speed and caches",
        choices=get_args(CacheBackend),
        default_text="ccache",
        env=contract.COMPILER_CACHE_BACKEND,
        default=None,
    )
    cache_store: str | None = option(
        "--cache-store",
        "a compiler cache shared by builders: redis://HOST:PORT or http:// (ccache, sccache), "
        "s3://BUCKET/PREFIX[?endpoint=URL] or gha:// (sccache), or a folder; credentials from "
        "the environment",
        group="speed and caches",
        env=contract.CACHE_STORE,
        metavar="URL",
        default=None,
    )
    distribute: str | None = option(
        "--distribute",
        "send compiles to this sccache-dist scheduler (its token: $KILN_DIST_TOKEN)",
        group="speed and caches",
        env=contract.DISTRIBUTE,
        metavar="URL",
        default=None,
    )
    artifact_cache: bool = option(
        "--no-artifact-cache",
        "rebuild every vendor even when its inputs are unchanged",
        group="speed and caches",
        kind="flag",
        env=contract.NO_ARTIFACT_CACHE,
        invert=True,
        default=True,
    )
    artifact_cache_dir: Path | None = option(
        "--artifact-cache",
        "the cache of verified outputs by input hash",
        group="speed and caches",
        type=Path,
        default_text="<cache>/artifacts",
        env=contract.ARTIFACT_CACHE,
        metavar="DIR",
        default=None,
    )
    wait: bool = option(
        "--wait",
        "wait for another build using the same artifacts/ or work folder instead of refusing",
        group="folders",
        kind="flag",
        env=contract.WAIT,
        default=False,
    )
    keep_container: bool = option(
        "--keep-container",
        "keep a failed step's build container (docker start -ai it to look inside)",
        group="where builds run",
        kind="flag",
        env=contract.KEEP_CONTAINER,
        default=False,
    )
    live: bool | None = None  # live progress table (default: when stderr is a terminal)
    # the keyid a signed release names, for `kiln verify`'s rebuild: it writes the files a
    # signed release has (its README, verify-release.py) without the key to sign them
    signed_by: str | None = None
    signer_identity: str | None = None  # and a keyless signer's identity (issuer)
    signer_scheme: str | None = None  # and its key's scheme
    # Another build's learned figures (a release's manifest.json or a learned.json): in
    # place of this cache's (orchestrate/learned.py). Default: the workspace's learned.json.
    learned_from: Path | None = option(
        "--learned-from",
        "schedule from another build's learned unit times and memory: a manifest.json or a "
        "learned.json (default: what the cache learned, else <workspace>/learned.json)",
        group="speed and caches",
        type=Path,
        env=contract.LEARNED_FROM,
        metavar="FILE",
        default=None,
    )
    save_learned: bool = option(
        "--save-learned",
        "write what this build learned into <workspace>/learned.json (to commit: a fresh "
        "machine's first build is then scheduled like the tenth)",
        group="speed and caches",
        kind="flag",
        env=contract.SAVE_LEARNED,
        default=False,
    )
    timings: bool = option(
        "--timings",
        "write the build's timings into its logs folder: timings.html (a Gantt chart of every "
        "compile per slot, phases, concurrency and memory against the budget; opens offline) "
        "and timings.trace.json (for ui.perfetto.dev or chrome://tracing); docs/timings.md",
        group="speed and caches",
        kind="flag",
        env=contract.TIMINGS,
        default=False,
    )
    sign: str | None = option(
        "--sign",
        "sign the release with this key: a PEM private key file (or file:PATH), env:VAR "
        "(the PEM in a variable), a key store's securesystemslib URI (hsm:, awskms:, "
        "gcpkms:, azurekms:; its public key in $KILN_SIGN_PUBKEY or asked of the store, a "
        "token's PIN in $KILN_SIGN_PIN), or sigstore: (keyless, the CI job's identity "
        "token); the DSSE envelope provenance.intoto.dsse.json vouches for every file of "
        "the release",
        group="verification",
        env=contract.SIGN,
        metavar="KEY-URI",
        default=None,
    )
    import_proof: bool = option(
        "--no-import-proof",
        "skip the import proof (each output installed as install.sh installs it into the "
        "consumer's environment and imported there before the release folder is written)",
        group="verification",
        kind="flag",
        env=contract.NO_IMPORT_PROOF,
        invert=True,
        default=True,
    )

    proof_env: ProofEnvChoice = option(
        "--proof-env",
        "the import proof's consumer environment: install (what the release's install.sh "
        "makes from its requirements, from the index) or build-python (the build Python's "
        "own distributions, which must meet those requirements: for a builder without an "
        "index; the manifest records it), local runner only",
        group="verification",
        default="install",
        choices=get_args(ProofEnvChoice),
        env=contract.PROOF_ENV,
    )

    def resolved(self) -> Options:
        """The same, with the folders a build writes made absolute (steps run elsewhere)."""
        return replace(
            self,
            artifacts=self.artifacts.resolve(),
            work=self.work.resolve(),
            cache=self.cache.resolve(),
            bundles=self.bundles.resolve() if self.bundles else None,
            vendors=tuple(self.vendors) if self.vendors else None,
            docker_mounts=tuple(self.docker_mounts),
            learned_from=self.learned_from.resolve() if self.learned_from else None,
        )

    @property
    def ccache_dir(self) -> Path | None:
        if self.no_compiler_cache:
            return None
        return (self.compiler_cache or self.cache / self.compiler_cache_tool).resolve()

    @property
    def compiler_cache_tool(self) -> str:
        """ccache unless asked otherwise, or unless only sccache can do what is asked:
        distributed compiles, an S3 or GitHub Actions store."""
        if self.cache_backend:
            return self.cache_backend
        sccache_only = (self.cache_store or "").startswith(("s3:", "gha:"))
        return "sccache" if self.distribute or sccache_only else "ccache"

    @property
    def artifact_cache_root(self) -> Path | None:
        if not self.artifact_cache:
            return None
        return (self.artifact_cache_dir or self.cache / "artifacts").resolve()

    @property
    def bundle_mirrors_dir(self) -> Path:
        """Where the build unbundles ``bundles`` (bare repositories and their mirrors file)."""
        return self.work / "mirrors-from-bundles"


# Each option that fills a field of Options, by the field's name (its ``field`` set).
FIELD_OPTIONS: dict[str, Option] = {
    f.name: replace(f.metadata["option"], field=f.name)
    for f in fields(Options)
    if "option" in f.metadata
}
