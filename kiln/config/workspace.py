"""Read and validate a workspace: ``kiln.toml`` (release + profile), ``vendors/*.toml``
(one lock entry per upstream) and ``patches/series.toml``.

Everything is validated on load into frozen models; every problem of a file is
reported at once, one a line, naming the file, the key and the line it is written on
(``vendors/NAME.toml: build.arch_contrl: unknown key; did you mean arch_control? (line 7)``).
The engine knows nothing of any particular upstream: adding one means adding a TOML file.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import tomllib
from collections.abc import Sequence
from difflib import get_close_matches
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kiln.config import locate
from kiln.config.fields import ARCH_RE, SERIES_FILE, WORKSPACE_FILE, _name
from kiln.config.locate import KeyPath
from kiln.config.models import PatchEntry, Profile, SeriesFile, Vendor, WorkspaceFile
from kiln.errors import ConfigError

# --------------------------------------------------------------------------- loading

M = TypeVar("M", bound=BaseModel)


def read_toml(path: Path) -> dict[str, Any]:
    return _read(path)[0]


def _read(path: Path) -> tuple[dict[str, Any], str]:
    """The TOML at ``path`` and its text (for the lines errors name)."""
    try:
        text = path.read_bytes().decode()
        return tomllib.loads(text), text
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: file not found") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def parse(
    model: type[M],
    path: Path,
    data: dict[str, Any] | None = None,
    *,
    text: str | None = None,
    prefix: KeyPath = (),
) -> M:
    """Validate ``data`` (or the TOML at ``path``) as ``model``. Every problem is reported
    at once, one a line: ``FILE: KEY: what is wrong (line N)``, N where ``text`` (the
    file's TOML; read from ``path`` when ``data`` is not given) writes the key or, for a
    missing one, its table. ``prefix``: where ``data`` sits in that file."""
    if data is None:
        data, text = _read(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = locate.key_lines(text) if text is not None else {}
        found = [
            (locate.line_of(lines, (*prefix, *loc)) if loc else None, loc, message)
            for loc, message in _problems(model, exc.errors())
        ]
        found.sort(key=lambda p: p[0] if p[0] is not None else sys.maxsize)  # stable
        raise ConfigError("\n".join(_say(path, *p) for p in found)) from None


def _say(path: Path, line: int | None, loc: KeyPath, message: str) -> str:
    """One problem: the file, the key, what is wrong, the line (the one place that
    says how a config error reads)."""
    key = ".".join(str(p) for p in loc)
    where = f" (line {line})" if line is not None else ""
    return f"{path}: {key}: {message}{where}" if key else f"{path}: {message}{where}"


def _problems(model: type[BaseModel], errors: Sequence[ErrorDetails]) -> list[tuple[KeyPath, str]]:
    """pydantic's errors in plain words, each with its key path (dict keys' ``[key]``
    dropped). An unknown key names the nearest known one at its level; when that is a
    key reported missing, the missing error (the same mistake) is left out."""
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    said: list[tuple[KeyPath, str]] = []
    covered: set[KeyPath] = set()
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            parent, key = loc[:-1], str(loc[-1])
            known = _fields(_declared(model, parent))
            missing_here = [k for k in known if (*parent, k) in missing]
            guess = get_close_matches(key, missing_here, n=1) or get_close_matches(key, known, n=1)
            if guess and (*parent, guess[0]) in missing:
                covered.add((*parent, guess[0]))
            said.append((loc, "unknown key" + (f"; did you mean {guess[0]}?" if guess else "")))
        else:
            said.append((loc, _describe(model, err)))
    return [(_shown(loc), msg) for loc, msg in said if loc not in covered]


def _shown(loc: KeyPath) -> KeyPath:
    return tuple(p for p in loc if p != "[key]")


# Type errors: what was expected, where the model's declared type cannot say it better.
_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "date_type": "a date",
    "datetime_type": "a date and time",
}
_BOUNDS = {  # error type: (comparison, its key in the error's context)
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}


def _describe(model: type[BaseModel], err: ErrorDetails) -> str:
    kind, ctx, given = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return "missing required key"
    if kind in _EXPECTED:
        expected = _expect(_declared(model, tuple(err["loc"]))) or _EXPECTED[kind]
        return f"expected {expected}, got {_given(given)}"
    if kind == "literal_error":
        allowed = _literal(_declared(model, tuple(err["loc"])))
        one_of = ", ".join(json.dumps(a) for a in allowed) or ctx.get("expected", "?")
        guess = get_close_matches(given, allowed, n=1) if isinstance(given, str) else []
        hint = f"; did you mean {json.dumps(guess[0])}?" if guess else ""
        return f"expected one of {one_of}, got {_given(given)}{hint}"
    if kind in _BOUNDS:
        op, bound = _BOUNDS[kind]
        number = _expect(_declared(model, tuple(err["loc"]))) or "a number"
        return f"expected {number} {op} {ctx[bound]}, got {_given(given)}"
    if kind in ("too_short", "too_long"):
        word = "at least" if kind == "too_short" else "at most"
        bound = ctx["min_length" if kind == "too_short" else "max_length"]
        return (
            f"expected {word} {bound} item{'s' if bound != 1 else ''}, got {ctx['actual_length']}"
        )
    if kind == "string_pattern_mismatch":
        return f"expected a string matching {ctx['pattern']}, got {_given(given)}"
    return str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _given(value: object) -> str:
    """A TOML value in words: ``the string "eight"``, ``the integer 8``, ``a table``."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        shown = json.dumps(value if len(value) <= 60 else value[:57] + "...")
        return f"the string {shown}"
    if isinstance(value, list):
        return (
            f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
            if value
            else "an empty list"
        )
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return f"the date/time {value.isoformat()}"
    return type(value).__name__


