"""The configuration models: a workspace's ``kiln.toml`` (release, profile and its named
variants), a vendor TOML (source and build recipe), the patch series. Frozen; unknown
keys are refused. Loading and the error messages that name file and key:
:mod:`kiln.config.workspace`."""

from __future__ import annotations

from typing import Annotated, Literal

from packaging.version import Version
from pydantic import Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from kiln.config.fields import (
    Arch,
    ArchList,
    FullSha,
    InsidePath,
    LicenseId,
    Module,
    Name,
    PinnedRequirement,
    Requirement,
    Sha,
    Sha256,
    Strict,
    Url,
    _inside,
)

# --------------------------------------------------------------------------- profile
# The descriptions and examples below are the keys' documentation: the JSON Schemas
# (kiln/schemas/*.schema.json, what editors show) and docs/*-toml.md are made from them
# (kiln.config.schema, kiln.config.reference). Markdown; `code` in single backticks.


class Profile(Strict):
    """What the release targets: one CUDA, one Python, one torch, a set of GPU archs."""

    cuda: Annotated[str, Field(pattern=r"^\d+\.\d+$")] = Field(
        description="The CUDA version, major.minor. The nvcc a build finds must match it "
        "(the minor too: spill checks, minimum-version checks and JIT cache keys depend "
        "on it).",
        examples=["13.2"],
    )
    python: Annotated[str, Field(pattern=r"^3\.\d+$")] = Field(
        description="The Python version the wheels are built for, 3.minor (the wheels' "
        "`cp3NN` tag).",
        examples=["3.12"],
    )
    torch: Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+(\+[a-z0-9.]+)?$")] | None = Field(
        None,
        description="The torch version the extensions are built against, with its local "
        "part naming the CUDA build (`+cu132`); the wheels require its public version. "
        "Leave it out when the upstreams need no torch (plain CUDA extensions): nothing "
        "checks torch then.",
        examples=["2.13.0+cu132"],
    )
    torch_index: str | None = Field(
        None,
        description="An extra package index torch is installed from (pip "
        "`--extra-index-url`), in the build venv and in the release's install line.",
        examples=["https://download.pytorch.org/whl/cu132"],
    )
    archs: Annotated[ArchList, Field(min_length=1)] = Field(
        description="The GPU architectures the release is built for; each vendor builds "
        "its share of them (`build.archs`).",
        examples=[["sm_100a", "sm_103a"]],
    )
    image: str | None = Field(
        None,
        description="The builder image of the Docker runner (`--runner docker`; `--image` "
        "overrides it). `kiln lock` pins it by digest.",
        examples=["runpod/pytorch:1.4.1-cu1320-torch2130-ubuntu2404"],
    )
    platform: Literal["linux_x86_64", "linux_aarch64"] = Field(
        "linux_x86_64",
        description="The wheels' platform.",
        examples=["linux_aarch64"],
    )
    build_tools: list[Requirement] = Field(
        default_factory=list,
        description="Requirements (pinned, `name==version`) installed into the build venv "
        "kiln provisions, beside torch; not installed with `--python` (a Python that "
        "already has them, e.g. the image's).",
        examples=[["setuptools==80.9.0", "wheel==0.45.1", "ninja==1.13.0"]],
    )

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

    @property
    def wheel_platforms(self) -> list[str]:
        """pip's ``--platform`` values for this profile's build tools, newest first: every
        manylinux glibc up to 2.39 (the newest a CUDA 13 image has) and the legacy names.
        pip does not widen a ``manylinux_2_28`` it is given to the older tags (a tool whose
        wheel is manylinux_2_12, swig's, was "not found")."""
        machine = self.platform.removeprefix("linux_")
        return [
            *(f"manylinux_2_{minor}_{machine}" for minor in range(39, 4, -1)),
            *(f"{legacy}_{machine}" for legacy in ("manylinux2014", "manylinux2010", "manylinux1")),
        ]


