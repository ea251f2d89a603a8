"""normalize() writes the same bytes whatever compression its input used: the repaired
wheel in between is written uncompressed (``auditwheel repair -z 0``) to save a pass."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from kiln.errors import BuildError
from kiln.release import wheelfix

MEMBERS = {
    "demo/__init__.py": b"from demo._C import *\n" * 50,
    "demo/_C.so": bytes(range(256)) * 400,
    "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n",
    "demo-1.0.dist-info/RECORD": b"",
}


def _wheel(path: Path, compression: int) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in MEMBERS.items():
            zf.writestr(name, data)
    return path


def test_normalize_gives_the_same_bytes_from_a_stored_or_a_deflated_wheel(tmp_path: Path) -> None:
    name = "demo-1.0-cp311-cp311-linux_x86_64.whl"
    (tmp_path / "stored").mkdir()
    (tmp_path / "deflated").mkdir()
    stored = _wheel(tmp_path / "stored" / name, zipfile.ZIP_STORED)
    deflated = _wheel(tmp_path / "deflated" / name, zipfile.ZIP_DEFLATED)
    assert stored.read_bytes() != deflated.read_bytes()  # the inputs differ: the check can fail
    made = [
        wheelfix.normalize(w, "cu130.gabcdef0", 1_767_225_600, tmp_path / f"out-{w.parent.name}")
        for w in (stored, deflated)
    ]
    assert made[0].name == made[1].name == "demo-1.0+cu130.gabcdef0-cp311-cp311-linux_x86_64.whl"
    assert made[0].read_bytes() == made[1].read_bytes()
    with zipfile.ZipFile(made[0]) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}


AUDITWHEEL_A = """
x-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl is
consistent with the following platform tag: "manylinux_2_34_x86_64".

The wheel references external versioned symbols in these
system-provided shared libraries: libgcc_s.so.1 with versions
{'GCC_3.0'}, libc.so.6
with versions {'GLIBC_2.17', 'GLIBC_2.34', 'GLIBC_2.2.5',
'GLIBC_2.14'}
"""
AUDITWHEEL_B = AUDITWHEEL_A.replace(
    "{'GLIBC_2.17', 'GLIBC_2.34', 'GLIBC_2.2.5',\n'GLIBC_2.14'}",
    "{'GLIBC_2.14', 'GLIBC_2.2.5',\n'GLIBC_2.34', 'GLIBC_2.17'}",
)


def test_auditwheels_answer_is_the_same_text_for_the_same_wheel() -> None:
    """Issue 41: the manifest carries auditwheel show's text, which prints Python sets (an
    order of their own in every process): two identical builds gave two manifests."""
    from kiln.verify.binaries import stable_auditwheel

    assert AUDITWHEEL_A != AUDITWHEEL_B
    a, b = stable_auditwheel(AUDITWHEEL_A), stable_auditwheel(AUDITWHEEL_B)
    assert a == b
    assert "{'GLIBC_2.14', 'GLIBC_2.17', 'GLIBC_2.2.5', 'GLIBC_2.34'}" in a
    assert a.split("\n\n")[0].startswith(
        "x-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl is consistent"
    )


def _linked_wheel(tmp: Path) -> tuple[Path, Path]:
    """A wheel whose extension links ``libkilnabsent.so`` from a folder of its own (real
    gcc), and that folder."""
    libs = tmp / "libs"
    libs.mkdir()
    (libs / "absent.c").write_text("int kiln_absent(void) { return 1; }\n")
    (tmp / "ext.c").write_text("int kiln_absent(void);\nint use(void) { return kiln_absent(); }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", libs / "libkilnabsent.so", libs / "absent.c"], check=True
    )
    ext = tmp / "ext.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", ext, tmp / "ext.c", f"-L{libs}", "-lkilnabsent"],
        check=True,
    )
    wheel = tmp / "dist" / "pkg-1.0-cp311-cp311-linux_x86_64.whl"
    wheel.parent.mkdir()
    info = "pkg-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(ext, "pkg/_ext.cpython-311-x86_64-linux-gnu.so")
        zf.writestr("pkg/__init__.py", "")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
        zf.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
            "Tag: cp311-cp311-linux_x86_64\n",
        )
        names = [*zf.namelist(), f"{info}/RECORD"]
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in names))
    return wheel, libs


def test_a_library_found_nowhere_to_ship_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    """missing-library's next state: a library the recipe linked from its own folder is
    grafted from there; without the folder, the repair says which library and the fix (not
    auditwheel's traceback)."""
    wheel, libs = _linked_wheel(tmp_path)
    with pytest.raises(BuildError) as refused:
        wheelfix.repair(wheel, 0, tmp_path / "out", "mylib")
    message = str(refused.value)
    assert "links libkilnabsent.so, which no wheel it requires provides" in message
    assert "fix: put the folder holding libkilnabsent.so in build.env LIBRARY_PATH of " in message
    assert "vendors/mylib.toml" in message and "Traceback" not in message
    assert wheelfix.library_dirs({"LIBRARY_PATH": f"{libs}:$HOME/x:rel"}) == [str(libs)]
    repaired = wheelfix.repair(wheel, 0, tmp_path / "out2", "mylib", [str(libs)])
    with zipfile.ZipFile(repaired) as zf:
        assert any("libkilnabsent" in n for n in zf.namelist()), zf.namelist()
