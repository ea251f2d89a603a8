"""The reference pages of the workspace's TOML files (``docs/kiln-toml.md``,
``docs/vendor-toml.md``, ``docs/series-toml.md``), made from the same JSON Schemas editors
read (:mod:`kiln.config.schema`, themselves made from the models): every key, dotted
(``build.arch_toggles``, ``source.submodules[].path``), its type in words, whether it is
required or its default, its description and an example in TOML.

Committed, and checked against :func:`markdown` by a test. Regenerate the pages and the
schemas together::

    python -m kiln.commands.toml_reference --write [REPO_ROOT]    # --check: exit 1 if stale
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import tomlkit

from kiln.config.schema import MODELS, Which, json_schema, schema_file, schema_text

DOCS: dict[Which, str] = {
    "kiln": "docs/kiln-toml.md",
    "vendor": "docs/vendor-toml.md",
    "series": "docs/series-toml.md",
}
# Where each kind of file lives in a workspace, for the #:schema line the pages show.
_IN_WORKSPACE: dict[Which, str] = {
    "kiln": "kiln.toml",
    "vendor": "vendors/NAME.toml",
    "series": "patches/series.toml",
}


@dataclass(frozen=True)
class Key:
    """One key of a file: its dotted path, its schema, and whether it must be written."""

    path: str
    schema: dict[str, Any]
    required: bool
    table: bool  # a table (or list of tables) whose keys follow


def keys(which: Which) -> list[Key]:
    """Every key of one kind of file, in the models' order, tables before their keys."""
    root = json_schema(which)
    found: list[Key] = []
    _walk(root, root, "", found)
    return found


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` replaced by the definition (its own keywords win)."""
    ref = node.get("$ref")
    if not ref:
        return node
    target = root["$defs"][ref.rsplit("/", 1)[1]]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def _walk(root: dict[str, Any], table: dict[str, Any], prefix: str, found: list[Key]) -> None:
    """The keys of ``table``: its plain keys first, then its tables with their keys (at
    the top, the models' order: ``[release]``, ``[profile]``, ``profiles``)."""
    required = set(table.get("required", []))
    later: list[tuple[Key, dict[str, Any], str]] = []
    for name, prop in table["properties"].items():
        node = _resolve(root, prop)
        path = f"{prefix}{name}"
        items = _resolve(root, node["items"]) if node.get("type") == "array" else {}
        if "properties" in node:  # a table
            later.append((Key(path, node, name in required, True), node, f"{path}."))
        elif "properties" in items:  # a list of tables
            later.append((Key(path, node, name in required, True), items, f"{path}[]."))
        elif prefix:
            found.append(Key(path, node, name in required, False))
        else:
            later.append((Key(path, node, name in required, False), {}, ""))
    for key, inner, inner_prefix in later:
        found.append(key)
        if inner:
            _walk(root, inner, inner_prefix, found)


# --------------------------------------------------------------------------- words


def _words(root: dict[str, Any], node: dict[str, Any], plural: bool = False) -> str:
    """A schema's type in plain words: ``a list of strings matching `^sm_...$` ``."""
    node = _resolve(root, node)
    if "enum" in node:
        choices = ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
        return ("strings, each one of " if plural else "one of ") + choices
    kind = node.get("type")
    if kind in ("string", "integer", "number", "boolean"):
        one, several = {
            "string": ("a string", "strings"),
            "integer": ("an integer", "integers"),
            "number": ("a number", "numbers"),
            "boolean": ("true or false", "booleans"),
        }[kind]
        text = several if plural else one
        if "pattern" in node:
            text += f" matching `{node['pattern']}`"
        for word, op in (("minimum", "≥"), ("exclusiveMinimum", ">")):
            if word in node:
                text += f" {op} {node[word]}"
        return text
    if kind == "array":
        text = ("lists" if plural else "a list") + " of " + _words(root, node["items"], True)
        if "minItems" in node:
            text += f", at least {node['minItems']}"
        if node.get("uniqueItems"):
            text += ", none twice"
        return text
    if kind == "object" or "properties" in node:
        text = "tables" if plural else "a table"
        if "properties" in node:
            return text
        patterns = node.get("patternProperties") or {}
        if patterns:
            ((keyp, value),) = patterns.items()
            return f"{text} of {_words(root, value, True)}, keys matching `{keyp}`"
        value = node.get("additionalProperties")
        return f"{text} of {_words(root, value, True)}" if isinstance(value, dict) else text
    return "any value"


def _toml(path: str, value: Any) -> str:
    """``value`` written as the TOML of key ``path`` (``source.submodules[].path``)."""
    parts = path.split(".")
    doc: Any = value
    for part in reversed(parts):
        doc = [doc] if part.endswith("[]") and not isinstance(doc, list) else doc
        doc = {part.removesuffix("[]"): doc}
    return tomlkit.dumps(doc).strip()


# --------------------------------------------------------------------------- the page


def markdown(which: Which) -> str:
    """The reference page of one kind of file."""
    root = json_schema(which)
    depth = "../" * _IN_WORKSPACE[which].count("/") or "./"
    lines = [
        f"# `{_IN_WORKSPACE[which]}` reference",
        "",
        "<!-- Generated from kiln/config/models.py by `python -m "
        "kiln.commands.toml_reference --write`; do not edit. -->",
        "",
        root.get("description", ""),
        "",
        "Editors that read JSON Schemas (Taplo, VS Code's Even Better TOML) complete and "
        "check these keys when the file starts with a `#:schema` line, the schema's path "
        "relative to the file (here for a workspace at the root of kiln's repository; "
        "elsewhere, the file's path in the installed `kiln` package):",
        "",
        "```toml",
        f"#:schema {depth}kiln/{schema_file(which)}",
        "```",
        "",
        "The schema: [`kiln/" + schema_file(which) + "`](../kiln/" + schema_file(which) + ").",
        "",
    ]
    for key in keys(which):
        node = key.schema
        if key.table and node.get("type") == "array":
            lines += [f"## `[[{key.path}]]`", ""]
        elif key.table:
            lines += [f"## `[{key.path}]`", ""]
        else:
            lines += [f"{'###' if '.' in key.path else '##'} `{key.path}`", ""]
        if key.required:
            need = "required"
        elif "default" in node:
            need = f"optional, default `{json.dumps(node['default'])}`"
        else:
            need = "optional"
        lines += [f"*{_words(root, node)}; {need}*", ""]
        lines += [node.get("description", ""), ""]
        if key.table and node.get("type") == "array":  # and what each table is
            lines += [_resolve(root, node["items"]).get("description", ""), ""]
        if node.get("examples"):
            lines += ["```toml", _toml(key.path, node["examples"][0]), "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- writing


def generated() -> dict[str, str]:
    """Every generated file (relative to the repository root) and its text."""
    out: dict[str, str] = {}
    for which in get_args(Which):
        out[f"kiln/{schema_file(which)}"] = schema_text(which)
        out[DOCS[which]] = markdown(which)
    return out


def stale(repo_root: Path) -> list[str]:
    """The generated files whose committed text differs from what the models make."""
    return [
        rel
        for rel, text in generated().items()
        if not (repo_root / rel).is_file() or (repo_root / rel).read_text() != text
    ]


def write_all(repo_root: Path) -> list[str]:
    """Write the schemas and the reference pages under ``repo_root``; the files changed."""
    changed = stale(repo_root)
    texts = generated()
    for rel in changed:
        (repo_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo_root / rel).write_text(texts[rel])
    return changed


__all__ = ["DOCS", "MODELS", "Key", "generated", "keys", "markdown", "stale", "write_all"]