class JitCache(Strict):
    """A JIT kernel cache the release may carry (`kiln pack-jit-cache`): its folder name
    inside `jit-cache/` and the variable that points the upstream at it."""

    name: Name = Field(
        description="The cache's folder inside the release's `jit-cache/`.",
        examples=["kernels"],
    )
    variable: Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")] = Field(
        description="The environment variable that points the upstream at the cache "
        "(the release README's run line sets it).",
        examples=["MYLIB_JIT_CACHE_DIR"],
    )


class Release(Strict):
    """The release: its name, its README and where it is installed and published."""

    name: Name = Field(
        description="The release's name: its folder under the artifacts and the README's title.",
        examples=["mylib-sm100-cu132"],
    )
    description: str = Field(
        "",
        description="One line on what the release is, for its README.",
        examples=["mylib prebuilt for NVIDIA SM100 (sm_100a, sm_103a), CUDA 13.2, Python 3.12"],
    )
    install_root: Annotated[str, Field(pattern=r"^/[^\s]*$")] = Field(
        "/opt/kiln",
        description="Where the release README's install line puts the venv and the trees "
        "built in place (an absolute path).",
        examples=["/srv/mylib"],
    )
    jit_caches: list[JitCache] = Field(
        default_factory=list,
        description="The JIT caches `kiln pack-jit-cache` packs and the README tells how to "
        "point at (`[[release.jit_caches]]` tables).",
        examples=[[{"name": "kernels", "variable": "MYLIB_JIT_CACHE_DIR"}]],
    )
    hub_repo: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")] | None = (
        Field(
            None,
            description="The Hugging Face Hub repository the release is published to "
            "(`ORG/NAME`: the README's `hf download` line).",
            examples=["my-org/mylib-sm100-cu132"],
        )
    )
    variant_wheels: bool = Field(
        False,
        description="Also write each CUDA wheel as a wheel variant (WheelNext, the PEP "
        "817/825 drafts) in `wheels/`, whose properties are the archs kiln verified in its "
        "SASS (`nvidia :: sm_arch`) and the CUDA it was built with "
        "(`nvidia :: cuda_version_lower_bound`), with each distribution's "
        "`<name>-<version>-variants.json` beside them (docs/variants.md). The plain wheel "
        "stays what `install.sh` installs.",
        examples=[True],
    )
    require_signature: bool = Field(
        False,
        description="Refuse to build this release unsigned: a build without `--sign` "
        "(or `KILN_SIGN`) stops before it compiles anything.",
        examples=[True],
    )
    readme_template: InsidePath = Field(
        "release/README.md.in",
        description="The release README's own prose, a file of the workspace: the "
        "generated tables go in at its `<!-- kiln:SECTION -->` markers, and a YAML front "
        "matter there adds to or overrides the generated model-card metadata. Used when "
        "the file exists.",
        examples=["release/README.md.in"],
    )


class WorkspaceFile(Strict):
    """A workspace's `kiln.toml`: the release, and the profile it is built for with its
    named variants. A workspace is a folder: `kiln.toml`, `vendors/` (one TOML file per
    upstream) and `patches/`."""

    release: Release
    profile: Profile
    profiles: dict[Name, dict[str, object]] = Field(
        default_factory=dict,
        description="Named variants of the profile, chosen with `--profile NAME`: each "
        "`[profiles.NAME]` table holds only the keys of `[profile]` it changes.",
        examples=[{"cu132": {"cuda": "13.2"}}],
    )


# --------------------------------------------------------------------------- vendors


class Submodule(Strict):
    """A git submodule of the upstream, named to pin it or to name its license."""

    path: InsidePath = Field(
        description="The submodule's path in the upstream's tree (listed submodules must "
        "be exactly the tree's top-level ones).",
        examples=["third-party/cutlass"],
    )
    commit: FullSha | None = Field(
        None,
        description="The commit the tree must record for it (40 hex digits); the build "
        "fails when the tree records another (`kiln lock` re-records it).",
        examples=["20a66a2ba0adcdc059d9116be15565bf4e919fe0"],
    )
    license: InsidePath | None = Field(
        None,
        description="Its license file, relative to the submodule, shipped in the "
        "release's `licenses/` (default: the first of LICENSE, LICENSE.txt, LICENSE.md, "
        "LICENSE.rst, COPYING found).",
        examples=["LICENSE.txt"],
    )
    license_id: LicenseId | None = Field(
        None,
        description="Its license, as an SPDX id or expression (https://spdx.org/licenses/): "
        "recorded in the manifest, the SBOM and the README; for MIT, Apache-2.0, "
        "BSD-2-Clause and BSD-3-Clause the file must also read like it.",
        examples=["BSD-3-Clause"],
    )


