"""The command line explains itself: --version, help for every option with its default,
examples and the exit-code table, -v/-q anywhere (each test fails without its feature)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from kiln import __version__, cli
from kiln.errors import table
from tests.conftest import run_kiln


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_version_names_kiln_and_its_git_commit() -> None:
    res = run_kiln("--version")
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    assert re.fullmatch(rf"kiln {re.escape(__version__)} \(git [0-9a-f]{{12}}(-dirty)?\)", line), (
        line
    )


def test_every_option_of_every_command_has_help_and_its_default() -> None:
    missing, no_default = [], []
    for name, sub in _subparsers(cli.parser()).items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            flag = f"{name} {action.option_strings[-1]}"
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(flag)
                continue
            default = action.default
            shown = default not in (None, False, argparse.SUPPRESS, [], ())
            if shown and "default" not in action.help and "%(default)" not in action.help:
                no_default.append(f"{flag} (default {default!r})")
    assert not missing, f"options without help: {missing}"
    assert not no_default, f"options whose help hides their default: {no_default}"


def test_help_has_examples_and_every_exit_code() -> None:
    res = run_kiln("--help")
    assert res.returncode == 0
    assert "examples:" in res.stdout and "kiln build --dry-run" in res.stdout
    for code, name, _what in table():
        assert re.search(rf"^\s+{code}\s+{name}:", res.stdout, re.M), f"exit {code} {name}"
    assert "internal" not in res.stdout.split("examples:")[0].lower()


@pytest.mark.parametrize(
    "argv",
    [["-v", "manifest", "schema"], ["manifest", "-v", "schema"], ["manifest", "schema", "-q"]],
)
def test_verbosity_is_accepted_before_and_after_the_command(argv: list[str]) -> None:
    """A command that runs (no --help: argparse exits 0 at --help before it reports an
    unknown option, so a parser without -v would pass)."""
    res = run_kiln(*argv)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["title"]  # the schema, printed: the command ran


def test_an_unknown_option_is_refused_where_verbosity_is_accepted() -> None:
    """The check above can fail: the same places with an option kiln lacks exit 2."""
    for argv in (["-x", "manifest", "schema"], ["manifest", "schema", "--loud"]):
        res = run_kiln(*argv)
        assert res.returncode == 2 and "unrecognized arguments" in res.stderr, res.stderr


def test_verbose_after_the_command_is_not_undone_by_its_absent_default() -> None:
    args = cli.parser().parse_args(["-v", "manifest", "schema"])
    assert getattr(args, "verbose", False) is True
    args = cli.parser().parse_args(["manifest", "schema", "-v"])
    assert getattr(args, "verbose", False) is True


def test_json_without_dry_run_is_refused() -> None:
    res = run_kiln("build", "--json")
    assert res.returncode != 0
    assert "--json" in res.stderr and "--dry-run" in res.stderr


def test_in_github_actions_an_error_is_an_annotation(tmp_path) -> None:
    res = run_kiln("manifest", "check", tmp_path / "missing.json", env={"GITHUB_ACTIONS": "true"})
    assert res.returncode != 0
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("::error ")]
    assert line.startswith("::error title=kiln%3A ") and "missing.json" in line
    plain = run_kiln("manifest", "check", tmp_path / "missing.json", env={"GITHUB_ACTIONS": ""})
    assert "::error" not in plain.stdout


def test_step_summary_gets_the_build_table(tmp_path, monkeypatch) -> None:
    from kiln.orchestrate import github

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    github.write_step_summary("kiln build summary", ("step", "state"), [("a|b", "built")])
    text = summary.read_text()
    assert "### kiln build summary" in text and "| a\\|b | built |" in text
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    github.write_step_summary("nothing", ("x",), [("y",)])  # no variable: no file touched
    assert summary.read_text() == text
