"""Read and validate a workspace: ``kiln.toml`` (release + profile), ``vendors/*.toml``
(one lock entry per upstream) and ``patches/series.toml``.

Everything is validated on load into frozen models; an error names the file and
the key (``vendors/deepep.toml: source.commit: ...``). The engine knows nothing of
any particular upstream: adding one means adding a TOML file.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from kiln.errors import ConfigError

SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")
FULL_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
ARCH_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

WORKSPACE_FILE = "kiln.toml"
SERIES_FILE = "series.toml"


# "<transport>::<address>" makes git run a remote helper (ext:: runs any command).
_HELPER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def url_problem(url: str) -> str | None:
    """Why git must not be given ``url`` (it would read it as an option or run a
    command), or None. URLs come from TOML files and upstreams' ``.gitmodules``."""
    if url.startswith("-"):
        return "starts with '-' (git would read it as an option)"
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "holds a control character"
    if _HELPER_RE.match(url):
        return "names a git remote helper ('<transport>::'), which runs a command"
    return None


def _url(value: str) -> str:
    problem = url_problem(value)
    if problem:
        raise ValueError(f"{value!r} {problem}")
    return value


def _inside(value: str) -> str:
    """A path relative to the upstream's tree that stays inside it."""
    parts = value.replace("\\", "/").split("/")
    if not value or value.startswith("/") or ".." in parts:
        raise ValueError(f"{value!r} must be a path inside the tree (relative, without '..')")
    return value


def _module(value: str) -> str:
    if not MODULE_RE.match(value):
        raise ValueError(f"{value!r} is not a module name (like 'pkg' or 'pkg._C')")
    return value


def _requirement(value: str) -> str:
    if value.startswith("-"):
        raise ValueError(f"{value!r} is an option, not a requirement (like 'ninja==1.13.0')")
    return value


def _sha(value: str) -> str:
    if not SHA_RE.match(value):
        raise ValueError(f"{value!r} is not a commit SHA (7 to 40 lowercase hex digits)")
    return value


def _full_sha(value: str) -> str:
    if not FULL_SHA_RE.match(value):
        raise ValueError(f"{value!r} is not a full commit SHA (40 lowercase hex digits)")
    return value


def _arch(value: str) -> str:
    if not ARCH_RE.match(value):
        raise ValueError(f"{value!r} is not a GPU architecture like 'sm_100a' or 'sm_90a'")
    return value


def _name(value: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a name (lowercase letters, digits, '-' and '_')")
    return value


def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"{value!r} is not a sha256 (64 lowercase hex digits)")
    return value


def _unique(values: list[str]) -> list[str]:
    dupes = sorted({v for v in values if values.count(v) > 1})
    if dupes:
        raise ValueError(f"listed twice: {', '.join(dupes)}")
    return values


