"""``kiln verify-wheel``: kiln's wheel verification on wheels built elsewhere.

cibuildwheel's ``test-command`` (a wheel built the standard way, checked against the
profile and a vendor's recipe). A release's wheels read again: ``kiln/verify_wheel.py``.
"""

from __future__ import annotations

from pathlib import Path

from kiln.config.models import Profile
from kiln.config.workspace import Workspace
from kiln.errors import VerifyError
from kiln.release.manifest import ImportProof
from kiln.verify import binaries as verify


def expected_archs(ws: Workspace, vendor: str | None, archs: list[str] | None) -> list[str]:
    """``--archs`` if given, else the vendor's recipe archs, else the profile's."""
    if archs is not None:
        return archs
    if vendor:
        return list(ws.select([vendor])[0].build.archs)
    return list(ws.profile.archs)


def summary(report: verify.WheelReport) -> str:
    objects = ", ".join(
        f"{o.path} ({', '.join(o.sass) or 'host only'})" for o in report.shared_objects
    )
    return f"{report.file}: ok: {objects or 'no shared objects'}"


def proof_line(proof: ImportProof | None) -> str:
    """What the manifest says the import proof found (``kiln build`` ran it)."""
    if proof is None:
        return "  import proof: not run (the build had --no-import-proof)"
    ok = ", ".join(f"{m.module} ({m.seconds:g} s)" for m in proof.modules if m.status == "ok")
    skipped = "; ".join(f"{m.module}: {m.reason}" for m in proof.modules if m.status == "skipped")
    where = f"{proof.requirements}" + (f", torch {proof.torch}" if proof.torch else "")
    return f"  imported where it lands ({where}; libcuda: {proof.driver}): {ok or 'nothing'}" + (
        f"; skipped: {skipped}" if skipped else ""
    )


def verify_wheels(wheels: list[Path], profile: Profile, archs: list[str]) -> list[str]:
    lines = []
    for wheel in wheels:
        if not wheel.is_file():
            raise VerifyError(f"{wheel}: no such wheel")
        report = verify.verify_wheel(wheel, archs, profile, torch_pin=False)
        lines.append(summary(report))
    return lines
