"""``kiln verify-wheel``: kiln's wheel verification on wheels built elsewhere.

Two uses: cibuildwheel's ``test-command`` (a wheel built the standard way, checked against
the profile and a vendor's recipe), and the release workflow's last job, which re-reads
the SASS of every wheel of a merged release with cuobjdump (``--manifest``) before
publishing, and compares it with the recipe and with what the build job recorded.
"""

from __future__ import annotations

from pathlib import Path

from kiln.config.models import Profile
from kiln.config.workspace import Workspace
from kiln.errors import VerifyError
from kiln.release import manifest
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


def verify_wheels(wheels: list[Path], profile: Profile, archs: list[str]) -> list[str]:
    lines = []
    for wheel in wheels:
        if not wheel.is_file():
            raise VerifyError(f"{wheel}: no such wheel")
        lines.append(summary(verify.verify_wheel(wheel, archs, profile)))
    return lines


def verify_release(manifest_file: Path) -> list[str]:
    """Every wheel the manifest lists: SASS equal to its recipe's archs and to the record."""
    data = manifest.read(manifest_file)
    profile = Profile.model_validate(data["profile"])
    lines = []
    for name, entry in data["vendors"].items():
        for out in entry["outputs"]:
            if out["kind"] != "wheel":
                continue
            wheel = manifest_file.parent / out["path"]
            report = verify.verify_wheel(wheel, list(entry["recipe"]["archs"]), profile)
            now = {o.path: o.sass for o in report.shared_objects}
            recorded = {o["path"]: o["sass"] for o in out.get("shared_objects", [])}
            if now != recorded:
                raise VerifyError(
                    f"{out['path']} ({name}): SASS now {now}, the manifest records {recorded}: "
                    f"the wheel is not the one its job verified; rerun the release"
                )
            lines.append(summary(report))
    return lines
