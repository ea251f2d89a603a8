"""kiln's own words go through one channel (kiln/inside/say.py, issue 56 (3)): no other
module of kiln writes to stdout or stderr (an AST scan: print, sys.stdout/stderr.write,
rich's Console on its own stream), and the channel's faces work: results on stdout,
reports and log lines on stderr, GitHub Actions fold groups and workflow commands only
under Actions."""

from __future__ import annotations

import ast
import logging
import threading
from pathlib import Path

import pytest

from kiln.inside import say

KILN = Path(__file__).resolve().parents[2] / "kiln"
# Their own processes' voices, not kiln's host: the compiler kit (copied into trees, run
# as loose files), the shipped stdlib verifier, and the scripts other interpreters run
# whose lines kiln reads back (facts, the PEP 517 hook, the import child) or that run as
# a file (the step's proxy)
OWN_VOICES: tuple[str, ...] = (
    *("inside/kit/", "templates/", "inside/facts.py", "inside/pep517.py"),
    *("inside/import_child.py", "inside/netrefuse.py", "inside/say.py"),
)


def _writes(tree: ast.AST) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (isinstance(f, ast.Name) and f.id in ("print", "Console")) or (
            isinstance(f, ast.Attribute)
            and f.attr == "write"
            and isinstance(f.value, ast.Attribute)
            and f.value.attr in ("stdout", "stderr")
        ):
            found.append(node.lineno)
    return found


def test_no_module_writes_to_the_terminal_but_the_channel() -> None:
    found = []
    for path in sorted(KILN.rglob("*.py")):
        rel = str(path.relative_to(KILN))
        if rel.startswith(OWN_VOICES):
            continue
        lines = _writes(ast.parse(path.read_text()))
        found += [f"{rel}:{n}" for n in lines]
    # the live table and the summary are drawn by rich, on the channel's stream
    allowed = {f for f in found if f.startswith("orchestrate/progress.py:")}
    assert sorted(set(found) - allowed) == [], "written past kiln/inside/say.py"
    text = (KILN / "orchestrate/progress.py").read_text()
    assert text.count("Console(") == text.count("Console(file=say.reports()"), "its own stream"


def test_the_scan_sees_each_way_of_writing() -> None:
    code = "import sys\nprint(1)\nsys.stderr.write('x')\nsys.stdout.write('y')\n'print(2)'\n"
    assert _writes(ast.parse(code)) == [2, 3, 4]


def test_results_reports_and_log_lines(capsys: pytest.CaptureFixture[str]) -> None:
    say.result("/the/release")
    say.report("a difference")
    root = logging.getLogger()
    kept, level = list(root.handlers), root.level  # pytest's own, given back after
    try:
        say.configure_logging(logging.INFO)
        logging.getLogger("kiln.x").info("fetching %s", "u")
    finally:
        root.handlers[:] = kept
        root.setLevel(level)
    out, err = capsys.readouterr()
    assert out == "/the/release\n"
    assert err == "a difference\nkiln: fetching u\n"


def test_fold_groups_and_commands_only_under_actions(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    with say.group("kiln: v: build"):
        say.report("inside")
    say.folded("kiln: v: build", "a log\n")
    say.command("::error::x")
    assert capsys.readouterr() == ("", "inside\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    with say.group("kiln: v: build"):
        say.report("inside")
    say.folded("kiln: w: build", "last line without newline")
    say.command("::error::x")
    out, err = capsys.readouterr()
    assert out == "::error::x\n"
    assert err == (
        "::group::kiln: v: build\ninside\n::endgroup::\n"
        "::group::kiln: w: build\nlast line without newline\n::endgroup::\n"
    )


def test_a_fold_group_of_one_thread_is_never_cut_by_another(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    log = "".join(f"line {i}\n" for i in range(2000))

    def fold(name: str) -> None:
        say.folded(name, log)

    threads = [threading.Thread(target=fold, args=(f"step {n}",)) for n in range(4)]
    threads += [threading.Thread(target=say.report, args=("between",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    err = capsys.readouterr().err
    for n in range(4):
        start = err.index(f"::group::step {n}\n")
        assert err[start:].startswith(f"::group::step {n}\n{log}::endgroup::\n")
