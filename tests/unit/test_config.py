"""Config validation: every malformed input names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.config.workspace import Workspace, arch_to_torch
from kiln.errors import ConfigError
from tests.conftest import REPO
from tests.workspace import PROFILE, plain_vendor, write

SHA = "a" * 40


def load(tmp_path: Path, vendor: dict, profile: dict | None = None) -> Workspace:
    return Workspace(write(tmp_path, {"plain": vendor}, profile=profile))


def error(tmp_path: Path, vendor: dict, profile: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, vendor, profile)
    return str(info.value)


def test_valid_vendor_loads(tmp_path: Path) -> None:
    ws = load(tmp_path, plain_vendor(SHA))
    assert ws.vendors["plain"].build.archs == ["sm_100a", "sm_103a"]
    assert ws.profile.python_tag == "cp311"


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    vendor = plain_vendor(SHA)
    vendor["build"]["max_job"] = 2
    msg = error(tmp_path, vendor)
    assert "vendors/plain.toml" in msg and "build.max_job: unknown key" in msg


def test_missing_field_names_file_and_key(tmp_path: Path) -> None:
    vendor = plain_vendor(SHA)
    del vendor["source"]["commit"]
    assert "vendors/plain.toml: source.commit: missing required key" in error(tmp_path, vendor)


@pytest.mark.parametrize("commit", ["xyz1234", "abc", "A" * 40, "a" * 41])
def test_malformed_sha(tmp_path: Path, commit: str) -> None:
    msg = error(tmp_path, plain_vendor(commit))
    assert "vendors/plain.toml: source.commit:" in msg and "not a commit SHA" in msg


def test_malformed_arch(tmp_path: Path) -> None:
    msg = error(tmp_path, plain_vendor(SHA, archs=["sm_100a", "blackwell"]))
    assert "vendors/plain.toml: build.archs.1:" in msg and "'blackwell'" in msg


def test_arch_outside_profile(tmp_path: Path) -> None:
    msg = error(tmp_path, plain_vendor(SHA, archs=["sm_90a"]))
    assert "build.archs: sm_90a not in the profile's archs" in msg


def test_malformed_profile_arch(tmp_path: Path) -> None:
    msg = error(tmp_path, plain_vendor(SHA), profile={**PROFILE, "archs": ["sm100"]})
    assert "kiln.toml: profile.archs.0:" in msg


def test_none_arch_control_must_have_no_archs(tmp_path: Path) -> None:
    vendor = plain_vendor(SHA)
    vendor["build"]["arch_control"] = "none"
    assert "build.archs must be empty" in error(tmp_path, vendor)


def test_unknown_patch_target(tmp_path: Path) -> None:
    write(tmp_path, {"plain": plain_vendor(SHA)}, series=[{"file": "x.patch", "target": "nosuch"}])
    with pytest.raises(ConfigError, match=r"series.toml: patch.0.target: unknown vendor 'nosuch'"):
        Workspace(tmp_path)


def test_unknown_vendor_name(tmp_path: Path) -> None:
    ws = load(tmp_path, plain_vendor(SHA))
    with pytest.raises(ConfigError, match="unknown vendor 'deepep': known vendors are plain"):
        ws.select(["deepep"])


def test_invalid_toml(tmp_path: Path) -> None:
    write(tmp_path, {"plain": plain_vendor(SHA)})
    (tmp_path / "vendors" / "plain.toml").write_text("[source\n")
    with pytest.raises(ConfigError, match="plain.toml: not valid TOML"):
        Workspace(tmp_path)


def test_arch_to_torch() -> None:
    assert [arch_to_torch(a) for a in ("sm_100a", "sm_103a", "sm_90a", "sm_80")] == [
        "10.0a",
        "10.3a",
        "9.0a",
        "8.0",
    ]


def test_the_release_workspace_is_valid() -> None:
    """The real lock: five upstreams, each building what it supports of the profile."""
    ws = Workspace(REPO)
    assert ws.profile.cuda == "13.2" and ws.profile.python == "3.12"
    assert ws.profile.torch == "2.13.0+cu132"
    assert ws.profile.archs == ["sm_100a", "sm_103a"]
    assert set(ws.vendors) == {"deepinfer", "deepep", "deepgemm", "flashmla", "deepselect"}
    assert ws.vendors["deepgemm"].build.arch_control == "none"
    assert ws.vendors["deepep"].build.arch_control == "torch-arch-list"
    for name in ("flashmla", "deepselect"):
        assert ws.vendors[name].build.arch_control == "hardcoded"
        assert ws.vendors[name].build.archs == ["sm_100a", "sm_103a"]
    commits = {n: v.source.commit[:7] for n, v in ws.vendors.items()}
    assert commits == {
        "deepinfer": "9bd9cf2",
        "deepep": "f6aa38f",
        "deepgemm": "1fc9c66",
        "flashmla": "2e5429f",
        "deepselect": "bfa4507",
    }
    assert [p.file for p in ws.patches_for("deepinfer")] == [
        "deepinfer-engram-local.patch",
        "deepinfer-nvls-optout.patch",
        "deepinfer-prefix-cache.patch",
    ]
