"""The configuration documents itself: the JSON Schemas editors read and the reference
pages (docs/*-toml.md) are made from the models and committed; every workspace TOML of
the repository names its schema on its first line; a license is any SPDX id or
expression, checked against the list ``packaging`` ships."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tomllib
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import jsonschema  # type: ignore[import-untyped]
import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from pydantic import BaseModel

from kiln.commands import toml_reference
from kiln.config import reference, schema
from kiln.config.models import SeriesFile, Vendor, WorkspaceFile
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, VerifyError
from kiln.release import manifest, provenance, readme
from kiln.sources import licenses
from tests.conftest import REPO
from tests.workspace import plain_vendor, write

SHA = "a" * 40
WHICH: tuple[schema.Which, ...] = ("kiln", "vendor", "series")
MODELS: dict[str, type[BaseModel]] = {"kiln": WorkspaceFile, "vendor": Vendor, "series": SeriesFile}
WORKSPACES = [REPO, REPO / "examples" / "demo", REPO / "examples" / "public"]


# ----------------------------------------------------------------------- committed == generated


def test_the_committed_schemas_and_pages_are_the_models() -> None:
    assert reference.stale(REPO) == [], (
        "generated from kiln/config/models.py and stale: "
        "python -m kiln.commands.toml_reference --write"
    )
    for which in WHICH:
        assert schema.committed_schema_text(which) == schema.schema_text(which)


def test_a_stale_file_is_found_and_rewritten(tmp_path: Path) -> None:
    for rel in reference.generated():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, tmp_path / rel)
    assert toml_reference.main(["--check", str(tmp_path)]) == 0
    page = tmp_path / "docs" / "vendor-toml.md"
    page.write_text(page.read_text().replace("build.max_jobs", "build.max_job"))
    (tmp_path / "kiln" / "schemas" / "kiln.schema.json").unlink()
    stale = ["kiln/schemas/kiln.schema.json", "docs/vendor-toml.md"]
    assert reference.stale(tmp_path) == stale
    with pytest.raises(ConfigError, match=r"kiln\.schema\.json, docs/vendor-toml\.md: stale"):
        toml_reference.main(["--check", str(tmp_path)])
    assert reference.write_all(tmp_path) == stale
    assert reference.stale(tmp_path) == []


def test_the_schemas_are_deterministic_json_schemas() -> None:
    for which in WHICH:
        text = schema.schema_text(which)
        assert text == schema.schema_text(which) and text.endswith("}\n")
        data = json.loads(text)
        jsonschema.Draft202012Validator.check_schema(data)
        assert data["title"] == schema.MODELS[which][1]
        assert "null" not in text  # TOML has none: an optional key is one left out


# ----------------------------------------------------------------------- every key documented


def _bare(tp: Any) -> Any:
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp


def _model_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, field, bare type) of every key a file of ``model`` may hold, read
    from the models themselves (not from the schema the pages are made from)."""
    found = []
    for name, field in model.model_fields.items():
        if model is Vendor and name == "name":
            continue  # filled from the file name
        path, tp = f"{prefix}{name}", _bare(field.annotation)
        found.append((path, field, tp))
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            found += _model_keys(tp, f"{path}.")
        elif get_origin(tp) is list:
            item = _bare(get_args(tp)[0])
            if isinstance(item, type) and issubclass(item, BaseModel):
                found += _model_keys(item, f"{path}[].")
    return found


@pytest.mark.parametrize("which", WHICH)
def test_every_key_of_the_models_is_in_its_reference_page(which: schema.Which) -> None:
    page = (REPO / reference.DOCS[which]).read_text()
    headings = set(re.findall(r"^#{2,3} `\[{0,2}(.+?)\]{0,2}`$", page, re.MULTILINE))
    keys = [path for path, _, _ in _model_keys(MODELS[which])]
    assert keys and set(keys) == headings
    nested = {path for path, _, _ in _model_keys(Vendor)}  # the walk sees nested tables
    assert {"build.gpu_test.timeout_s", "source.submodules[].license_id"} <= nested


