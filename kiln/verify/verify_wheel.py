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
from kiln.verify.wheels import summary


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


def verify_release(manifest_file: Path) -> list[str]:
    """Every wheel the manifest lists: SASS equal to its recipe's archs and to the record."""
    m = manifest.read(manifest_file)
    profile = Profile.model_validate(m.profile.data())
    lines = []
    for name, entry in m.vendors.items():
        for out in entry.outputs_of("wheel"):
            wheel = manifest_file.parent / out.path
            report = binaries.verify_wheel(wheel, list(entry.recipe["archs"]), profile)
            now = {o.path: o.sass for o in report.shared_objects}
            recorded = {o.path: o.sass for o in out.shared_objects or []}
            if now != recorded:
                raise VerifyError(
                    f"{out.path} ({name}): SASS now {now}, the manifest records {recorded}: "
                    f"the wheel is not the one its job verified; rerun the release"
                )
            lines.append(summary(report))
            lines.append(proof_line(out.import_proof))
    return lines
