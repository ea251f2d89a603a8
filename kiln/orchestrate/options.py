"""What a build was asked to do: the command line as one frozen value.

Made once (by the CLI, a test, ``kiln verify``) and never changed afterwards; a stage
that needs other values makes a new one with :func:`dataclasses.replace` (``kiln
verify`` rebuilds a release with the same options but another workspace and no caches).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from kiln.fsutil import user_cache_dir


@dataclass(frozen=True)
class Options:
    workspace: Path
    vendors: tuple[str, ...] | None = None
    profile: str | None = None  # a [profiles.NAME] variant of kiln.toml's profile
    artifacts: Path = Path("artifacts")
    cache: Path = field(default_factory=user_cache_dir)  # $XDG_CACHE_HOME/kiln, ~/.cache/kiln
    work: Path = Path("build/work")
    mirrors: Path | None = None
    offline: bool = False
    # --bundles DIR: upstreams from the git bundles there (the workspace's bundles.toml);
    # the build makes them mirrors in its inputs stage (a dry run only reads them)
    bundles: Path | None = None
    python: str | None = None
    cuda_home: str | None = None
    runner: str = "auto"  # "auto": docker when the profile names an image and a daemon answers
    image: str | None = None  # overrides profile.image
    allow_unpinned_image: bool = False
    docker_dir: Path | None = None  # default: <workspace>/docker
    docker_mounts: tuple[str, ...] = field(default_factory=tuple)
    mem_limit_gib: float | None = None
    toolchain: str = "system"  # "pypi": the profile's CUDA from hash-pinned PyPI wheels
    jobs: int | None = None  # CPU slots for compiles (default: the cores)
    mem_budget_gib: float | None = None  # default: available memory minus a margin
    compiler_cache: Path | None = None  # default: <cache>/ccache (or <cache>/sccache)
    no_compiler_cache: bool = False
    # "ccache", or "sccache" (implied by --distribute and S3/GHA stores): compilercache.py
    cache_backend: str | None = None
    cache_store: str | None = None  # sccache's shared store: redis://, s3://, gha://, a folder
    distribute: str | None = None  # an sccache-dist scheduler's URL
    artifact_cache: bool = True
    artifact_cache_dir: Path | None = None  # default: <cache>/artifacts
    wait: bool = False  # wait for another build holding artifacts/ instead of refusing
    keep_container: bool = False  # Docker runner: keep a failed step's container
    live: bool | None = None  # live progress table (default: when stderr is a terminal)
    # Another build's learned figures (a release's manifest.json or a learned.json): in
    # place of this cache's (build/learned.py). Default: the workspace's learned.json.
    learned_from: Path | None = None
    save_learned: bool = False  # write what this build knows into <workspace>/learned.json
    timings: bool = False  # timings.html and timings.trace.json in the logs folder (kiln/timings)
    import_proof: bool = True  # every output imported where it lands (build/importproof.py)

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
