"""Each option is declared once (kiln/commands/flags.py): the parser, --help, the
build's Options and docs/options.md all come from the declarations; every build option
has a KILN_* variable; the command line wins over the variable, the variable over the
default; the cache lies in the user's cache folder."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from kiln import cli
from kiln.commands import build, docs
from kiln.commands import flags as o
from kiln.errors import ConfigError
from kiln.fsutil import user_cache_dir
from kiln.orchestrate.options import Option, Options
from tests.conftest import REPO, run_kiln

# Options fields no option fills: the vendors are build's positional arguments; the live
# table follows the terminal; signed_by (and a keyless signer's signer_identity, a key's
# signer_scheme) is the keyid
# a rebuild of a signed release writes its files with (kiln verify sets it from the
# manifest, no key at hand).
NOT_OPTIONS = {"vendors", "live", "signed_by", "signer_identity", "signer_scheme"}


def parse(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    args = cli.parser().parse_args(argv)
    o.resolve(args, env or {})
    return args


def test_docs_options_md_is_the_generated_table() -> None:
    committed = (REPO / "docs" / "options.md").read_text()
    assert committed == docs.options_markdown(), (
        "docs/options.md is stale: python -m kiln.commands.docs > docs/options.md"
    )
    for opt in o.BUILD:
        assert f"`{opt.env}`" in committed and f"`{opt.flag}" in committed


def test_every_build_option_has_its_variable_and_fills_one_field() -> None:
    envs = [opt.env for opt in o.BUILD]
    assert all(e and e.startswith("KILN_") for e in envs), [opt.flag for opt in o.BUILD]
    assert len(set(envs)) == len(envs)
    fields = [opt.field for opt in o.BUILD if opt.field]
    assert len(set(fields)) == len(fields)
    assert set(fields) == {f.name for f in dataclasses.fields(Options)} - NOT_OPTIONS


def test_each_build_default_is_written_once_on_its_field() -> None:
    """Issue 36: the options dataclass is the declarations (no second, hand-written copy):
    an option the command line leaves out gives exactly the field's default."""
    parser = argparse.ArgumentParser()
    o.add(parser, *o.BUILD)
    args = parser.parse_args([])
    o.resolve(args, environ={})
    assert o.to_options(args) == Options()
    source = (REPO / "kiln" / "commands" / "flags.py").read_text()
    for opt in o.BUILD:
        assert f'FIELD_OPTIONS["{opt.field}"]' in source  # declared on the field, not here


def test_no_two_declarations_share_a_variable_by_accident() -> None:
    declared = [v for v in vars(o).values() if isinstance(v, Option)]
    by_env: dict[str, set[str]] = {}
    for opt in declared:
        if opt.env:
            by_env.setdefault(opt.env, set()).add(opt.flag)
    assert {e: f for e, f in by_env.items() if len(f) > 1} == {}  # one flag per variable


def test_help_shows_each_options_default_and_variable() -> None:
    res = run_kiln("build", "--help")
    text = " ".join(res.stdout.split())
    for opt in o.BUILD:
        assert f"${opt.env}" in text, opt.flag
    assert "(default: $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; $KILN_CACHE_DIR)" in text
    assert "(default: off; $KILN_OFFLINE=1)" in text


def test_every_option_given_fills_options(tmp_path: Path) -> None:
    """A value for every build option on the command line: each one lands in its field."""
    argv = ["build", "v1", "v2", "--docker-mount", "/a:/a", "--docker-mount", "/b"]
    given = {
        "--workspace": "ws",
        "--profile": "p",
        "--artifacts": "a",
        "--cache": "c",
        "--work": "w",
        "--mirrors": "m.toml",
        "--python": "py",
        "--cuda-home": "/cuda",
        "--toolchain": "pypi",
        "--runner": "docker",
        "--image": "img",
        "--docker-dir": "d",
        "--mem-limit": "1.5",
        "--jobs": "3",
        "--mem-budget": "9",
        "--compiler-cache": "cc",
        "--compiler-cache-backend": "sccache",
        "--cache-store": "redis://h:1",
        "--distribute": "http://s",
        "--artifact-cache": "ac",
    }
    flags = ["--offline", "--allow-unpinned-image", "--keep-container", "--no-compiler-cache"]
    flags += ["--no-artifact-cache", "--wait"]
    args = parse([*argv, *(x for kv in given.items() for x in kv), *flags])
    opts = build.options(args, vendors=tuple(args.vendor))
    assert opts == Options(
        workspace=Path("ws"),
        vendors=("v1", "v2"),
        profile="p",
        artifacts=Path("a"),
        cache=Path("c"),
        work=Path("w"),
        mirrors=Path("m.toml"),
        offline=True,
        python="py",
        cuda_home="/cuda",
        runner="docker",
        image="img",
        allow_unpinned_image=True,
        docker_dir=Path("d"),
        docker_mounts=("/a:/a", "/b"),
        mem_limit_gib=1.5,
        toolchain="pypi",
        jobs=3,
        mem_budget_gib=9.0,
        compiler_cache=Path("cc"),
        no_compiler_cache=True,
        cache_backend="sccache",
        cache_store="redis://h:1",
        distribute="http://s",
        artifact_cache=False,
        artifact_cache_dir=Path("ac"),
        wait=True,
        keep_container=True,
    )


