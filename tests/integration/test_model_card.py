"""The release README as a Hub model card: YAML front matter (license, tags, library), the
``hf download`` install line, and the workspace's own prose from ``release/README.md.in``
with the generated sections at its markers. The tiny upstream builds in seconds."""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import ModelCard

from tests.conftest import run_kiln
from tests.faults.conftest import tiny_build_args
from tests.integration.test_plan_cli import tiny  # noqa: F401  (the fixture)

TEMPLATE = """\
---
tags:
- deepseek
---
# Tiny, the release

Our own words: how the patches were chosen, how to run without RDMA.

<!-- kiln:install -->

Measured on our pods: fast enough.

<!-- kiln:sources -->
"""


def _readme(tmp_path: Path, ws: Path, mirrors: Path) -> str:
    res = run_kiln(*tiny_build_args(ws, tmp_path, mirrors, "--offline"))
    assert res.returncode == 0, res.stderr[-3000:]
    return (tmp_path / "artifacts" / "test-release" / "README.md").read_text()


def test_readme_without_a_template_is_a_model_card(tmp_path: Path, tiny) -> None:  # noqa: F811
    ws, mirrors, _commit = tiny
    text = _readme(tmp_path, ws, mirrors)
    assert text.startswith("---\n")
    card = ModelCard(text)
    meta = card.data.to_dict()  # CardData's fields are its YAML's: dynamic attributes
    assert meta.get("library_name") is None  # not one the Hub knows: left out (issue 41)
    assert meta["license"] == "other"
    # license_link names a file of the release (the Hub's spec), not a folder
    release = tmp_path / "artifacts" / "test-release"
    assert (release / meta["license_link"]).is_file(), meta["license_link"]
    assert "tiny" in meta["tags"] and "cu130" in meta["tags"]
    assert "hf download ORG/NAME --local-dir /opt/kiln/release" in text
    assert card.text.lstrip().startswith("# test-release")


def test_template_prose_with_sections_at_its_markers(tmp_path: Path, tiny) -> None:  # noqa: F811
    ws, mirrors, _commit = tiny
    (ws / "release").mkdir()
    (ws / "release" / "README.md.in").write_text(TEMPLATE)
    toml = (ws / "kiln.toml").read_text()
    (ws / "kiln.toml").write_text(
        toml.replace('name = "test-release"', 'name = "test-release"\nhub_repo = "org/tiny"')
    )
    text = _readme(tmp_path, ws, mirrors)
    card = ModelCard(text)
    meta = card.data.to_dict()
    assert meta["tags"] == ["deepseek"]  # the template's own metadata wins
    assert meta.get("library_name") is None
    body = card.text
    order = [
        body.index("# Tiny, the release"),
        body.index("Our own words"),
        body.index("## Install"),
        body.index("hf download org/tiny --local-dir /opt/kiln/release"),
        body.index("Measured on our pods"),
        body.index("## Pinned sources"),
        body.index("## Contents"),  # not placed by the template: after its text
    ]
    assert order == sorted(order), body
    assert "<!-- kiln:" not in body
    data = json.loads((tmp_path / "artifacts/test-release/manifest.json").read_text())
    assert data["release"]["readme_template"] == "release/README.md.in"
    assert data["release"]["readme_template_text"] == TEMPLATE


def test_unknown_marker_is_refused_before_any_work(tmp_path: Path, tiny) -> None:  # noqa: F811
    ws, mirrors, _commit = tiny
    (ws / "release").mkdir()
    (ws / "release" / "README.md.in").write_text("# x\n<!-- kiln:tables -->\n")
    res = run_kiln(*tiny_build_args(ws, tmp_path, mirrors, "--offline"))
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("kiln: error: release/README.md.in: unknown marker <!-- kiln:tables -->")
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())