class Source(Strict):
    """Where the upstream comes from: a git repository at a pinned commit."""

    url: Url = Field(
        description="The git repository (a mirrors file may point it elsewhere).",
        examples=["https://github.com/NVIDIA/cutlass"],
    )
    commit: Sha = Field(
        description="The pinned commit: 7 to 40 lowercase hex digits.",
        examples=["f6aa38f"],
    )
    submodules: list[Submodule] = Field(
        default_factory=list,
        description="The upstream's submodules (`[[source.submodules]]` tables): when "
        "listed, exactly the tree's top-level ones; each may pin its commit and name its "
        "license.",
        examples=[[{"path": "third-party/fmt", "license_id": "MIT"}]],
    )
    license: InsidePath = Field(
        "LICENSE",
        description="The upstream's license file in its tree, shipped in the release's "
        "`licenses/`; a release cannot ship an upstream without one.",
        examples=["COPYING"],
    )
    license_id: LicenseId | None = Field(
        None,
        description="The upstream's license, as an SPDX id or expression "
        "(https://spdx.org/licenses/): recorded in the manifest, the SBOM and the README's "
        "model-card metadata; for MIT, Apache-2.0, BSD-2-Clause and BSD-3-Clause the "
        "license file must also read like it.",
        examples=["MIT", "Apache-2.0", "MIT OR Apache-2.0"],
    )


ArchControl = Literal["torch-arch-list", "hardcoded", "toggles", "rewrite", "none"]


class SystemRequirement(Strict):
    """A file the build needs from the build machine's system (not from PyPI or the
    upstream), checked in preflight where builds run: a header on the compiler's include
    path or a library the linker finds, and the package that provides it. Name exactly
    one of `header` and `library`."""

    header: str | None = Field(
        None,
        description="A header the compiler must find, as the code includes it.",
        examples=["infiniband/mlx5dv.h"],
    )
    library: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")] | None = Field(
        None,
        description="A library the linker must find, as `-l` names it.",
        examples=["ibverbs"],
    )
    package: str = Field(
        description="The system package that provides it, named in the error "
        "(`apt-get install PACKAGE`).",
        examples=["libibverbs-dev"],
    )

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


class RuntimeLibrary(Strict):
    """A shared library the built files need where they land that no Python
    distribution ships: a system package the release's README names and `install.sh`
    checks for (the import proof refuses a `DT_NEEDED` entry nobody provides)."""

    soname: Annotated[str, Field(pattern=r"^lib[A-Za-z0-9_.+-]+\.so(\.[0-9]+)*$")] = Field(
        description="The library as the built files name it (their `DT_NEEDED` entry).",
        examples=["libibverbs.so.1"],
    )
    package: str = Field(
        description="The system package that provides it (`apt-get install PACKAGE`).",
        examples=["libibverbs1"],
    )


class ImportProofSettings(Strict):
    """How the import proof treats this upstream's modules. Every extension module of
    its output and its top-level packages are imported in the consumer's environment
    (what `install.sh` makes) on every build; these keys add modules, and say which need
    a GPU or are left out."""

    modules: list[Module] = Field(
        default_factory=list,
        description="More modules to import, beside every extension module and top-level "
        "package kiln finds.",
        examples=[["mylib.ops"]],
    )
    needs_gpu: list[Module] = Field(
        default_factory=list,
        description="Modules whose import needs a GPU: imported where one is, recorded as "
        "skipped (with that reason) where none is. A module not listed here that fails "
        "for want of a GPU fails the build.",
        examples=[["mylib.autotune"]],
    )
    skip: dict[Module, str] = Field(
        default_factory=dict,
        description="Modules never imported, each with the reason (recorded in the manifest).",
        examples=[{"mylib.contrib": "needs the optional triton backend"}],
    )
    timeout_s: Annotated[int, Field(ge=1)] = Field(
        120,
        description="Each import's time limit in seconds.",
        examples=[300],
    )


