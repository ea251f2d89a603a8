"""A compiler that cannot write its output (issue 41: "fatal error: when writing output to
.../x.cpp4.ii: Invalid argument", the disk filling during a 20-minute build) is a first
error with a cause, not a traceback with ``cause: null``; the free space where it wrote
is named. The outputs are real g++ runs, the error buried under a long build's lines."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kiln.inside import diagnose
from tests import require


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
    assert d.cause.fix.startswith("free space there, or point --work at a disk with room")
    assert "compiler cache" not in d.cause.fix  # no compiler cache in this step's env


def _mounted(where: Path, *options: str) -> None:
    res = subprocess.run(["mount", *options, str(where)], capture_output=True, check=False)
    if res.returncode:
        require.missing("ROOT", "cannot mount here (not root)")


def test_a_read_only_tmpdir_is_named_with_the_folder_and_the_fix(tmp_path: Path) -> None:
    """Issue 55 (5): nvcc's temporary files in a read-only TMPDIR ("nvcc fatal: Could not
    open output file '/x/tmpxft_...'", no reason given): the row says the folder is on a
    read-only file system and the fix points TMPDIR elsewhere, which compiles."""
    ro = tmp_path / "ro"
    ro.mkdir()
    _mounted(ro, "--bind", str(ro))
    try:
        _mounted(ro, "-o", "remount,bind,ro")
        (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
        nvcc = ["/usr/local/cuda/bin/nvcc", "-c", "k.cu", "-o", "k.o", "-arch=sm_100a"]
        env = {**os.environ, "TMPDIR": str(ro)}
        res = subprocess.run(nvcc, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert res.returncode != 0
        d = diagnose.diagnose(res.stdout + res.stderr, tmp_path, {"TMPDIR": str(ro)}, "v")
        assert d.cause is not None and d.cause.row == "compiler-cannot-write", d
        assert f"its temporary files (TMPDIR: {ro})" in d.cause.cause
        assert "(a read-only file system)" in d.cause.cause
        assert d.cause.fix.startswith("point TMPDIR at a writable folder with room")
        roomy = tmp_path / "tmp"
        roomy.mkdir()
        fixed = subprocess.run(nvcc, cwd=tmp_path, env={**env, "TMPDIR": str(roomy)})
        assert fixed.returncode == 0 and (tmp_path / "k.o").is_file()
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_link_into_a_full_disk_shows_lds_words_and_the_disk_full_row(tmp_path: Path) -> None:
    """ld's "final link failed: No space left on device" is a first error (the screen
    said "(no compiler or linker error found)"), and the row quotes it."""
    full = tmp_path / "full"
    full.mkdir()
    _mounted(full, "-t", "tmpfs", "-o", "size=64k", "tmpfs")
    try:
        (full / "filler").write_bytes(b"\0" * 60 * 1024)
        src = tmp_path / "big.cpp"
        src.write_text("".join(f"int f{i}() {{ return {i}; }}\n" for i in range(4000)))
        subprocess.run(["g++", "-c", "-fPIC", str(src), "-o", str(tmp_path / "big.o")], check=True)
        res = subprocess.run(
            ["g++", "-shared", str(tmp_path / "big.o"), "-o", str(full / "big.so")],
            capture_output=True, text=True,
        )  # fmt: skip
        assert res.returncode != 0
        d = diagnose.diagnose(res.stderr, tmp_path, {}, "v")
        assert [e.render() for e in d.errors][:1] == [
            "final link failed: No space left on device"
        ], d.errors
        assert d.cause is not None and d.cause.row == "disk-full", d.cause
        assert "(/usr/bin/ld: final link failed: No space left on device)" in d.cause.cause
    finally:
        subprocess.run(["umount", str(full)], check=False)