def test_every_key_has_a_description_and_every_value_an_example() -> None:
    for which in WHICH:
        for path, field, tp in _model_keys(MODELS[which]):
            table = isinstance(tp, type) and issubclass(tp, BaseModel)
            assert field.description or (table and tp.__doc__), f"{which}: {path}"
            assert field.examples or table, f"{which}: {path} has no example"


def test_the_example_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page without a TOML block, or with a key its file does not have: red."""
    for text in ("# kiln.toml\nno example here\n", '```toml\n[relase]\nname = "x"\n```\n'):
        (tmp_path / "page.md").write_text(text)
        monkeypatch.setattr(reference, "DOCS", {w: "page.md" for w in WHICH})
        monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
        with pytest.raises(AssertionError):
            test_the_pages_examples_are_toml_of_their_keys()


def test_the_vendor_name_is_not_a_key_of_the_file() -> None:
    """kiln fills it from the file name and refuses it as a key."""
    assert "name" not in schema.json_schema("vendor")["properties"]
    assert "## `name`" not in (REPO / "docs" / "vendor-toml.md").read_text()


def test_the_pages_examples_are_toml_of_their_keys() -> None:
    """Every page has TOML examples (a page without one would pass a loop over none), each
    one TOML whose top-level keys and tables the page's file knows."""
    for which in WHICH:
        page = (REPO / reference.DOCS[which]).read_text()
        blocks = re.findall(r"```toml\n(.*?)```", page, re.DOTALL)
        assert blocks, f"{reference.DOCS[which]}: no TOML example"
        known = {path.split(".")[0].split("[")[0] for path, _, _ in _model_keys(MODELS[which])}
        for block in blocks:
            data = tomllib.loads(block)
            if block.lstrip().startswith("#:schema"):
                continue  # the editor's schema line, shown alone
            assert data, f"{reference.DOCS[which]}: an empty TOML example"
            unknown = set(data) - known
            assert not unknown, f"{reference.DOCS[which]}: example keys {unknown} not in {known}"


# ----------------------------------------------------------------------- editors: #:schema


def _workspace_tomls() -> list[tuple[Path, str]]:
    files = []
    for ws in WORKSPACES:
        files.append((ws / "kiln.toml", "kiln"))
        files += [(p, "vendor") for p in sorted((ws / "vendors").glob("*.toml"))]
        files.append((ws / "patches" / "series.toml", "series"))
    return files


def test_every_workspace_toml_names_its_schema_on_its_first_line() -> None:
    files = _workspace_tomls()
    assert len(files) >= 16
    for path, which in files:
        first = path.read_text().splitlines()[0]
        assert first.startswith("#:schema "), f"{path}: no #:schema line"
        target = (path.parent / first.removeprefix("#:schema ")).resolve()
        assert target == (REPO / "kiln" / schema.schema_file(which)).resolve(), path  # type: ignore[arg-type]


def test_the_schemas_accept_the_repositorys_own_tomls() -> None:
    for path, which in _workspace_tomls():
        validator = jsonschema.Draft202012Validator(schema.json_schema(which))  # type: ignore[arg-type]
        errors = [e.message for e in validator.iter_errors(tomllib.loads(path.read_text()))]
        assert errors == [], path


@pytest.mark.parametrize(
    "change",
    [
        lambda v: v.update(name="plain"),
        lambda v: v["build"].update(max_job=2),
        lambda v: v["build"].update(archs=["blackwell"]),
        lambda v: v["build"].update(arch_control="hardcode"),
        lambda v: v["source"].pop("commit"),
    ],
)
def test_the_vendor_schema_flags_what_kiln_refuses(tmp_path: Path, change) -> None:
    vendor = plain_vendor(SHA)
    change(vendor)
    validator = jsonschema.Draft202012Validator(schema.json_schema("vendor"))
    assert list(validator.iter_errors(vendor))
    with pytest.raises(ConfigError):
        Workspace(write(tmp_path, {"plain": vendor}))