class GpuTest(Strict):
    """The upstream's own GPU test, run by `kiln gpu-test` against the release's wheel:
    the files of the pinned tree it needs (copied into a scratch folder) and the command
    (run there, with the test environment's Python first on PATH)."""

    files: Annotated[list[InsidePath], Field(min_length=1)] = Field(
        description="Files and folders of the pinned tree the test needs, copied into a "
        "scratch folder.",
        examples=[["tests"]],
    )
    command: Annotated[list[str], Field(min_length=1)] = Field(
        description="The test's command (an argument list, no shell), run in that folder.",
        examples=[["python", "tests/test_kernels.py"]],
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables the test runs with.",
        examples=[{"CUDA_LAUNCH_BLOCKING": "1"}],
    )
    timeout_s: Annotated[int, Field(ge=1)] = Field(
        3600,
        description="The test's time limit in seconds.",
        examples=[1800],
    )


class Build(Strict):
    """How one upstream is built: as a wheel, or in place in its tree (`kind`), for which
    archs and how they reach the compiler (`arch_control`), with what environment, flags
    and caps."""

    kind: Literal["wheel", "inplace"] = Field(
        description="`wheel`: the upstream's setup.py builds a wheel, which kiln verifies "
        "and ships. `inplace`: the upstream's own command (`command`) builds in its tree, "
        "which kiln verifies (`outputs`) and ships as a tarball.",
        examples=["wheel"],
    )
    archs: ArchList = Field(
        default_factory=list,
        description="The GPU architectures the upstream builds; the profile's archs "
        "choose among them. Empty when `arch_control` is `none`; for `rewrite`, empty "
        "means the profile's archs; else at least one. kiln verifies the built files' "
        "SASS against the archs built.",
        examples=[["sm_100a", "sm_103a"]],
    )
    arch_control: ArchControl = Field(
        description="How the archs reach the compiler. `torch-arch-list`: kiln sets "
        "`TORCH_CUDA_ARCH_LIST`. `hardcoded`: the upstream's setup.py fixes them; kiln "
        "only checks. `toggles`: setup.py builds `archs` unless told to leave some out: "
        "`arch_toggles` names, per arch, the variables that drop it, and the profile's "
        "archs choose which are built. `rewrite`: kiln's nvcc wrapper rewrites each "
        "compile's arch flags (`-gencode`, `-arch`, ...) with the archs built (the "
        "profile's, or those of `archs` in the profile where it lists some): for an "
        "upstream that hard-codes its own list; a unit written only for other archs is "
        "refused (docs/archs.md). "
        "`none`: no device code at build time; the built files must hold none.",
        examples=["torch-arch-list"],
    )
    arch_toggles: dict[Arch, dict[str, str]] = Field(
        default_factory=dict,
        description='For `arch_control = "toggles"` only: per arch of `archs`, the '
        "environment variables that make setup.py leave it out (set for the archs the "
        "profile does not build).",
        examples=[{"sm_90a": {"MYLIB_DISABLE_SM90": "1"}}],
    )
    arch_also: dict[Arch, list[Arch]] = Field(
        default_factory=dict,
        description='For `arch_control = "rewrite"` only: archs a unit written for an '
        "arch-specific target is compiled for too, beside it (the rewrite otherwise "
        "builds an `a` target for that arch alone): where the compiler builds the code for "
        "them (`kiln add` compiles a unit for each and drafts this). Each key is a "
        "target the upstream asks for, each value an arch of `archs`.",
        examples=[{"sm_100a": ["sm_103a"]}],
    )
    max_jobs: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="A cap, not a setting: kiln's scheduler picks `MAX_JOBS` from the "
        "memory budget; set this only where an upstream breaks or misbehaves with more.",
        examples=[8],
    )
    nvcc_threads: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="A cap on `NVCC_THREADS`, which kiln picks from the memory budget; "
        "setting it also says the upstream honors `NVCC_THREADS`.",
        examples=[2],
    )
    mem_per_job_gib: Annotated[float, Field(gt=0)] = Field(
        4.0,
        description="Estimated peak memory of one compile in GiB, with its nvcc threads "
        "and over all its processes (nvcc with `--threads 2` runs two `cicc` at once), as "
        "kiln measures it: what a compile reserves at the compile gate until kiln has "
        "seen or learned what units of its kind take (most translation units stay under "
        "2.5 GiB, large CUTLASS ones near 9 per thread). kiln says once when a build "
        "measured it far off.",
        examples=[9.5],
    )
    after: list[str] = Field(
        default_factory=list,
        description="Vendors that must be built before this one (vendors build "
        "concurrently otherwise).",
        examples=[["mylib-core"]],
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for the build (`[build.env]`); `$NAME` in a "
        "value is replaced by the build environment's variable.",
        examples=[{"MYLIB_BUILD_TARGET": "CUDA"}],
    )
    nvcc_drop_flags: list[str] = Field(
        default_factory=list,
        description="nvcc flags kiln's compiler wrapper removes, without patching the "
        "upstream: the smallest fix where a flag defeats reproducible output (e.g. "
        "`-lineinfo`, which records source mtimes and the build directory; "
        "docs/reproducibility.md).",
        examples=[["-lineinfo", "--source-in-ptx"]],
    )
    cxx_append_flags: list[str] = Field(
        default_factory=list,
        description="Flags the wrapper appends to every C++ compile (g++ or gcc), after the "
        "upstream's own, so that `-std=c++20` wins over a hard-coded `-std=c++17`.",
        examples=[["-std=c++20"]],
    )
    nvcc_append_flags: list[str] = Field(
        default_factory=list,
        description="Flags the wrapper appends to every nvcc compile, after the upstream's own.",
        examples=[["-std=c++20"]],
    )
    max_wheel_mib: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description='`kind = "wheel"`: the largest the wheel may be, in MiB. The build '
        "fails above it and names the wheel's largest members: a wheel grown by a stray "
        "debug build or a grafted library is caught here, not at upload.",
        examples=[200],
    )
    system: list[SystemRequirement] = Field(
        default_factory=list,
        description="What the build needs from the build machine's system "
        "(`[[build.system]]` tables), checked before any work.",
        examples=[[{"header": "infiniband/mlx5dv.h", "package": "libibverbs-dev"}]],
    )
    build_tools: list[PinnedRequirement] = Field(
        default_factory=list,
        description="Python distributions this upstream's build imports that the "
        "profile's build venv lacks (setup.py's own imports), each pinned "
        "(`name==version`, wheels only, no dependencies pulled: list each): installed "
        "once into kiln's cache and put first on `PYTHONPATH` in this vendor's build "
        "alone, so the shared build venv stays as it is.",
        examples=[["pybind11==3.0.1"]],
    )
    runtime_libraries: list[RuntimeLibrary] = Field(
        default_factory=list,
        description="Shared libraries the built files need where they land from the "
        "system (`[[build.runtime_libraries]]`): named in the release README, checked by "
        "`install.sh`.",
        examples=[[{"soname": "libibverbs.so.1", "package": "libibverbs1"}]],
    )
    import_proof: ImportProofSettings = Field(
        default_factory=ImportProofSettings,
        description="The import proof's settings for this upstream (`[build.import_proof]`).",
    )
    gpu_test: GpuTest | None = None
    command: list[str] | None = Field(
        None,
        description='`kind = "inplace"` (required there): the upstream\'s own build '
        "command (an argument list, no shell), run in its tree.",
        examples=[["./build.sh"]],
    )
    outputs: list[InsidePath] = Field(
        default_factory=list,
        description='`kind = "inplace"` (required there): the files the build leaves in '
        "the tree (globs) that kiln verifies.",
        examples=[["mylib/_C*.so"]],
    )
    import_check: Module | None = Field(
        None,
        description='`kind = "inplace"`: a module the import proof imports from the '
        "installed tree, beside its extension modules and top-level package.",
        examples=["mylib._C"],
    )
    exclude: list[str] = Field(
        default_factory=list,
        description='`kind = "inplace"`: globs left out of the tree\'s tarball, beside '
        "kiln's own exclusions.",
        examples=[["benchmarks/*"]],
    )
    rebuild_command: list[str] | None = Field(
        None,
        description='`kind = "inplace"`: the command that rebuilds only the extension '
        "(`rebuild_c` of an installed tree; default: `command`).",
        examples=[["python", "setup.py", "build_ext", "--inplace"]],
    )


