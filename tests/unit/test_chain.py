"""The build's stages are typed end to end (kiln.orchestrate.chain): a chain runs its
stages in order and keeps their names; mypy refuses a stage put where the value before
it is not the one it takes (a real mypy run on a chain of toy stages)."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

from mypy import api

from kiln.orchestrate import stages
from kiln.orchestrate.chain import Chain, Stage


def _said(said: list[str]) -> list[str]:
    return [*said, "said"]


def test_a_chain_runs_its_stages_in_order_and_keeps_their_names() -> None:
    length: Stage[str, int, list[str]] = Stage("length", lambda s, _: len(s), _said)
    double: Stage[int, float, list[str]] = Stage("double", lambda n, _: n * 2.0, _said)
    chain = Chain.of(length).then(double)
    with contextlib.ExitStack() as stack:
        assert chain.does("abc", stack) == 6.0
    assert chain.names == ("length", "double")
    assert [say([]) for say in chain.says] == [["said"], ["said"]]


def test_the_builds_stages_are_named_in_order() -> None:
    assert stages.STAGE_NAMES == (
        "load", "plan", "lock", "inputs", "prepare", "stage", "vendors", "release", "swap_in",
    )  # fmt: skip


_MISLINKED = """
    import contextlib
    from kiln.orchestrate.chain import Chain, Stage

    def length(s: str, stack: contextlib.ExitStack) -> int:
        return len(s)

    def upper(s: str, stack: contextlib.ExitStack) -> str:
        return s.upper()

    def said(x: int) -> int:
        return x

    chain = Chain.of(Stage("length", length, said)).then(Stage("upper", upper, said))
"""


def test_mypy_refuses_a_stage_that_does_not_take_the_value_before_it(tmp_path: Path) -> None:
    snippet = tmp_path / "mislinked.py"
    snippet.write_text(textwrap.dedent(_MISLINKED))
    out, _, rc = api.run(["--no-incremental", "--strict", str(snippet)])
    assert rc == 1, out
    # the upper stage takes a str where length made an int
    assert "mislinked.py:14: error:" in out and 'expected "Callable[[int, ExitStack' in out, out
    fixed = tmp_path / "linked.py"
    fixed.write_text(
        snippet.read_text().replace('Stage("upper", upper', 'Stage("n", lambda n, _: n')
    )
    out, _, rc = api.run(["--no-incremental", "--strict", str(fixed)])
    assert rc == 0, out
