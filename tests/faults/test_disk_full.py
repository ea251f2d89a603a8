"""Fault 2, disk full: the release folder sits on a 2 MiB tmpfs that fills while kiln
writes the in-place tarball (6 MiB of incompressible data); then a wheel re-pack into a
full file system. kiln names the disk and the place, and leaves no partial file."""

from __future__ import annotations

import errno
import os
import zipfile
from pathlib import Path

import pytest

from kiln.release import wheelfix
from tests.conftest import artifacts_files
from tests.faults.conftest import build_cli, error_lines, make_tiny, mirrors_file, tiny_workspace


def test_disk_fills_while_packing_the_tarball(tmp_path: Path, small_fs) -> None:
    up = tmp_path / "up"
    commit = make_tiny(up, files={"data/blob.bin": os.urandom(6 << 20)})
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    ws = tiny_workspace(tmp_path / "ws", commit)
    artifacts = small_fs("2m")
    res = build_cli(ws, tmp_path, mirrors, "--offline", artifacts=artifacts)

    assert res.returncode == 13, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    errors = error_lines(res.stderr)
    assert len(errors) == 1 and res.stderr.strip().splitlines()[-1] == errors[0]
    line = errors[0]
    assert line.startswith("kiln: error: disk full: writing "), line
    assert ".tar.zst" in line and f"file system mounted at {artifacts} " in line
    assert "no space left" in line and "and rerun" in line
    # Nothing half-written: no release, no staging folder, no temporary tarball.
    # (.kiln.sources.lock: the workspace lock the lead's scheduler keeps beside the releases.)
    assert [f for f in artifacts_files(artifacts) if f != ".kiln.sources.lock"] == []
    assert not (artifacts / "test-release").exists()
    assert not (artifacts / ".staging").exists()
    # the printed fix applied: --artifacts pointed at a disk with room, and rerun
    assert "(or point --artifacts/--work/--cache at a larger disk) and rerun" in line
    roomy = tmp_path / "roomy"
    res = build_cli(ws, tmp_path, mirrors, "--offline", artifacts=roomy)
    assert res.returncode == 0, res.stderr[-3000:]
    assert list((roomy / "test-release").glob("*.tar.zst"))


def test_wheel_repack_into_a_full_disk_leaves_no_partial_wheel(tmp_path: Path, small_fs) -> None:
    wheel = tmp_path / "big-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("big/blob.bin", os.urandom(3 << 20))
        zf.writestr(
            "big-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: big\nVersion: 1.0\n"
        )
        zf.writestr("big-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        zf.writestr("big-1.0.dist-info/RECORD", "")
    dest = small_fs("1m") / "wheels"
    with pytest.raises(OSError) as info:
        wheelfix.normalize(wheel, "cu130.gabcdef0", 1_767_225_600, dest)
    assert info.value.errno == errno.ENOSPC
    assert list(dest.iterdir()) == []  # the .part file was removed
