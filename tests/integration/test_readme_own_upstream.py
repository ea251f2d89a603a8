"""README's "Build your own upstream", word for word: its shell block is run by bash as
written, on a fixture upstream no other test uses (tests/ownext.py: a hard-coded
``-gencode`` list from sm_75 to sm_120 plus PTX, a submodule, a BSD-2-Clause license).
What the block cannot say in its own words comes from the environment, as README tells a
user behind a firewall: ``KILN_MIRRORS`` (the fixture's URL is not on any network),
``KILN_BUILD_PYTHON`` (the session's torch venv) and ``KILN_CACHE_DIR``."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from kiln.verify.binaries import device_archs
from tests import ownext
from tests.conftest import REPO, shared_cache


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Build your own upstream") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README: no sh block under its own-upstream heading"
    return block.group(1)


def test_the_readme_builds_a_new_upstream_with_exactly_the_profiles_archs(
    tmp_path: Path, build_python: Path
) -> None:
    upstream = ownext.make(tmp_path / "upstreams")
    bin_dir = tmp_path / "bin"  # `kiln`, as `pip install kiln` puts it on PATH
    bin_dir.mkdir()
    shim = bin_dir / "kiln"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kiln "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "KILN_MIRRORS": str(upstream.mirrors),
        "KILN_BUILD_PYTHON": str(build_python),
        "KILN_CACHE_DIR": str(shared_cache(tmp_path / "cache")),
    }
    res = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_block()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-5000:])

    ws = tmp_path / "my-kernels"
    recipe_text = (ws / "vendors" / "normext.toml").read_text()
    recipe = tomllib.loads(recipe_text)
    assert recipe["source"]["commit"] == upstream.commits[-1]
    assert recipe["source"]["license_id"] == "BSD-2-Clause", recipe_text
    assert [s["path"] for s in recipe["source"]["submodules"]] == ["third_party/mathlib"]
    assert recipe["build"]["arch_control"] == "rewrite", recipe_text
    assert "-gencode" in recipe_text  # the comment names what kiln found in setup.py

    wheels = sorted((ws / "artifacts" / "my-kernels" / "wheels").glob("normext-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        [so] = [n for n in zf.namelist() if n.startswith("normext/_kernels") and n.endswith(".so")]
        (tmp_path / "kernels.so").write_bytes(zf.read(so))
    # cuobjdump on the shipped .so: the profile's archs, not the eight setup.py asked for
    assert device_archs(tmp_path / "kernels.so") == (["sm_100a", "sm_103a"], [])
    assert "verify-wheel" in res.stdout + res.stderr or "normext" in res.stdout