Url = Annotated[str, AfterValidator(_url)]
InsidePath = Annotated[str, AfterValidator(_inside)]
Module = Annotated[str, AfterValidator(_module)]
Requirement = Annotated[str, AfterValidator(_requirement)]
Sha = Annotated[str, AfterValidator(_sha)]
FullSha = Annotated[str, AfterValidator(_full_sha)]
Arch = Annotated[str, AfterValidator(_arch)]
Name = Annotated[str, AfterValidator(_name)]
Sha256 = Annotated[str, AfterValidator(_sha256)]
ArchList = Annotated[list[Arch], AfterValidator(_unique)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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


class Release(Strict):
    name: Name
    description: str = ""


class WorkspaceFile(Strict):
    release: Release
    profile: Profile
    # Named variants of the profile (``--profile NAME``): each holds only the keys it
    # changes, e.g. ``[profiles.cu132] cuda = "13.2"``.
    profiles: dict[Name, dict[str, Any]] = Field(default_factory=dict)


# --------------------------------------------------------------------------- vendors


class Submodule(Strict):
    path: InsidePath
    commit: FullSha | None = None


LicenseId = Literal["MIT", "Apache-2.0", "BSD-3-Clause"]


class Source(Strict):
    url: Url
    commit: Sha
    submodules: list[Submodule] = Field(default_factory=list)
    license: InsidePath = "LICENSE"
    license_id: LicenseId | None = None


ArchControl = Literal["torch-arch-list", "hardcoded", "toggles", "none"]


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
    profile's archs choose which are built), ``none`` (no device code at build time;
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
    # FlashMLA's CUTLASS ones 9.2).
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
        if b.arch_control != "none" and not b.archs:
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


# --------------------------------------------------------------------------- loading

M = TypeVar("M", bound=BaseModel)


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{loc}: unknown key"
    if kind == "missing":
        return f"{loc}: missing required key"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def parse(model: type[M], path: Path, data: dict[str, Any] | None = None) -> M:
    """Validate ``data`` (or the TOML at ``path``) as ``model``; errors name file and key."""
    if data is None:
        data = read_toml(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{path}: {_describe(errors[0])}{more}") from None


class Workspace:
    """A folder with ``kiln.toml``, ``vendors/`` and ``patches/``."""

    def __init__(self, root: Path, profile: str | None = None) -> None:
        self.root = root.resolve()
        self._patches_dir: Path | None = None
        meta = parse(WorkspaceFile, self.root / WORKSPACE_FILE)
        self.release = meta.release
        self.profile_name = profile
        self.profile = self._pick_profile(meta, profile)
        self.vendors = self._load_vendors()
        self.series = self._load_series()

    def _pick_profile(self, meta: WorkspaceFile, name: str | None) -> Profile:
        if name is None:
            return meta.profile
        if name not in meta.profiles:
            known = ", ".join(meta.profiles) or "none"
            raise ConfigError(
                f"{WORKSPACE_FILE}: --profile {name}: no [profiles.{name}] table (known: {known})"
            )
        merged = {**meta.profile.model_dump(exclude_none=True), **meta.profiles[name]}
        return parse(Profile, Path(f"{WORKSPACE_FILE} [profiles.{name}]"), merged)

    @property
    def vendors_dir(self) -> Path:
        return self.root / "vendors"

    @property
    def source_patches_dir(self) -> Path:
        """The workspace's own ``patches/`` (what users edit; a build reads a snapshot)."""
        return self.root / "patches"

    @property
    def patches_dir(self) -> Path:
        return self._patches_dir or self.source_patches_dir

    def use_patches_from(self, folder: Path) -> None:
        """Read patches from ``folder`` from now on (a build's snapshot, kiln.inputs)."""
        self._patches_dir = folder

    def vendor_file(self, name: str) -> Path:
        return self.vendors_dir / f"{name}.toml"

    def _load_vendors(self) -> dict[str, Vendor]:
        if not self.vendors_dir.is_dir():
            raise ConfigError(f"{self.vendors_dir}: no vendors/ folder in the workspace")
        vendors: dict[str, Vendor] = {}
        for path in sorted(self.vendors_dir.glob("*.toml")):
            rel = path.relative_to(self.root)
            try:
                _name(path.stem)
            except ValueError as exc:
                raise ConfigError(f"{rel}: file name: {exc}") from None
            data = read_toml(path)
            if "name" in data:
                raise ConfigError(f"{rel}: name: unknown key (the file name is the vendor name)")
            vendor = self._for_profile(parse(Vendor, rel, {**data, "name": path.stem}), rel)
            extra = sorted(set(vendor.build.archs) - set(self.profile.archs))
            if extra:
                raise ConfigError(
                    f"{rel}: build.archs: {', '.join(extra)} not in the profile's archs "
                    f"({', '.join(self.profile.archs)}) in {WORKSPACE_FILE}"
                )
            vendors[path.stem] = vendor
        if not vendors:
            raise ConfigError(f"{self.vendors_dir}: no vendor TOML files")
        return vendors

    def _for_profile(self, vendor: Vendor, rel: Path) -> Vendor:
        """A ``toggles`` recipe builds the profile's share of its archs: the others are
        left out through their toggle variables (set in build.env)."""
        b = vendor.build
        if b.arch_control != "toggles":
            return vendor
        keep = [a for a in b.archs if a in self.profile.archs]
        if not keep:
            raise ConfigError(
                f"{rel}: build.archs: none of {', '.join(b.archs)} is in the profile's archs "
                f"({', '.join(self.profile.archs)}) in {WORKSPACE_FILE}"
            )
        env = dict(b.env)
        for arch in b.archs:
            if arch not in keep:
                env.update(b.arch_toggles[arch])
        return vendor.model_copy(update={"build": b.model_copy(update={"archs": keep, "env": env})})

    def _load_series(self) -> SeriesFile:
        path = self.patches_dir / SERIES_FILE
        if not path.exists():
            return SeriesFile()
        rel = path.relative_to(self.root)
        series = parse(SeriesFile, rel, read_toml(path))
        for i, entry in enumerate(series.patch):
            if entry.target not in self.vendors:
                raise ConfigError(
                    f"{rel}: patch.{i}.target: unknown vendor {entry.target!r} "
                    f"(known: {', '.join(self.vendors)})"
                )
        return series

    def select(self, names: list[str] | None) -> list[Vendor]:
        """The vendors to build, in a stable order; unknown names are an error."""
        if not names:
            return list(self.vendors.values())
        unknown = [n for n in names if n not in self.vendors]
        if unknown:
            raise ConfigError(
                f"unknown vendor {unknown[0]!r}: known vendors are {', '.join(self.vendors)} "
                f"(files in {self.vendors_dir})"
            )
        return [self.vendors[n] for n in names]

    def patches_for(self, vendor: str) -> list[PatchEntry]:
        return [p for p in self.series.patch if p.target == vendor]


def arch_to_torch(arch: str) -> str:
    """``sm_100a`` -> ``10.0a`` (the form ``TORCH_CUDA_ARCH_LIST`` takes)."""
    m = ARCH_RE.match(arch)
    if not m:
        raise ConfigError(f"{arch!r} is not a GPU architecture")
    digits, suffix = m.groups()
    return f"{digits[:-1]}.{digits[-1]}{suffix}"
