"""``kiln add`` on the public DeepGEMM, DeepEP and FlashMLA (the bundles of
../shared/upstreams, reached through kiln's mirrors): each recipe it writes equals the
hand-written one of examples/public in every key that decides the build
(``tests.public.decisive``). No compile: the builds from these recipes are the
hand-written ones' (`nox -s build_public`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tomlkit

from kiln.cli import main
from kiln.sources.checkout import gitlinks
from kiln.verbs import add as kiln_add
from tests import public


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(an examples/public workspace with no vendors yet, its mirrors file, a git cache)."""
    root = tmp_path_factory.mktemp("add-public")
    ws = root / "ws"
    (ws / "vendors").mkdir(parents=True)
    for name in ("kiln.toml", "bundles.toml"):
        shutil.copyfile(public.WORKSPACE / name, ws / name)
    return ws, public.mirrors(root / "mirrors"), root / "cache"


def _add(scene, python: Path, name: str, profile: str | None = None, ws: Path | None = None):
    default_ws, mirrors, cache = scene
    ws = ws or default_ws
    url, commit = public.PINS[name]
    return kiln_add.add_recipe(
        ws,
        url,
        commit[:9],
        None,
        cache,
        mirrors,
        True,
        True,
        profile=profile,
        python=str(python),
        check=False,  # their first units are CUTLASS kernels: minutes each
    )


@pytest.mark.parametrize("name", sorted(public.PINS))
def test_kiln_add_writes_the_hand_written_recipe(scene, public_python: Path, name: str) -> None:
    added = _add(scene, public_python, name)
    assert added.path.name == f"{name}.toml"
    made = public.recipe(added.path)
    hand = public.recipe(public.WORKSPACE / "vendors" / f"{name}.toml")
    assert public.decisive(made) == public.decisive(hand)
    # Each submodule pinned at the commit the tree records (the hand-written recipes
    # leave that to the tree; `kiln lock` records the same).
    tree_links = gitlinks(_bare(scene, added.findings.url), added.commit)
    assert {s.path: s.commit for s in made.source.submodules} == tree_links


def _bare(scene, url: str) -> Path:
    from kiln.config.mirrors import Mirrors
    from kiln.sources.checkout import GitCache

    _ws, mirrors, cache = scene
    found = GitCache(cache, Mirrors.load(mirrors), True).cached(url)
    assert found is not None
    return found


def test_archs_are_those_every_profile_has(scene, public_python: Path, tmp_path: Path) -> None:
    """DeepEP's archs are the archs all of kiln.toml's profiles have (the sm100 profile
    has no sm_90a; a recipe must load under each). In a workspace with only [profile]
    they are its archs, sm_90a included; sm_100f is left out either way (torch refuses
    family targets in TORCH_CUDA_ARCH_LIST)."""
    ws = tmp_path / "one-profile"
    (ws / "vendors").mkdir(parents=True)
    doc = tomlkit.parse((public.WORKSPACE / "kiln.toml").read_text())
    del doc["profiles"]
    (ws / "kiln.toml").write_text(tomlkit.dumps(doc))
    made = public.decisive(public.recipe(_add(scene, public_python, "deepep", ws=ws).path))
    hand = public.decisive(public.recipe(public.WORKSPACE / "vendors" / "deepep.toml"))
    assert made.pop("build.archs") == ["sm_90a", "sm_100a", "sm_103a"]
    assert hand.pop("build.archs") == ["sm_100a", "sm_103a"]
    assert made == hand


def test_the_command_dry_runs_what_it_wrote(scene, public_python: Path, capsys) -> None:
    ws, mirrors, cache = scene
    url, commit = public.PINS["deepgemm"]
    argv = (
        ["add", f"{url}@{commit[:7]}", "--workspace", str(ws), "--cache", str(cache),
         "--mirrors", str(mirrors), "--offline", "--python", str(public_python),
         "--profile", "sm100", "--force", "--no-check"]
    )  # fmt: skip
    # --no-check: the draft's check compile is DeepGEMM's python_api.cpp, a minute of CPU
    # beside the rest of CI; the checks are held by tests/unit/test_add.py's real compiles
    rc = main(argv)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(ws / "vendors" / "deepgemm.toml")
    assert "dry run of public-upstreams (profile sm100" in out
    assert f"deepgemm @ {commit[:12]}" in out and "nothing to fetch" in out
    assert rc == (9 if "the build would stop" in out else 0)