class Vendor(Strict):
    """A vendor TOML, `vendors/NAME.toml`: one upstream, pinned, and how kiln builds it.
    The file name is the vendor's name (lowercase letters, digits, `-` and `_`): adding an
    upstream is adding one of these files."""

    # Filled from the file name: not a key of the file (and so not in its schema).
    name: SkipJsonSchema[str] = ""
    description: str = Field(
        "",
        description="One line on what the upstream is, for the release README.",
        examples=["mylib: attention kernels for SM100 (mylib._C)"],
    )
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
        if b.arch_also and b.arch_control != "rewrite":
            raise ValueError("build.arch_also is for build.arch_control = 'rewrite'")
        strays = sorted({a for also in b.arch_also.values() for a in also} - set(b.archs))
        if strays and b.archs:
            raise ValueError(
                f"build.arch_also names {', '.join(strays)}, not in build.archs: add it to "
                f"build.archs or take it out of build.arch_also"
            )
        if b.kind == "inplace" and not (b.command and b.outputs):
            raise ValueError("build.command and build.outputs are required for kind 'inplace'")
        if b.kind == "wheel" and (b.command or b.outputs or b.rebuild_command):
            raise ValueError("build.command/outputs/rebuild_command are for kind 'inplace' only")
        return self


# --------------------------------------------------------------------------- patches


