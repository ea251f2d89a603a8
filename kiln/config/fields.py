"""The value types of kiln's configuration: SHAs, archs, names, paths inside a tree,
URLs git may be given, SPDX license expressions; each a pydantic ``Annotated`` type with
one validator (and, where a regular expression says it, the pattern the JSON Schemas of
:mod:`kiln.config.schema` give editors), and the ``Strict`` base every configuration model
uses (frozen, unknown keys refused)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Parsed
from pydantic import AfterValidator, BaseModel, ConfigDict, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from kiln.config.spdx import license_problem

SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")
FULL_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
ARCH_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

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


def _pinned(value: str) -> str:
    try:
        parsed = Parsed(_requirement(value))
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a requirement: {exc}") from None
    specs = list(parsed.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise ValueError(f"{value!r} is not pinned: write it as name==version")
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
    if not SHA256_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a sha256 (64 lowercase hex digits)")
    return value


def _license_id(value: str) -> str:
    problem = license_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _unique(values: list[str]) -> list[str]:
    dupes = sorted({v for v in values if values.count(v) > 1})
    if dupes:
        raise ValueError(f"listed twice: {', '.join(dupes)}")
    return values


@dataclass(frozen=True)
class _Schema:
    """Keywords added to a type's JSON Schema (for editors, :mod:`kiln.config.schema`):
    the pattern a validator checks, which the validator, with its own message, enforces."""

    keywords: dict[str, object]

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), **self.keywords}

    def __hash__(self) -> int:
        return hash(json.dumps(self.keywords, sort_keys=True))


def _pattern(regex: re.Pattern[str]) -> _Schema:
    return _Schema({"pattern": regex.pattern})


Url = Annotated[str, AfterValidator(_url)]
InsidePath = Annotated[str, AfterValidator(_inside)]
Module = Annotated[str, AfterValidator(_module), _pattern(MODULE_RE)]
Requirement = Annotated[str, AfterValidator(_requirement)]
PinnedRequirement = Annotated[str, AfterValidator(_pinned)]
Sha = Annotated[str, AfterValidator(_sha), _pattern(SHA_RE)]
FullSha = Annotated[str, AfterValidator(_full_sha), _pattern(FULL_SHA_RE)]
Arch = Annotated[str, AfterValidator(_arch), _pattern(ARCH_RE)]
Name = Annotated[str, AfterValidator(_name), _pattern(NAME_RE)]
Sha256 = Annotated[str, AfterValidator(_sha256), _pattern(SHA256_RE)]
ArchList = Annotated[list[Arch], AfterValidator(_unique), _Schema({"uniqueItems": True})]
# An SPDX license id or expression (MIT, BSD-2-Clause, MIT OR Apache-2.0), as SPDX writes it.
LicenseId = Annotated[str, AfterValidator(_license_id)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
