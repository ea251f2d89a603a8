"""A vendor's own build tools (``build.build_tools``, kiln/toolchain/vendortools.py): real
pip installs from a local wheelhouse (pip's own ``--no-index``, as ``--offline`` builds
do), kept in kiln's cache and copied into the tree; the bad inputs refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from kiln.config.models import Build, Profile
from kiln.errors import ToolchainError
from kiln.toolchain import vendortools
from tests.integration.test_inplace import make_wheel

PROFILE = Profile(cuda="13.2", python="3.12", torch="2.14.1", archs=["sm_100a"])


@pytest.fixture
def wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "wheelhouse"
    make_wheel(folder, "kiln_setup_helper", "1.0")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return folder


def test_the_tools_are_installed_once_and_copied_into_the_tree(
    tmp_path: Path, wheelhouse: Path
) -> None:
    cache, tree = tmp_path / "cache", tmp_path / "tree"
    tree.mkdir()
    reqs = ["kiln_setup_helper==1.0"]
    where = vendortools.install(reqs, PROFILE, cache, tree, True, tmp_path / "tools.log")
    assert where == tree / vendortools.TOOLS_DIR
    assert (where / "kiln_setup_helper" / "__init__.py").read_text() == "VALUE = 42\n"
    # kept: a second tree gets them with the wheelhouse gone (no pip)
    for wheel in wheelhouse.iterdir():
        wheel.unlink()
    other = tmp_path / "other"
    other.mkdir()
    again = vendortools.install(reqs, PROFILE, cache, other, True, tmp_path / "tools.log")
    assert (again / "kiln_setup_helper" / "__init__.py").is_file()


def test_a_pin_pip_cannot_install_is_one_line_and_leaves_nothing_in_the_cache(
    tmp_path: Path, wheelhouse: Path
) -> None:
    cache, tree = tmp_path / "cache", tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(ToolchainError) as info:
        vendortools.install(
            ["kiln_setup_helper==2.0"], PROFILE, cache, tree, True, tmp_path / "tools.log"
        )
    said = str(info.value)
    assert len(said.splitlines()) == 1, said
    assert said.startswith(
        "build.build_tools kiln_setup_helper==2.0: pip could not install them for Python 3.12 "
        "(--offline: only PIP_FIND_LINKS' wheels): ERROR: "
    ), said
    assert "kiln_setup_helper==2.0" in said.split("ERROR:", 1)[1]
    assert list((cache / "vendor-tools").iterdir()) == []
    assert not (tree / vendortools.TOOLS_DIR).exists()


@pytest.mark.parametrize("bad", ["pybind11", "pybind11>=3", "pybind11==3.*", "-e ."])
def test_a_vendor_build_tool_must_be_pinned(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        Build.model_validate({"kind": "wheel", "build_tools": [bad]})
    assert "write it as name==version" in str(info.value) or "is an option" in str(info.value)