def _declared(model: type[BaseModel], loc: KeyPath) -> Any:
    """The type ``model`` declares at ``loc`` (``Any`` where it cannot tell)."""
    tp: Any = model
    for part in loc:
        tp = _bare(tp)
        origin = get_origin(tp)
        if part == "[key]":  # the error is in a table's key (TOML keys are strings)
            return str
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            field = tp.model_fields.get(part)
            if field is None:
                return Any
            tp = field.annotation
        elif origin is list and isinstance(part, int):
            tp = get_args(tp)[0]
        elif origin is dict:
            tp = get_args(tp)[1]
        else:
            return Any
    return _bare(tp)


def _bare(tp: Any) -> Any:
    """``Annotated[T, ...]`` and ``T | None`` -> ``T``."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, UnionType) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return tp
            tp = rest[0]
        else:
            return tp


def _fields(tp: Any) -> list[str]:
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _literal(tp: Any) -> list[str]:
    return [str(a) for a in get_args(tp)] if get_origin(tp) is Literal else []


_NOUNS = {  # a type: (one, several)
    str: ("a string", "strings"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    bool: ("true or false", "booleans"),
}


def _expect(tp: Any, plural: bool = False) -> str | None:
    """A declared type in words: ``a list of strings``, ``a table``; None if unsure."""
    tp = _bare(tp)
    origin = get_origin(tp)
    if tp in _NOUNS:
        return _NOUNS[tp][plural]
    if (isinstance(tp, type) and issubclass(tp, BaseModel)) or origin is dict:
        of = _expect(get_args(tp)[1], plural=True) if origin is dict else None
        table = "tables" if plural else "a table"
        return f"{table} of {of}" if of else table
    if origin is list:
        of = _expect(get_args(tp)[0], plural=True)
        lists = "lists" if plural else "a list"
        return f"{lists} of {of}" if of else lists
    if origin is Literal:
        return "strings" if plural else "one of " + ", ".join(json.dumps(a) for a in get_args(tp))
    return None


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
# ``--profile default`` (and the plan's rows) name kiln.toml's ``[profile]`` itself.
DEFAULT_PROFILE = "default"


def pick_profile(meta: WorkspaceFile, name: str | None, text: str) -> Profile:
    """``[profile]`` (``--profile default`` or none), or it with ``[profiles.NAME]``'s keys
    over it (``--profile NAME``)."""
    if DEFAULT_PROFILE in meta.profiles:
        raise ConfigError(
            f"{WORKSPACE_FILE}: [profiles.{DEFAULT_PROFILE}]: '{DEFAULT_PROFILE}' names "
            f"[profile] itself (--profile {DEFAULT_PROFILE}): rename the variant"
        )
    if name is None or name == DEFAULT_PROFILE:
        return meta.profile
    if name not in meta.profiles:
        known = ", ".join([DEFAULT_PROFILE, *meta.profiles])
        raise ConfigError(
            f"{WORKSPACE_FILE}: --profile {name}: no [profiles.{name}] table (known: {known})"
        )
    merged = {**meta.profile.model_dump(exclude_none=True), **meta.profiles[name]}
    where = Path(f"{WORKSPACE_FILE} [profiles.{name}]")
    return parse(Profile, where, merged, text=text, prefix=("profiles", name))


def read_profiles(root: Path) -> dict[str | None, Profile]:
    """Every profile of the workspace at ``root`` (None: ``[profile]``; a name: that
    ``[profiles.NAME]`` variant), without loading its vendors (``kiln add`` writes a
    workspace's first one)."""
    data, text = _read(root.resolve() / WORKSPACE_FILE)
    meta = parse(WorkspaceFile, root / WORKSPACE_FILE, data, text=text)
    names: list[str | None] = [None, *meta.profiles]
    return {name: pick_profile(meta, name, text) for name in names}


class Workspace:
    """A folder with ``kiln.toml``, ``vendors/`` and ``patches/``."""

    def __init__(self, root: Path, profile: str | None = None) -> None:
        self.root = root.resolve()
        self._patches_dir: Path | None = None
        data, text = _read(self.root / WORKSPACE_FILE)
        meta = parse(WorkspaceFile, self.root / WORKSPACE_FILE, data, text=text)
        self.release = meta.release
        self.profile_name = profile
        # every profile --profile can name: [profile] ("default"), then each [profiles.NAME]
        self.profile_names = (DEFAULT_PROFILE, *meta.profiles)
        self.profile = self._pick_profile(meta, profile, text)
        self.vendors = self._load_vendors()
        self.series = self._load_series()
        self.readme_text = self.readme_template_text()

    def _pick_profile(self, meta: WorkspaceFile, name: str | None, text: str) -> Profile:
        return pick_profile(meta, name, text)

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
            data, text = _read(path)
            if "name" in data:
                raise ConfigError(f"{rel}: name: unknown key (the file name is the vendor name)")
            vendor = parse(Vendor, rel, {**data, "name": path.stem}, text=text)
            vendor = self._for_profile(vendor, rel)
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
        left out through their toggle variables (set in build.env). A ``rewrite`` recipe
        builds the profile's archs, or their share of its own list where it has one."""
        b = vendor.build
        if b.arch_control == "rewrite" and not b.archs:
            archs = list(self.profile.archs)
            return vendor.model_copy(update={"build": b.model_copy(update={"archs": archs})})
        if b.arch_control not in ("toggles", "rewrite"):
            return vendor
        keep = [a for a in b.archs if a in self.profile.archs]
        if not keep:
            raise ConfigError(
                f"{rel}: build.archs: none of {', '.join(b.archs)} is in the profile's archs "
                f"({', '.join(self.profile.archs)}) in {WORKSPACE_FILE}"
            )
        if b.arch_control == "rewrite":
            return vendor.model_copy(update={"build": b.model_copy(update={"archs": keep})})
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
        data, text = _read(path)
        series = parse(SeriesFile, rel, data, text=text)
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