def test_command_line_beats_variable_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    default = build.options(parse(["build"]))
    assert default.jobs is None and default.offline is False and default.docker_mounts == ()
    assert default.runner == "auto" and default.artifact_cache is True
    assert default.cache == Path("/xdg/kiln")
    env = {
        "KILN_JOBS": "3",
        "KILN_OFFLINE": "yes",
        "KILN_RUNNER": "local",
        "KILN_DOCKER_MOUNTS": "/a:/a:ro '/b c'",
        "KILN_NO_ARTIFACT_CACHE": "1",
        "KILN_CACHE_DIR": "/var/kiln",
        "KILN_WORK": "",  # empty: unset
    }
    from_env = build.options(parse(["build"], env))
    assert (from_env.jobs, from_env.offline, from_env.runner) == (3, True, "local")
    assert from_env.docker_mounts == ("/a:/a:ro", "/b c") and from_env.artifact_cache is False
    assert from_env.cache == Path("/var/kiln") and from_env.work == Path("build/work")
    argv = ["build", "--jobs", "5", "--runner", "docker", "--docker-mount", "/d", "--cache", "x"]
    given = build.options(parse(argv, env))
    assert (given.jobs, given.runner, given.docker_mounts) == (5, "docker", ("/d",))
    assert given.cache == Path("x") and given.offline is True  # the variable still counts
    off = build.options(parse(["build"], {**env, "KILN_OFFLINE": "0"}))
    assert off.offline is False


def test_demo_keeps_its_own_workspace_and_toolchain() -> None:
    env = {"KILN_WORKSPACE": "elsewhere", "KILN_TOOLCHAIN": "system"}
    args = parse(["demo"], env)
    assert args.workspace == Path("examples/demo") and args.toolchain == "pypi"
    assert parse(["build"], env).workspace == Path("elsewhere")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KILN_JOBS": "many"}, "$KILN_JOBS='many': not a whole number (--jobs N)"),
        ({"KILN_MEM_BUDGET": "lots"}, "$KILN_MEM_BUDGET='lots': not a number"),
        ({"KILN_RUNNER": "podman"}, "not one of auto, local, docker (--runner)"),
        ({"KILN_OFFLINE": "maybe"}, "$KILN_OFFLINE='maybe': not a flag value"),
    ],
)
def test_a_variable_that_does_not_parse_is_a_config_error(env: dict, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(["build"], env)
    assert named in str(err.value)


def test_a_bad_variable_stops_only_the_commands_that_read_it(tmp_path: Path) -> None:
    res = run_kiln("build", "--dry-run", env={"KILN_JOBS": "many"})
    assert res.returncode == 2 and "kiln: error: $KILN_JOBS='many'" in res.stderr
    assert res.stdout == ""
    res = run_kiln("manifest", "schema", env={"KILN_JOBS": "many"})
    assert res.returncode == 0, res.stderr


def test_the_cache_lies_in_the_users_cache_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert user_cache_dir() == tmp_path / ".cache" / "kiln"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the spec: absolute only
    assert user_cache_dir() == tmp_path / ".cache" / "kiln"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "kiln"
    assert Options(workspace=Path(".")).cache == tmp_path / "xdg" / "kiln"
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    assert parse(["lock"]).cache == tmp_path / "xdg" / "kiln"
    assert parse(["lock"], {"KILN_CACHE_DIR": "/c"}).cache == Path("/c")