def test_kiln_reads_a_schema_line_as_the_comment_it_is(tmp_path: Path) -> None:
    """Errors still name the line a key is on, counting the #:schema line."""
    ws = write(tmp_path, {})
    (ws / "vendors" / "deepep.toml").write_text(
        "#:schema ../kiln/schemas/vendor.schema.json\n"
        f'[source]\nurl = "https://example.invalid/x.git"\ncommit = "{SHA}"\n\n'
        '[build]\nkind = "wheel"\narch_contrl = "none"\n'
    )
    with pytest.raises(ConfigError) as info:
        Workspace(ws)
    assert str(info.value) == (
        "vendors/deepep.toml: build.arch_contrl: unknown key; did you mean arch_control? (line 8)"
    )


# ----------------------------------------------------------------------- SPDX license ids


def _with_license(tmp_path: Path, license_id: str, submodule: bool = False) -> Path:
    vendor = plain_vendor(SHA)
    if submodule:
        vendor["source"]["submodules"] = [{"path": "third_party/x", "license_id": license_id}]
    else:
        vendor["source"]["license_id"] = license_id
    return write(tmp_path, {"plain": vendor})


@pytest.mark.parametrize(
    "license_id", ["BSD-2-Clause", "Zlib", "MIT OR Apache-2.0", "Apache-2.0 WITH LLVM-exception"]
)
def test_any_spdx_license_id_or_expression_loads(tmp_path: Path, license_id: str) -> None:
    ws = Workspace(_with_license(tmp_path, license_id))
    assert ws.vendors["plain"].source.license_id == license_id


@pytest.mark.parametrize(
    ("license_id", "said"),
    [
        ("BSD-2", "'BSD-2' is not an SPDX license id; did you mean BSD-2-Clause?"),
        ("Nonsense-1.0", "'Nonsense-1.0' is not an SPDX license id"),
        ("Apache 2.0", "'Apache 2.0' is not an SPDX license id; did you mean Apache-2.0?"),
        ("mit", "'mit' is written MIT in SPDX's list; write MIT"),
        (
            "MIT OR BSD2",
            "'MIT OR BSD2': BSD2 is not an SPDX license id; did you mean BSD-2-Clause?",
        ),
        ("MIT AND", "'MIT AND' is not an SPDX license expression (like MIT, or MIT OR Apache-2.0;"),
    ],
)
def test_a_license_id_not_in_spdx_is_refused_in_one_line(
    tmp_path: Path, license_id: str, said: str
) -> None:
    for submodule, key in ((False, "source.license_id"), (True, "source.submodules.0.license_id")):
        with pytest.raises(ConfigError) as info:
            Workspace(_with_license(tmp_path / key, license_id, submodule))
        msg = str(info.value)
        assert msg.startswith(f"vendors/plain.toml: {key}: {said}"), msg
        assert "\n" not in msg
        if "SPDX license id" in said:
            assert "(list: https://spdx.org/licenses/)" in msg


def test_a_license_file_must_read_like_a_license_kiln_knows(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "LICENSE").write_text("Redistribution and use in source and binary forms, ...\n")

    def collect(license_id: str) -> Path:
        vendor = Vendor.model_validate({**plain_vendor(SHA), "name": "plain"})
        source = vendor.source.model_copy(update={"license_id": license_id})
        vendor = vendor.model_copy(update={"source": source})
        return licenses.collect(vendor, tree, tmp_path / "out" / "LICENSE")

    assert collect("BSD-2-Clause").is_file()
    assert collect("Zlib").is_file()  # no wording known: shipped as declared
    with pytest.raises(VerifyError, match="does not read like MIT"):
        collect("MIT")


