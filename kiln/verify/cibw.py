"""The ``[tool.cibuildwheel]`` table of kiln's pyproject.toml, checked against the profile.

cibuildwheel builds one vendor wheel the standard way (docs/ci.md says when to prefer it
to ``build_all``). Its settings are derived from ``kiln.toml``: the profile's CPython on
the profile's platform only, the profile's builder image as the manylinux image, kiln's
``verify-wheel`` as the test command, and an ``auditwheel repair`` that never grafts torch
or CUDA libraries into the wheel (they come from torch and the driver at run time).
:func:`problems` says where the table and the profile disagree, so a profile change that
the table does not follow fails the tests.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from kiln.config.models import Profile
from kiln.config.workspace import Workspace
from kiln.toolchain.provided import PROVIDED_AT_RUN_TIME

# Libraries a CUDA wheel links against but must never carry (auditwheel --exclude globs).
EXCLUDES = PROVIDED_AT_RUN_TIME


def machine(profile: Profile) -> str:
    return profile.platform.split("_", 1)[1]  # linux_x86_64 -> x86_64


def identifier(profile: Profile) -> str:
    """cibuildwheel's build identifier for the profile: ``cp312-manylinux_x86_64``."""
    return f"{profile.python_tag}-manylinux_{machine(profile)}"


def table(pyproject: Path) -> dict[str, Any]:
    with pyproject.open("rb") as fh:
        found = tomllib.load(fh).get("tool", {}).get("cibuildwheel", {})
    return found if isinstance(found, dict) else {}


def problems(pyproject: Path, ws: Workspace) -> list[str]:
    """Every way ``[tool.cibuildwheel]`` in ``pyproject`` departs from the profile."""
    cfg = table(pyproject)
    if not cfg:
        return [f"{pyproject}: no [tool.cibuildwheel] table"]
    p, found = ws.profile, []
    arch = machine(p)
    want = {
        "build": identifier(p),
        f"manylinux-{arch}-image": p.image,
    }
    for key, value in want.items():
        if cfg.get(key) != value:
            found.append(
                f"tool.cibuildwheel.{key} is {cfg.get(key)!r}, the profile in kiln.toml "
                f"implies {value!r}"
            )
    archs = cfg.get("linux", {}).get("archs", cfg.get("archs"))
    if archs != [arch]:
        found.append(f"tool.cibuildwheel.linux.archs is {archs!r}, the profile implies [{arch!r}]")
    repair = " ".join(_as_list(cfg.get("repair-wheel-command")))
    missing = [g for g in EXCLUDES if f"--exclude '{g}'" not in repair]
    if "auditwheel repair" not in repair or missing:
        found.append(
            "tool.cibuildwheel.repair-wheel-command must run auditwheel repair with "
            f"--exclude for {', '.join(missing or EXCLUDES)}"
        )
    test = " ".join(_as_list(cfg.get("test-command")))
    if "-m kiln verify-wheel {wheel}" not in test:
        found.append(
            "tool.cibuildwheel.test-command must run `python -m kiln verify-wheel {wheel}`"
        )
    return found


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
