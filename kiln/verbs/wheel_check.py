"""``kiln verify-wheel``: kiln's wheel verification on wheels built elsewhere (cibuildwheel's
``test-command``: ``kiln/verify/wheels.py``), or on every wheel of a release
(``--manifest``): the release workflow's last job re-reads the SASS of every wheel of a
merged release with cuobjdump before publishing, and compares it with the recipe and
with what the build job recorded; it shows what the build's import proof imported where
the release lands.
"""

from __future__ import annotations

from pathlib import Path

from kiln.config.models import Profile
from kiln.errors import VerifyError
from kiln.release import manifest
from kiln.release.manifest import ImportProof
from kiln.verify import binaries
from kiln.verify import wheels as wheelcheck
from kiln.verify.wheels import summary


def proof_line(proof: ImportProof | None) -> str:
    """What the manifest says the import proof found (``kiln build`` ran it)."""
    if proof is None:
        return "  import proof: not run (the build had --no-import-proof)"
    ok = ", ".join(
        m.module if m.seconds is None else f"{m.module} ({m.seconds:g} s)"  # no run record
        for m in proof.modules
        if m.status == "ok"
    )
    skipped = "; ".join(f"{m.module}: {m.reason}" for m in proof.modules if m.status == "skipped")
    where = f"{proof.requirements}" + (f", torch {proof.torch}" if proof.torch else "")
    return f"  imported where it lands ({where}; libcuda: {proof.driver}): {ok or 'nothing'}" + (
        f"; skipped: {skipped}" if skipped else ""
    )


def verify_release(manifest_file: Path) -> list[str]:
    """Every wheel the manifest lists, and every variant wheel made of one: SASS equal to
    its recipe's archs and to the record; a variant's properties those archs."""
    m = manifest.read(manifest_file)
    profile = Profile.model_validate(m.profile.data())
    lines = []
    variant_files = [f.path for f in m.files if f.kind == "variant-wheel"]
    for name, entry in m.vendors.items():
        for out in entry.outputs_of("wheel"):
            wheel = manifest_file.parent / out.path
            report = _same_as_recorded(wheel, name, entry.recipe["archs"], out, profile)
            lines.append(summary(report))
            lines.append(proof_line(out.import_proof))
            for path in variant_files:
                variant = manifest_file.parent / path
                if binaries.base_wheel_name(variant.name) != wheel.name:
                    continue
                vreport = _same_as_recorded(variant, name, entry.recipe["archs"], out, profile)
                lines.append(summary(vreport))
                lines.append(variant_line(variant, vreport, m.toolchain.nvcc_version))
    return lines


def verify_wheels(wheels: list[Path], profile: Profile, archs: list[str]) -> list[str]:
    """Wheels built elsewhere, one by one, against ``archs``; a variant wheel's
    properties also against what its shared objects hold (they said what they liked:
    a ``variant.json`` claiming an arch its SASS lacks passed)."""
    from kiln.release import variants

    lines = []
    for wheel in wheels:
        report = wheelcheck.verify_one(wheel, profile, archs)
        lines.append(summary(report))
        if variants.is_variant(wheel.name):
            lines.append(variant_line(wheel, report, profile.cuda))
    return lines


def _same_as_recorded(
    wheel: Path, vendor: str, archs: list[str], out: manifest.Output, profile: Profile
) -> binaries.WheelReport:
    report = binaries.verify_wheel(wheel, list(archs), profile)
    now = {o.path: o.sass for o in report.shared_objects}
    recorded = {o.path: o.sass for o in out.shared_objects or []}
    if now != recorded:
        raise VerifyError(
            f"{wheel.name} ({vendor}): SASS now {now}, the manifest records {recorded}: "
            f"the wheel is not the one its job verified; rerun the release"
        )
    return report


def variant_line(wheel: Path, report: binaries.WheelReport, cuda: str) -> str:
    """A variant wheel's properties (variantlib reads its ``variant.json``) must say what
    its SASS holds: the archs cuobjdump reads now and the CUDA it was built with."""
    from kiln.release import variants

    said = sorted(p.to_str() for p in variants.read_variant(wheel).properties)
    sass = sorted({a for o in report.shared_objects for a in o.sass})
    ptx = sorted({a for o in report.shared_objects for a in o.ptx})
    want = sorted(p.to_str() for p in variants.properties(sass, ptx, cuda))
    if said != want:
        raise VerifyError(
            f"{wheel.name}: its variant properties say {', '.join(said)}, its shared "
            f"objects hold {', '.join(want)}: the variant does not say what is inside; "
            f"rebuild the release"
        )
    return f"  variant properties: {', '.join(said)} (as its SASS)"
