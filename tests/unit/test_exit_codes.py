"""The exit-code table (``kiln/errors.py``, ``kiln --help``) is what the commands return:
each code is either made by a real command here (the cheap ones: a bad option, a broken
workspace, a changed release, a wheel that is not there...) or, where making it needs a
build, a GPU or a signal, raised by kiln's code; and no command returns a number of its
own (only 0 or an error's ``exit_code``)."""

from __future__ import annotations

import ast
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln import errors
from kiln.release import manifest
from tests.conftest import REPO, run_kiln
from tests.releases import tiny_release

KILN = REPO / "kiln"


def changed_release(tmp: Path) -> Path:
    release = tiny_release(tmp / "release")
    (release / "README.md").write_text("# tine\n")
    return release


def broken_workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    shutil.copytree(REPO / "examples" / "demo", ws, ignore=shutil.ignore_patterns("upstreams"))
    (ws / "vendors" / "broken.toml").write_text('[source]\nurl = "x"\n')
    return ws


# code -> a real command that must exit with it (argv made from a temporary folder)
RUNS: dict[int, Callable[[Path], list[str | Path]]] = {
    1: lambda tmp: ["build", "--json"],
    2: lambda tmp: ["plan", "--workspace", broken_workspace(tmp)],
    7: lambda tmp: ["verify-wheel", tmp / "absent.whl", "--archs", "sm_100a"],
    8: lambda tmp: ["manifest", "check", changed_release(tmp) / manifest.FILE_NAME],
    9: lambda tmp: [
        *("build", "--dry-run", "--offline", "--workspace", REPO / "examples" / "demo"),
        *("--cache", tmp / "cache", "--work", tmp / "work", "--artifacts", tmp / "artifacts"),
    ],
    11: lambda tmp: ["rebuild-c", tmp],
    14: lambda tmp: ["publish", tiny_release(tmp / "release"), "--to", "ftp://example.invalid/x"],
    16: lambda tmp: ["gpu-test", tiny_release(tmp / "release")],
}


def _raised(root: Path = KILN) -> set[str]:
    """The names of the errors some module of kiln/ (outside errors.py) raises or makes."""
    names = set()
    for path in root.rglob("*.py"):
        if path == root / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                names.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
            elif isinstance(node, ast.Attribute) and node.attr == "exit_code":
                if isinstance(node.value, ast.Name):
                    names.add(node.value.id)
            elif (
                isinstance(node, ast.keyword)
                and node.arg == "error"
                and isinstance(node.value, ast.Name)
            ):  # proc.run(..., error=BuildError)
                names.add(node.value.id)
    return names


CODES = sorted({code for code, _name, _what in errors.table()})


@pytest.mark.parametrize("code", CODES)
def test_every_exit_code_of_the_table_is_what_a_command_returns(code: int, tmp_path: Path) -> None:
    names = [name for c, name, _ in errors.table() if c == code]
    if code in RUNS:
        res = run_kiln(*RUNS[code](tmp_path), env={"GITHUB_ACTIONS": ""})
        assert res.returncode == code, (res.returncode, res.stderr[-2000:])
        # the one error report; a dry run lists its problems in its plan instead
        assert "kiln: error: " in res.stderr or (code == 9 and "exit code: 9" in res.stdout)
    else:  # a build, a GPU, a full disk or a signal: the error is at least made somewhere
        assert set(names) & _raised(), f"exit {code}: nothing in kiln/ raises {names}"


def test_the_check_above_sees_an_error_nothing_raises(tmp_path: Path) -> None:
    (tmp_path / "errors.py").write_text("class Busy(Exception):\n    exit_code = 15\n")
    (tmp_path / "verb.py").write_text("from errors import Busy\n\nBusy\n")
    assert "Busy" not in _raised(tmp_path)
    (tmp_path / "verb.py").write_text("from errors import Busy\n\nraise Busy('held')\n")
    assert "Busy" in _raised(tmp_path)


def test_manifest_check_and_verify_exit_with_the_manifest_code(tmp_path: Path) -> None:
    """Exit 8, as the table says (they returned 1 before): the differences on stderr,
    then the one error line."""
    release = changed_release(tmp_path)
    res = run_kiln("manifest", "check", release / manifest.FILE_NAME)
    assert res.returncode == errors.ManifestError.exit_code == 8
    assert "README.md: sha256" in res.stderr and "1 file(s) differ" in res.stderr
    rebuilt = tiny_release(tmp_path / "rebuilt")
    res = run_kiln("verify", release / manifest.FILE_NAME, "--rebuilt", rebuilt)
    assert res.returncode == errors.NotReproduced.exit_code == 8, res.stderr
    assert "is NOT reproduced by" in res.stderr
    same = run_kiln("verify", rebuilt / manifest.FILE_NAME, "--rebuilt", rebuilt)
    assert same.returncode == 0 and "reproduced bit for bit" in same.stdout


def _returns(path: Path) -> list[str]:
    """Each ``return`` of a function returning ``int`` that holds a number other than 0:
    an exit code of its own, not one of the table's (``<Error>.exit_code``)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef) or node.returns is None:
            continue
        if ast.unparse(node.returns) != "int":
            continue
        for ret in ast.walk(node):
            if isinstance(ret, ast.Return) and ret.value is not None:
                numbers = [
                    n.value
                    for n in ast.walk(ret.value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, int)
                ]
                if any(n != 0 for n in numbers):
                    bad.append(f"{path.name}:{ret.lineno}: return {ast.unparse(ret.value)}")
    return bad


def test_commands_return_only_zero_or_an_errors_code() -> None:
    found = [b for p in sorted((KILN / "commands").glob("*.py")) for b in _returns(p)]
    assert found + _returns(KILN / "cli.py") == []


def test_the_return_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "verb.py"
    bad.write_text("def execute(args) -> int:\n    if args:\n        return 1\n    return 0\n")
    assert _returns(bad) == ["verb.py:3: return 1"]


def test_an_error_is_complete_when_made_and_never_changed_once_raised() -> None:
    """Issue 42 (3): an error's output, failure record and OOM flag are given when it is
    made; the pipeline's message with the other steps' failures added is a new error of
    the same class, the step's own left as it was raised."""
    record: errors.FailureRecord = {"vendor": "v", "log": "v-build.log"}
    err = errors.BuildError("v: compile failed", output="nvcc said", record=record, oom=True)
    longer = errors.with_message(err, "v: compile failed\nw: not built: v failed")
    assert str(err) == "v: compile failed"
    assert type(longer) is errors.BuildError and longer.exit_code == 6
    assert str(longer).endswith("w: not built: v failed")
    assert (longer.output, longer.record, longer.oom) == ("nvcc said", record, True)
    fetch = errors.FetchFailed("no such commit", refused_sha=True)
    assert errors.with_message(fetch, "no such commit; tried refs").refused_sha
