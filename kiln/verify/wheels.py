"""``kiln verify-wheel``: kiln's wheel verification on wheels built elsewhere.

cibuildwheel's ``test-command`` (a wheel built the standard way, checked against the
profile and a vendor's recipe). A release's wheels read again: ``kiln/verbs/wheel_check.py``.
"""

from __future__ import annotations

from pathlib import Path

from kiln.config.models import Profile
from kiln.config.workspace import Workspace
from kiln.errors import VerifyError
from kiln.verify import binaries


def expected_archs(ws: Workspace, vendor: str | None, archs: list[str] | None) -> list[str]:
    """``--archs`` if given, else the vendor's recipe archs, else the profile's."""
    if archs is not None:
        return archs
    if vendor:
        return list(ws.select([vendor])[0].build.archs)
    return list(ws.profile.archs)


def summary(report: binaries.WheelReport) -> str:
    objects = ", ".join(
        f"{o.path} ({', '.join(o.sass) or 'host only'})" for o in report.shared_objects
    )
    return f"{report.file}: ok: {objects or 'no shared objects'}"


def verify_one(wheel: Path, profile: Profile, archs: list[str]) -> binaries.WheelReport:
    """One wheel built elsewhere, against ``archs``."""
    if not wheel.is_file():
        raise VerifyError(f"{wheel}: no such wheel")
    return binaries.verify_wheel(wheel, archs, profile, torch_pin=False)


def verify_wheels(wheels: list[Path], profile: Profile, archs: list[str]) -> list[str]:
    return [summary(verify_one(wheel, profile, archs)) for wheel in wheels]