class PatchEntry(Strict):
    """One patch of the series (`[[patch]]`), applied in the order listed."""

    file: str = Field(
        description="The patch file, a plain file name in `patches/`.",
        examples=["mylib-fix-build.patch"],
    )
    target: Name = Field(
        description="The vendor it applies to (a file name of `vendors/`, without `.toml`).",
        examples=["mylib"],
    )
    source: str | None = Field(
        None,
        description="Where `kiln lock` fetches an absent patch file from: an `https://` "
        "or `hf://ORG/REPO/PATH` URL.",
        examples=["hf://my-org/mylib-sm100-cu132/patches/mylib-fix-build.patch"],
    )
    sha256: Sha256 | None = Field(
        None,
        description="The patch file's sha256 as `kiln lock` recorded it; a build with an "
        "edited patch warns and records the new one.",
        examples=["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"],
    )

    @model_validator(mode="after")
    def _plain(self) -> PatchEntry:
        if "/" in self.file or self.file.startswith("."):
            raise ValueError(f"patch.file {self.file!r} must be a plain file name under patches/")
        if self.source and not self.source.startswith(("https://", "hf://")):
            raise ValueError(f"patch.source {self.source!r} must be an https:// or hf:// URL")
        return self


class SeriesFile(Strict):
    """`patches/series.toml`: the workspace's patch series, and the tag each patched
    vendor's tarball is named with."""

    tags: dict[str, Name] = Field(
        default_factory=dict,
        description="Per vendor, the name of its patch set in its tarball's name; required "
        "for a patched `inplace` vendor (an unpatched one is `unpatched`).",
        examples=[{"mylib": "fixbuild"}],
    )
    patch: list[PatchEntry] = Field(
        default_factory=list,
        description="The patches (`[[patch]]` tables), applied in this order.",
        examples=[[{"file": "mylib-fix-build.patch", "target": "mylib"}]],
    )
