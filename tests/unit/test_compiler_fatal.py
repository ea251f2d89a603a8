"""A compiler that cannot write its output (issue 41: "fatal error: when writing output to
.../x.cpp4.ii: Invalid argument", the disk filling during a 20-minute build) is a first
error with a cause, not a traceback with ``cause: null``; the free space where it wrote
is named. The outputs are real g++ runs, the error buried under a long build's lines."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kiln.inside import diagnose


def _gxx(tmp_path: Path, *args: str) -> str:
    (tmp_path / "t.cpp").write_text("int main() { return 0; }\n")
    res = subprocess.run(["g++", *args], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert res.returncode != 0
    return res.stderr


@pytest.mark.parametrize(
    ("args", "first", "cause"),
    [
        (
            ["-E", "t.cpp", "-o", "/dev/full"],
            "<built-in>: fatal error: when writing output to /dev/full: No space left on device",
            "could not write its output: /dev/full (No space left on device); the file system "
            "there has ",
        ),
        (
            ["-c", "t.cpp", "-o", "/proc/kiln-t.o"],
            "as: fatal error: can't create /proc/kiln-t.o: No such file or directory",
            "could not write its output: /proc/kiln-t.o (No such file or directory); the file "
            "system there has ",
        ),
    ],
    ids=["preprocessor", "assembler"],
)
def test_a_compiler_that_cannot_write_is_the_first_error_with_the_free_space(
    tmp_path: Path, args: list[str], first: str, cause: str
) -> None:
    fatal = _gxx(tmp_path, *args)
    before = "".join(f"[{i}/3000] compiling csrc/k{i}.cu\n" for i in range(2260))
    output = before + fatal + "ninja: build stopped: subcommand failed.\n" + "x\n" * 40
    d = diagnose.diagnose(output, tmp_path, {}, "v")
    assert [e.render() for e in d.errors][:1] == [first], d.errors
    assert d.cause is not None and d.cause.row == "compiler-cannot-write", d.cause
    assert cause in d.cause.cause and " MiB free of " in d.cause.cause
    assert "point TMPDIR" in d.cause.fix
