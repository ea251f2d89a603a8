"""Fault 6: a patch and a vendor TOML are edited while a build runs. The run uses the
versions it read at its start, records them, and says the files changed."""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
import time
from pathlib import Path

import tomlkit
import zstandard

from tests.conftest import start_kiln_until, step_marker
from tests.faults.conftest import (
    FAULT_PROFILE,
    make_tiny,
    mirrors_file,
    tiny_build_args,
    tiny_vendor,
)
from tests.workspace import write

# The first vendor's build holds the run until the test has edited the inputs.
HOLD = (
    "import os, sys, time; open(sys.argv[1], 'w').close()\n"
    "while not os.path.exists(sys.argv[2]): time.sleep(0.05)\n"
    "import subprocess; subprocess.check_call([sys.executable, 'build.py'])"
)


def _patch(text: str) -> str:
    return (
        "diff --git a/patched.txt b/patched.txt\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/patched.txt\n@@ -0,0 +1 @@\n+{text}\n"
    )


def _member(tarball: Path, name: str) -> bytes:
    with zstandard.open(tarball, "rb") as fh, tarfile.open(fileobj=fh, mode="r|") as tar:
        for info in tar:
            if info.name == name:
                data = tar.extractfile(info)
                assert data is not None
                return data.read()
    raise AssertionError(f"{name} not in {tarball}")


def test_inputs_edited_mid_run_are_not_mixed_in(tmp_path: Path) -> None:
    up = tmp_path / "up"
    commit = make_tiny(up)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    started, go = step_marker(tmp_path, "started"), step_marker(tmp_path, "go")
    first = tiny_vendor(commit, command=[sys.executable, "-c", HOLD, str(started), str(go)])
    second = tiny_vendor(commit, after=["first"], env={"SETTING": "original"})
    ws = write(tmp_path / "ws", {"first": first, "second": second}, profile=FAULT_PROFILE)
    patch = ws / "patches" / "second.patch"
    patch.write_text(_patch("version one"))
    (ws / "patches" / "series.toml").write_text(
        'tags = { second = "edit" }\n[[patch]]\nfile = "second.patch"\ntarget = "second"\n'
    )
    original = hashlib.sha256(patch.read_bytes()).hexdigest()

    kiln = start_kiln_until(started, *tiny_build_args(ws, tmp_path, mirrors, "--offline"))
    patch.write_text(_patch("version two"))  # edited while "first" builds...
    toml = ws / "vendors" / "second.toml"
    data = tomlkit.parse(toml.read_text())
    data["build"]["env"]["SETTING"] = "edited"
    toml.write_text(tomlkit.dumps(data))
    # a vendor added meanwhile (issue 35): not an input of this build, no warning
    (ws / "vendors" / "third.toml").write_text((ws / "vendors" / "first.toml").read_text())
    (ws / "patches" / "unrelated.patch").write_text(_patch("another vendor's"))
    time.sleep(0.2)
    go.touch()  # ...and only then does "second" start
    _, err = kiln.communicate(timeout=300)
    assert kiln.returncode == 0, err[-2000:]

    release = tmp_path / "artifacts" / "test-release"
    made = json.loads((release / "manifest.json").read_text())
    entry = made["vendors"]["second"]
    assert entry["patches"][0]["sha256"] == original
    assert entry["environment"]["SETTING"] == "original"
    assert (release / "patches" / "second.patch").read_text() == _patch("version one")
    (tarball,) = [o for o in entry["outputs"] if o["kind"] == "tarball"]
    assert _member(release / tarball["path"], "second/patched.txt") == b"version one\n"
    warned = " ".join(made["warnings"])
    assert "patches/second.patch changed while this build ran" in warned
    assert "vendors/second.toml changed while this build ran" in warned
    assert "patches/second.patch changed while this build ran" in err
    assert "third.toml" not in warned and "third.toml" not in err
    assert "unrelated.patch" not in warned and len(made["warnings"]) == 2, made["warnings"]