def _manifest(source_id: str, submodule_id: str | None) -> manifest.Manifest:
    sub = {"path": "third_party/x", "url": "https://example.invalid/x.git", "commit": "b" * 40}
    source = {
        "url": "https://example.invalid/a.git",
        "requested": "abc1234",
        "commit": SHA,
        "commit_time": 0,
        "submodules": [{**sub, "license_id": submodule_id}] if submodule_id else [],
        "license_id": source_id,
    }
    return manifest.parse(
        {
            "schema": manifest.SCHEMA_ID,
            "kiln_version": "0",
            "release": {"name": "r"},
            "profile": {"cuda": "13.2", "python": "3.12", "torch": None, "archs": ["sm_100a"]},
            "toolchain": {
                "cuda_home": "/cuda",
                "nvcc_version": "13.2",
                "gcc_version": "13",
                "python_version": "3.12",
                "torch_version": None,
                "torch_cuda": None,
                "torch_cxx11_abi": None,
            },
            "runner": {"kind": "local", "image": None},
            "vendors": {
                "a": {
                    "source": source,
                    "patches": [],
                    "recipe": {},
                    "environment": {},
                    "outputs": [],
                    "timings": {},
                }
            },
        },
        "test",
    )


def test_other_license_ids_reach_the_sbom_and_the_model_card() -> None:
    m = _manifest("BSD-2-Clause", "MIT OR Apache-2.0")
    sbom = provenance.sbom(m, [])
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(sbom) is None
    (comp,) = json.loads(sbom)["components"]
    assert comp["licenses"] == [{"expression": "BSD-2-Clause"}]
    assert comp["components"][0]["licenses"] == [{"expression": "MIT OR Apache-2.0"}]
    meta = readme.front_matter(m)
    assert meta["license"] == "other"
    # the Hub's spec: an id (a slug, not the SPDX expression), a link to a file
    assert meta["license_name"] == "bsd-2-clause-and-mit-or-apache-2.0"
    assert meta["license_link"] == "README.md" and "library_name" not in meta
    # One license the Hub knows is named as the Hub spells it; one it does not, as other.
    assert readme.front_matter(_manifest("BSD-2-Clause", None))["license"] == "bsd-2-clause"
    meta = readme.front_matter(_manifest("MIT-0", None))
    assert (meta["license"], meta["license_name"]) == ("other", "mit-0")


def test_the_readme_says_the_archs_read_from_the_sass_not_the_profiles_list() -> None:
    """An upstream that hard-codes its archs may build fewer than the profile asks: the
    README's prose and the card's tags name what the outputs carry (their SASS)."""
    m = _manifest("MIT", None)
    m = m.model_copy(
        update={"profile": m.profile.model_copy(update={"archs": ["sm_100a", "sm_103a"]})}
    )

    def wheel(name: str, sass: list[str]) -> manifest.Output:
        return manifest.Output(
            path=f"wheels/{name}-1.0-cp312-cp312-linux_x86_64.whl",
            sha256="0" * 64,
            size=1,
            kind="wheel",
            name=name,
            version="1.0",
            shared_objects=[manifest.SharedObjectInfo(path=f"{name}/_C.so", sass=sass, ptx=[])],
        )

    def with_outputs(*outputs: manifest.Output) -> manifest.Manifest:
        vendor = m.vendors["a"].model_copy(
            update={"outputs": list(outputs), "recipe": {"kind": "wheel"}}
        )
        return m.model_copy(update={"vendors": {"a": vendor}})

    one = with_outputs(wheel("x", ["sm_100a"]))
    text = readme.render(one)
    assert "from pinned sources for sm_100a (read from the SASS of every output)" in text
    assert "sm_103a" not in text  # the profile asked for it; nothing carries it
    tags = readme.front_matter(one)["tags"]
    assert isinstance(tags, list) and tags.count("sm_100a") == 1
    two = with_outputs(wheel("x", ["sm_100a"]), wheel("y", ["sm_100a", "sm_103a"]))
    assert (
        "for sm_100a, sm_103a (read from the SASS of every output; not all carry each: "
        "x-1.0-cp312-cp312-linux_x86_64.whl: sm_100a)"
    ) in readme.render(two)
