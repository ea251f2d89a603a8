"""The release's CI plan: one job per upstream × profile, from the workspace itself.

``python -m kiln plan --json`` prints ``{"include": [...]}``, the form GitHub Actions'
``strategy.matrix`` takes through ``fromJSON``: the release workflow (``ci/release.yml``)
has no list of upstreams of its own, so adding a TOML to ``vendors/`` adds a job.
"""

from __future__ import annotations

import json
from typing import Any

from kiln.config.models import Profile
from kiln.config.workspace import Workspace


def profile_label(profile: Profile) -> str:
    """A short, stable name for a profile: ``cu132-cp312-sm100a-sm103a``."""
    archs = "-".join(a.replace("_", "") for a in profile.archs)
    return f"{profile.cuda_tag}-{profile.python_tag}-{archs}"


def jobs(ws: Workspace) -> list[dict[str, Any]]:
    """One entry per vendor of the workspace's profile (a workspace holds one profile)."""
    label = profile_label(ws.profile)
    return [
        {
            "vendor": v.name,
            "kind": v.build.kind,
            "profile": label,
            "release": ws.release.name,
            # the artifact that carries this job's partial release (name unique per job)
            "artifact": f"partial-{v.name}-{label}",
        }
        for v in ws.vendors.values()
    ]


def plan_json(ws: Workspace) -> str:
    """The matrix on one line (what ``$GITHUB_OUTPUT`` needs)."""
    return json.dumps({"include": jobs(ws)}, sort_keys=True, separators=(",", ":"))


def plan_table(ws: Workspace) -> str:
    rows = [(j["vendor"], j["kind"], j["profile"], j["artifact"]) for j in jobs(ws)]
    head = ("vendor", "kind", "profile", "artifact")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    )
