"""The configuration models: a workspace's ``kiln.toml`` (release, profile and its named
variants), a vendor TOML (source and build recipe), the patch series. Frozen; unknown
keys are refused. Loading and the error messages that name file and key:
:mod:`kiln.config.workspace`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from packaging.version import Version
from pydantic import Field, model_validator

from kiln.config.fields import (
    Arch,
    ArchList,
    FullSha,
    InsidePath,
    Module,
    Name,
    Requirement,
    Sha,
    Sha256,
    Strict,
    Url,
    _inside,
)

# --------------------------------------------------------------------------- profile


class Profile(Strict):
    """What the release targets: one CUDA, one Python, one torch, a set of GPU archs."""

    cuda: Annotated[str, Field(pattern=r"^\d+\.\d+$")]
    python: Annotated[str, Field(pattern=r"^3\.\d+$")]
    # None: the upstreams need no torch (plain CUDA extensions); nothing checks it then.
    torch: Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+(\+[a-z0-9.]+)?$")] | None = None
    torch_index: str | None = None
    archs: Annotated[ArchList, Field(min_length=1)]
    image: str | None = None
    platform: Literal["linux_x86_64", "linux_aarch64"] = "linux_x86_64"
    build_tools: list[Requirement] = Field(default_factory=list)

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def cuda_tag(self) -> str:
        return "cu" + self.cuda.replace(".", "")

    @property
    def torch_pin(self) -> str | None:
        """The Requires-Dist a wheel built against this torch carries: the public version
        (``torch==2.14.1``; the local part names a CUDA variant that PyPI's default build
        does not spell, and the C++ ABI follows the version)."""
        if not self.torch:
            return None
        return f"torch=={Version(self.torch).public}"


class JitCache(Strict):
    """A JIT kernel cache the release may carry (``kiln pack-jit-cache``): its folder
    name inside ``jit-cache/`` and the variable that points the upstream at it."""

    name: Name
    variable: Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")]


class Release(Strict):
    name: Name
    description: str = ""
    # Where the release README's install line puts the venv and the trees built in place.
    install_root: Annotated[str, Field(pattern=r"^/[^\s]*$")] = "/opt/kiln"
    # The JIT caches `kiln pack-jit-cache` packs and the README tells how to point at.
    jit_caches: list[JitCache] = Field(default_factory=list)
    # The Hub repository the release is published to (the README's `hf download` line).
    hub_repo: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")] | None = (
        None
    )
    # The release README's own prose, with the generated tables put in at its
    # <!-- kiln:SECTION --> markers (kiln/release/readme.py); a YAML front matter there
    # adds to or overrides the generated model-card metadata.
    readme_template: InsidePath = "release/README.md.in"


class WorkspaceFile(Strict):
    release: Release
    profile: Profile
    # Named variants of the profile (``--profile NAME``): each holds only the keys it
    # changes, e.g. ``[profiles.cu132] cuda = "13.2"``.
    profiles: dict[Name, dict[str, Any]] = Field(default_factory=dict)


# --------------------------------------------------------------------------- vendors


LicenseId = Literal["MIT", "Apache-2.0", "BSD-3-Clause"]


class Submodule(Strict):
    path: InsidePath
    commit: FullSha | None = None
    # Its license file, relative to the submodule (default: the first of LICENSE,
    # LICENSE.txt, LICENSE.md, LICENSE.rst, COPYING found), shipped in licenses/.
    license: InsidePath | None = None
    license_id: LicenseId | None = None


class Source(Strict):
    url: Url
    commit: Sha
    submodules: list[Submodule] = Field(default_factory=list)
    license: InsidePath = "LICENSE"
    license_id: LicenseId | None = None


ArchControl = Literal["torch-arch-list", "hardcoded", "toggles", "rewrite", "none"]


class SystemRequirement(Strict):
    """A file the build needs from the build machine's system (not from PyPI or the
    upstream), checked in preflight where builds run: a header on the compiler's include
    path or a library the linker finds, and the package that provides it."""

    header: str | None = None  # e.g. "infiniband/mlx5dv.h"
    library: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")] | None = None  # "ibverbs"
    package: str  # e.g. "libibverbs-dev" (named in the error: apt-get install <package>)

    @model_validator(mode="after")
    def _one(self) -> SystemRequirement:
        if (self.header is None) == (self.library is None):
            raise ValueError("name exactly one of header or library")
        if self.header is not None:
            _inside(self.header)
        return self

    @property
    def what(self) -> str:
        return f"header <{self.header}>" if self.header else f"library -l{self.library}"


class GpuTest(Strict):
    """The upstream's own GPU test, run by ``kiln gpu-test`` against the release's wheel:
    the files of the pinned tree it needs (copied into a scratch folder) and the command
    (run there, with the test environment's Python first on PATH)."""

    files: Annotated[list[InsidePath], Field(min_length=1)]
    command: Annotated[list[str], Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: Annotated[int, Field(ge=1)] = 3600


class Build(Strict):
    """How one upstream is built.

    ``arch_control`` says how the archs reach the compiler: ``torch-arch-list``
    (kiln sets ``TORCH_CUDA_ARCH_LIST``), ``hardcoded`` (the upstream's setup.py
    fixes them; kiln only checks), ``toggles`` (setup.py builds ``archs`` unless told
    to leave some out: ``arch_toggles`` names, per arch, the variables that drop it; the
    profile's archs choose which are built), ``rewrite`` (kiln's compiler wrapper
    replaces every nvcc call's own arch flags with the archs built: the profile's, or
    those of ``archs`` in the profile where it lists some; a unit written only for
    other archs is refused; docs/archs.md), ``none`` (no device code at build time;
    the wheel must hold none).
    """

    kind: Literal["wheel", "inplace"]
    archs: ArchList = Field(default_factory=list)
    arch_control: ArchControl
    arch_toggles: dict[Arch, dict[str, str]] = Field(default_factory=dict)
    # Caps, not settings: kiln's scheduler picks MAX_JOBS and NVCC_THREADS from the
    # memory budget (kiln/schedule.py); set these only where an upstream breaks or
    # misbehaves with more. nvcc_threads also says the upstream honors NVCC_THREADS.
    max_jobs: Annotated[int, Field(ge=1)] | None = None
    nvcc_threads: Annotated[int, Field(ge=1)] | None = None
    # Estimated peak memory of one compile job (one nvcc thread); replaced by the last
    # run's measured peak once there is one (vendor-notes: most TUs stay under 2.5 GiB,
    # large CUTLASS ones 9).
    mem_per_job_gib: Annotated[float, Field(gt=0)] = 4.0
    # Vendors that must be built before this one (they run concurrently otherwise).
    after: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # nvcc flags kiln's compiler wrapper removes, without patching the upstream: the
    # smallest fix where a flag defeats reproducible output (e.g. "-lineinfo", which
    # records source mtimes and the build directory). docs/reproducibility.md.
    nvcc_drop_flags: list[str] = Field(default_factory=list)
    # Flags the wrapper appends to every compile, after the upstream's own (so that
    # ``-std=c++20`` wins over a hard-coded ``-std=c++17``): C++ sources (g++ or gcc)
    # and nvcc compiles.
    cxx_append_flags: list[str] = Field(default_factory=list)
    nvcc_append_flags: list[str] = Field(default_factory=list)
    # kind "wheel": the largest the wheel may be, in MiB (the build fails above it and
    # names its largest members: a wheel that grew from a stray debug build or a grafted
    # library is caught here, not at upload).
    max_wheel_mib: Annotated[float, Field(gt=0)] | None = None
    # What the build needs from the machine's system (checked before any work).
    system: list[SystemRequirement] = Field(default_factory=list)
    # The upstream's own GPU test (``kiln gpu-test``).
    gpu_test: GpuTest | None = None
    # kind "inplace": the upstream's own build command, run in the tree; the files it
    # leaves that kiln verifies (globs); a module to import as a smoke test; extra
    # tarball exclusions; and the command that rebuilds only the extension (rebuild_c).
    command: list[str] | None = None
    outputs: list[InsidePath] = Field(default_factory=list)
    import_check: Module | None = None
    exclude: list[str] = Field(default_factory=list)
    rebuild_command: list[str] | None = None


class Vendor(Strict):
    name: str = ""  # filled from the file name
    description: str = ""
    source: Source
    build: Build

    @model_validator(mode="after")
    def _consistent(self) -> Vendor:
        b = self.build
        if b.arch_control == "none" and b.archs:
            raise ValueError("build.archs must be empty when build.arch_control is 'none'")
        if b.arch_control not in ("none", "rewrite") and not b.archs:
            raise ValueError("build.archs is empty: list the archs this upstream builds")
        if b.arch_control == "toggles":
            missing = sorted(set(b.archs) - set(b.arch_toggles))
            if missing:
                raise ValueError(
                    f"build.arch_toggles: no toggle for {', '.join(missing)} (name the "
                    f"variables that leave each arch out)"
                )
        elif b.arch_toggles:
            raise ValueError("build.arch_toggles is for build.arch_control = 'toggles'")
        if b.kind == "inplace" and not (b.command and b.outputs):
            raise ValueError("build.command and build.outputs are required for kind 'inplace'")
        if b.kind == "wheel" and (b.command or b.outputs or b.rebuild_command):
            raise ValueError("build.command/outputs/rebuild_command are for kind 'inplace' only")
        return self


# --------------------------------------------------------------------------- patches


class PatchEntry(Strict):
    file: str
    target: Name
    source: str | None = None
    sha256: Sha256 | None = None

    @model_validator(mode="after")
    def _plain(self) -> PatchEntry:
        if "/" in self.file or self.file.startswith("."):
            raise ValueError(f"patch.file {self.file!r} must be a plain file name under patches/")
        if self.source and not self.source.startswith(("https://", "hf://")):
            raise ValueError(f"patch.source {self.source!r} must be an https:// or hf:// URL")
        return self


class SeriesFile(Strict):
    tags: dict[str, Name] = Field(default_factory=dict)
    patch: list[PatchEntry] = Field(default_factory=list)
