"""JSON Schemas of the workspace's TOML files, made from the models of
:mod:`kiln.config.models`: ``kiln.toml``, ``vendors/*.toml`` and ``patches/series.toml``.

Editors read them (Taplo / "Even Better TOML" through a first-line ``#:schema`` comment)
to complete keys, show each key's description and flag mistakes as they are typed; kiln
itself validates with the models, whose errors say more. The committed copies in
``kiln/schemas/`` are checked against :func:`schema_text` by a test; regenerate them with
``python -m kiln.commands.toml_reference --write``.

TOML has no null: an optional key is one that may be left out, so ``X | None`` is
written as ``X`` and a default of None is not shown. Defaults made by a factory (an
empty list or table) are shown.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, NoDefault
from pydantic_core import core_schema

from kiln.config.models import SeriesFile, Vendor, WorkspaceFile

Which = Literal["kiln", "vendor", "series"]

# Each schema: its model, the file it describes, and its title.
MODELS: dict[Which, tuple[type[BaseModel], str]] = {
    "kiln": (WorkspaceFile, "kiln.toml"),
    "vendor": (Vendor, "vendors/NAME.toml"),
    "series": (SeriesFile, "patches/series.toml"),
}
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_file(which: Which) -> str:
    """The schema's path inside the ``kiln`` package."""
    return f"schemas/{which}.schema.json"


class _TomlSchema(GenerateJsonSchema):
    """pydantic's generator, for TOML: no nulls, factory defaults shown, no titles made
    from field names (the key is its own title)."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        if "default_factory" in schema and not schema.get("default_factory_takes_data"):
            return schema["default_factory"]()  # type: ignore[call-arg]
        default = super().get_default_value(schema)
        return NoDefault if default is None else default

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def sort(self, value: JsonSchemaValue, parent_key: str | None = None) -> JsonSchemaValue:
        return value  # the models' order (read by kiln.config.reference); files sort keys


def json_schema(which: Which) -> dict[str, Any]:
    """The JSON Schema of one kind of file, generated from its model."""
    model, path = MODELS[which]
    out = model.model_json_schema(schema_generator=_TomlSchema)
    if which == "kiln":
        _profile_variants(out)
    _unwrap(out)
    return {
        "$schema": DIALECT,
        "$id": f"https://kiln.invalid/{which}.schema.json",
        **out,
        "title": path,
    }


def _profile_variants(schema: dict[str, Any]) -> None:
    """``[profiles.NAME]`` holds any keys of ``[profile]``, none of them required (the
    model keeps them as a plain table and checks the merged profile when one is chosen)."""
    variant = copy.deepcopy(schema["$defs"]["Profile"])
    variant.pop("required", None)
    variant["title"] = "ProfileVariant"
    variant["description"] = "The keys of `[profile]` a named variant changes."
    schema["$defs"]["ProfileVariant"] = variant
    profiles = schema["properties"]["profiles"]
    (names,) = profiles["patternProperties"]  # the Name pattern of the model's keys
    profiles["patternProperties"] = {names: {"$ref": "#/$defs/ProfileVariant"}}
    profiles["additionalProperties"] = False


def _unwrap(node: Any) -> None:
    """Descriptions as one line a paragraph (class docstrings are wrapped at 92)."""
    if isinstance(node, dict):
        text = node.get("description")
        if isinstance(text, str):
            paragraphs = text.split("\n\n")
            node["description"] = "\n\n".join(" ".join(p.split()) for p in paragraphs)
        for key, value in node.items():
            if key not in ("examples", "default"):
                _unwrap(value)
    elif isinstance(node, list):
        for item in node:
            _unwrap(item)


def schema_text(which: Which) -> str:
    """The schema as committed: sorted keys, two-space indent, a trailing newline."""
    return json.dumps(json_schema(which), indent=2, sort_keys=True) + "\n"


def committed_schema_text(which: Which) -> str:
    return resources.files("kiln").joinpath(schema_file(which)).read_text()
