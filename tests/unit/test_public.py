"""examples/public, the workspace of the public DeepGEMM, DeepEP and FlashMLA (issue 12):
its recipes hold only what is upstream-specific, its profiles choose FlashMLA's archs
through the recipe's toggles, its bundles become mirrors, and `kiln verify` writes each
recipe back as it was. The builds themselves run in .ci/run (`nox -s build_public`, then
`manifest check` and `verify-wheel`), not here: they take many minutes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import tomlkit

from kiln.config.mirrors import Mirrors
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError
from kiln.verbs import rebuild_check as rebuild
from tests import public

# What a recipe must not say: where CUDA pieces, stubs or torch's pip CUDA lie (kiln finds
# and records them: kiln/inside/kit/pipcuda.py).
TOOLCHAIN_PATHS = re.compile(
    r"CUDA_HOME|/usr/local/cuda|site-packages|nvidia/|stubs|LIBRARY_PATH|INCLUDE_PATH|CPATH"
)


def toolchain_paths(recipe_text: str) -> list[str]:
    """The non-comment lines of a vendor TOML that name toolchain paths."""
    lines = [ln.split("#", 1)[0] for ln in recipe_text.splitlines()]
    return [ln.strip() for ln in lines if TOOLCHAIN_PATHS.search(ln)]


def test_public_recipes_hold_no_toolchain_paths() -> None:
    files = sorted((public.WORKSPACE / "vendors").glob("*.toml"))
    assert [f.stem for f in files] == ["deepep", "deepgemm", "flashmla"]
    for f in files:
        assert toolchain_paths(f.read_text()) == [], f.name


def test_the_toolchain_path_check_can_fail() -> None:
    old = 'LIBRARY_PATH = "${CUDA_HOME}/lib64/stubs"  # what a user wrote by hand\n'
    assert toolchain_paths(old) == ['LIBRARY_PATH = "${CUDA_HOME}/lib64/stubs"']


def test_release_recipes_dropped_what_kiln_now_provides() -> None:
    repo = Path(__file__).resolve().parents[2]
    for f in sorted((repo / "vendors").glob("*.toml")):
        assert toolchain_paths(f.read_text()) == [], f.name


def test_verify_writes_every_public_recipe_back_as_it_was() -> None:
    """The manifest records a recipe as JSON (unset options null, also inside
    ``[[build.system]]``); verify's workspace writes it as TOML, which has no null."""
    for name, vendor in Workspace(public.WORKSPACE, "sm100").vendors.items():
        recorded = vendor.build.model_dump(mode="json")
        with pytest.raises(tomlkit.exceptions.ConvertError):
            tomlkit.dumps({"build": recorded})  # the control: nulls do not go into TOML
        text = rebuild.vendor_toml({"url": vendor.source.url}, recorded)
        again = type(vendor.build).model_validate(tomlkit.parse(text).unwrap()["build"])
        assert again == vendor.build, name


def test_profiles_choose_flashmlas_archs_through_its_toggles() -> None:
    both = Workspace(public.WORKSPACE).vendors["flashmla"].build
    assert both.archs == ["sm_100f", "sm_90a"] and both.env == {}
    sm100 = Workspace(public.WORKSPACE, "sm100").vendors["flashmla"].build
    assert sm100.archs == ["sm_100f"] and sm100.env == {"FLASH_MLA_DISABLE_SM90": "1"}
    assert Workspace(public.WORKSPACE, "cu132").profile.cuda == "13.2"


def test_a_profile_without_any_of_a_toggled_recipes_archs_is_refused(tmp_path: Path) -> None:
    ws = public.copy_workspace(tmp_path / "ws")
    doc = tomlkit.parse((ws / "kiln.toml").read_text())
    doc["profiles"]["sm103"] = {"archs": ["sm_100a", "sm_103a"]}
    (ws / "kiln.toml").write_text(tomlkit.dumps(doc))
    with pytest.raises(ConfigError, match="none of sm_100f, sm_90a is in the profile's archs"):
        Workspace(ws, "sm103")


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"--profile h100: no \[profiles.h100\].*cu132, sm100"):
        Workspace(public.WORKSPACE, "h100")


def test_bundles_become_bare_mirrors_once(tmp_path: Path) -> None:
    mirrors = public.mirrors(tmp_path / "m")
    rules = Mirrors.load(mirrors)
    repo = Path(rules.map("https://github.com/NVIDIA/cutlass.git"))
    assert (repo / "HEAD").is_file() and (repo / "kiln-bundle.sha256").is_file()
    stamp = (repo / "HEAD").stat().st_mtime_ns
    public.mirrors(tmp_path / "m")  # the same bundles: nothing made again
    assert (repo / "HEAD").stat().st_mtime_ns == stamp


def test_a_missing_bundle_is_named_with_the_fix(tmp_path: Path) -> None:
    from kiln.errors import SourceError
    from kiln.sources import bundles

    src = public.require_bundles()
    partial = tmp_path / "bundles"
    partial.mkdir()
    shutil.copy(src / "FlashMLA.bundle", partial)
    with pytest.raises(SourceError, match=r"bundle \S+cutlass.bundle not found: put it there"):
        bundles.mirrors_from_bundles(public.WORKSPACE, partial, tmp_path / "m")
