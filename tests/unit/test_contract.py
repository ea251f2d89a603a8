"""The host-to-builder contract (kiln/inside/kit/contract.py, issue 56 (1)): every KILN_
name is written there alone (a scan of kiln's source, the issue's own grep), and the
typed values a step is handed write themselves into an environment and read themselves
back (kiln.plan.environment builds them from the recipe: tests/unit/test_archflags.py)."""

from __future__ import annotations

import re
from pathlib import Path

from kiln.inside.kit import contract

KILN = Path(__file__).resolve().parents[2] / "kiln"
_LITERAL = re.compile(r"""["']KILN_""")


def test_no_kiln_name_is_written_outside_the_contract() -> None:
    found = [
        f"{path.relative_to(KILN)}:{n}: {line.strip()}"
        for path in sorted(KILN.rglob("*.py"))
        if path.is_file()
        and path.suffix in (".py", ".sh", ".txt", "")
        and path.name != "contract.py"
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _LITERAL.search(line)
    ]
    assert found == [], "a KILN_ name written outside contract.py:\n" + "\n".join(found)


def test_the_values_a_step_is_handed_round_trip_through_its_environment() -> None:
    archs = contract.Archs(rewrite=("sm_100a", "sm_103a"), built=("sm_100a", "sm_103a"))
    back = contract.Archs.from_env(archs.to_env())
    assert (back.rewrite, back.expect, back.built) == (archs.rewrite, (), archs.built)
    assert contract.Archs.from_env({}).named == ()
    assert contract.Archs(expect=("sm_90a",)).named == ("sm_90a",)
    flags = contract.Flags(nvcc_drop=("-G",), nvcc_append=("-std=c++20",))
    assert flags.to_env() == {contract.NVCC_DROP: "-G", contract.NVCC_APPEND: "-std=c++20"}
    read = contract.Flags.from_env(flags.to_env())
    assert (read.nvcc_drop, read.cxx_append, read.nvcc_append) == (("-G",), (), ("-std=c++20",))
    files = contract.StepFiles(gate_dir="/g", gate_mem_gib=9.5, step_failure="/f.json")
    again = contract.StepFiles.from_env(files.to_env())
    assert (again.gate_dir, again.gate_mem_gib, again.step_failure) == ("/g", 9.5, "/f.json")
    assert again.gate_hints is None and contract.StepFiles.from_env({}).gate_mem_gib == 0.0
