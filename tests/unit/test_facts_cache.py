"""The build Python's facts are kept between runs until its install changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kiln.inside import facts


def test_facts_are_reused_until_a_package_is_installed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python, cache = venv / "bin" / "python", tmp_path / "facts"
    first = facts.python_facts(python, cache)
    assert first["torch"] is None
    (saved,) = cache.glob("python-*.json")
    saved.write_text(saved.read_text().replace('"torch": null', '"torch": "from-cache"'))
    assert facts.python_facts(python, cache)["torch"] == "from-cache"  # not probed again
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "newpkg").mkdir()  # an install changes the stamp: probed afresh
    assert facts.python_facts(python, cache)["torch"] is None
