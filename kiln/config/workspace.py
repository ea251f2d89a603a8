"""Read and validate a workspace: ``kiln.toml`` (release + profile), ``vendors/*.toml``
(one lock entry per upstream) and ``patches/series.toml``.

Everything is validated on load into frozen models; an error names the file and
the key (``vendors/NAME.toml: source.commit: ...``). The engine knows nothing of
any particular upstream: adding one means adding a TOML file.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kiln.config.fields import ARCH_RE, SERIES_FILE, WORKSPACE_FILE, _name
from kiln.config.models import PatchEntry, Profile, SeriesFile, Vendor, WorkspaceFile
from kiln.errors import ConfigError

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


# The generated parts of the release README, in their default order; a template puts
# each where its <!-- kiln:NAME --> marker is (the ones it leaves out follow its text).
README_SECTIONS = (
    "summary",
    "contents",
    "install",
    "jit-caches",
    "sources",
    "patches",
    "build",
    "licenses",
)
README_MARKER = re.compile(r"<!--\s*kiln:([A-Za-z0-9_-]+)\s*-->")


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
        self.readme_text = self.readme_template_text()

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

    def readme_template_text(self) -> str | None:
        """The release README's template, if the workspace has one; its markers checked."""
        path = self.root / self.release.readme_template
        if not path.is_file():
            return None
        text = path.read_text()
        unknown = sorted(set(README_MARKER.findall(text)) - set(README_SECTIONS))
        if unknown:
            raise ConfigError(
                f"{self.release.readme_template}: unknown marker <!-- kiln:{unknown[0]} --> "
                f"(known: {', '.join(README_SECTIONS)})"
            )
        return text

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
