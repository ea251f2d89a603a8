"""Config validation: every malformed input names the file and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kiln.config.locate import key_lines, line_of
from kiln.config.workspace import Workspace, arch_to_torch
from kiln.errors import ConfigError
from tests.conftest import REPO, run_kiln
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


# ----------------------------------------------------------------------- every problem, its line

# A vendor TOML as people write it; {build} is the rest of its [build] table (line 7 on).
DEEPEP = """\
[source]
url = "https://example.invalid/deepep.git"
commit = "{sha}"

[build]
kind = "wheel"
{build}
"""


def deepep(tmp_path: Path, build: str) -> Path:
    ws = write(tmp_path / "ws", {})
    (ws / "vendors" / "deepep.toml").write_text(DEEPEP.format(sha=SHA, build=build))
    return ws


def deepep_error(tmp_path: Path, build: str) -> str:
    with pytest.raises(ConfigError) as info:
        Workspace(deepep(tmp_path, build))
    return str(info.value)


def test_a_misspelt_key_is_named_with_the_nearest_key_and_its_line(tmp_path: Path) -> None:
    """The one mistake is said once: not also as build.arch_control missing."""
    build = 'arch_contrl = "torch-arch-list"\narchs = ["sm_100a"]'
    assert deepep_error(tmp_path, build) == (
        "vendors/deepep.toml: build.arch_contrl: unknown key; did you mean arch_control? (line 7)"
    )


def test_a_wrong_type_says_what_was_expected_and_what_was_given(tmp_path: Path) -> None:
    build = 'arch_control = "hardcoded"\narchs = "sm_100a"\nmax_jobs = "eight"\nkind2 = 1'
    assert deepep_error(tmp_path, build).splitlines() == [
        "vendors/deepep.toml: build.archs: expected a list of strings, "
        'got the string "sm_100a" (line 8)',
        'vendors/deepep.toml: build.max_jobs: expected an integer, got the string "eight" (line 9)',
        "vendors/deepep.toml: build.kind2: unknown key; did you mean kind? (line 10)",
    ]


def test_a_wrong_choice_lists_the_allowed_values(tmp_path: Path) -> None:
    build = 'arch_control = "hardcode"\narchs = ["sm_100a"]'
    assert deepep_error(tmp_path, build) == (
        'vendors/deepep.toml: build.arch_control: expected one of "torch-arch-list", '
        '"hardcoded", "toggles", "rewrite", "none", got the string "hardcode"; did you mean '
        '"hardcoded"? '
        "(line 7)"
    )


def test_every_problem_of_a_file_in_one_run_with_its_line(tmp_path: Path) -> None:
    build = 'arch_contrl = "torch-arch-list"\narchs = ["sm_100a"]\nmax_jobs = "eight"'
    assert deepep_error(tmp_path, build).splitlines() == [
        "vendors/deepep.toml: build.arch_contrl: unknown key; did you mean arch_control? (line 7)",
        'vendors/deepep.toml: build.max_jobs: expected an integer, got the string "eight" (line 9)',
    ]


def test_a_misspelt_key_in_a_list_of_tables(tmp_path: Path) -> None:
    build = """arch_control = "none"

[[build.system]]
header = "infiniband/mlx5dv.h"
package = "libibverbs-dev"

[[build.system]]
heder = "infiniband/verbs.h"
package = "libibverbs-dev"
"""
    assert deepep_error(tmp_path, build) == (
        "vendors/deepep.toml: build.system.1.heder: unknown key; did you mean header? (line 14)"
    )


def test_a_missing_key_names_the_line_of_its_table(tmp_path: Path) -> None:
    assert deepep_error(tmp_path, 'archs = ["sm_100a"]') == (
        "vendors/deepep.toml: build.arch_control: missing required key (line 5)"
    )


def test_a_profile_variant_names_its_line_in_kiln_toml(tmp_path: Path) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(SHA)})
    with (ws / "kiln.toml").open("a") as fh:
        fh.write("\n[profiles.old]\ncuda = 12.9\n")
    lines = (ws / "kiln.toml").read_text().splitlines()
    with pytest.raises(ConfigError) as info:
        Workspace(ws, "old")
    assert str(info.value) == (
        "kiln.toml [profiles.old]: cuda: expected a string, got the number 12.9 "
        f"(line {lines.index('cuda = 12.9') + 1})"
    )


def test_the_locator_finds_keys_where_they_are_written() -> None:
    text = """\
# [not] a = "table"
note = \"\"\"
fake = [1]
\"\"\"
[a]
b.c = 1
list = [
  "x",  # ]
  { k = "y" },
]

[[a.t]]
x = 1
[[a.t]]
"y" = 2
[a.t.sub]
z = 3
"""
    lines = key_lines(text)
    assert "fake" not in {p[0] for p in lines}
    assert lines[("a", "b", "c")] == 6
    assert lines[("a", "list", 0)] == 8 and lines[("a", "list", 1, "k")] == 9
    assert lines[("a", "t", 0, "x")] == 13 and lines[("a", "t", 1, "y")] == 15
    assert lines[("a", "t", 1, "sub", "z")] == 17
    assert line_of(lines, ("a", "t", 1, "nothing")) == 14
    assert line_of(lines, ("nothing",)) is None


# ----------------------------------------------------------------------- through the command line


def test_the_cli_reports_every_problem_with_exit_code_2(tmp_path: Path) -> None:
    build = 'arch_contrl = "torch-arch-list"\narchs = ["sm_100a"]\nmax_jobs = "eight"'
    ws = deepep(tmp_path, build)
    res = run_kiln("build", "--dry-run", "--workspace", ws, cwd=tmp_path)
    assert res.returncode == ConfigError.exit_code == 2, res.stderr
    assert res.stderr.splitlines() == [
        "kiln: error: vendors/deepep.toml: build.arch_contrl: unknown key; "
        "did you mean arch_control? (line 7)",
        'vendors/deepep.toml: build.max_jobs: expected an integer, got the string "eight" (line 9)',
    ]


def test_verbose_shows_kilns_debug_lines_not_its_libraries(tmp_path: Path) -> None:
    """A dry run imports cyclonedx, whose serializer logs ~800 DEBUG lines ("Registering
    ..."); -v shows the commands kiln runs (here the nvcc of a CUDA home), not those."""
    noisy = subprocess.run(
        [
            sys.executable,
            "-c",
            "import logging; logging.basicConfig(level=logging.DEBUG); "
            "import kiln.release.provenance",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Registering" in noisy.stderr  # the library does log at DEBUG on this route
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text(
        "#!/bin/sh\necho 'Cuda compilation tools, release 13.2, V13.2.51'\n"
    )
    (cuda / "bin" / "nvcc").chmod(0o755)
    ws = write(tmp_path / "ws", {"plain": plain_vendor(SHA)})

    def dry_run(*flags: str) -> str:
        res = run_kiln(
            *flags,
            "build",
            "--dry-run",
            "--workspace",
            ws,
            "--cuda-home",
            cuda,
            "--offline",
            "--runner",
            "local",
            "--cache",
            tmp_path / "cache",
            "--work",
            tmp_path / "work",
            "--artifacts",
            tmp_path / "artifacts",
            cwd=tmp_path,
        )
        assert "dry run of test-release" in res.stdout, res.stderr
        return res.stderr

    verbose = dry_run("-v")
    assert f"kiln: $ {cuda}/bin/nvcc --version" in verbose.splitlines()
    assert "Registering" not in verbose
    assert "kiln: $ " not in dry_run() and "kiln: $ " not in dry_run("-q")
