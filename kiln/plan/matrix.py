"""The release's CI plan: one job per upstream × profile, from the workspace itself.

``python -m kiln plan --json`` prints ``{"include": [...]}``, the form GitHub Actions'
``strategy.matrix`` takes through ``fromJSON``: the release workflow (``ci/release.yml``)
has no list of upstreams or profiles of its own, so adding a TOML to ``vendors/`` or a
``[profiles.NAME]`` table to ``kiln.toml`` adds jobs.

The profiles are ``[profile]`` itself (named ``default``) and each ``[profiles.NAME]``
variant: every one is a release of its own (its CUDA, Python or archs differ), so each
is built, merged and published on its own (``--releases``: one row per profile, the
release job's matrix). ``[profile]`` keeps the release's folder name; a variant's folder
and publishing target get ``-NAME`` appended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from kiln.config.models import Profile
from kiln.config.workspace import DEFAULT_PROFILE, Workspace


def profile_label(profile: Profile) -> str:
    """A short, stable name for a profile's content: ``cu132-cp312-sm100a-sm103a``."""
    archs = "-".join(a.replace("_", "") for a in profile.archs)
    return f"{profile.cuda_tag}-{profile.python_tag}-{archs}"


def workspaces(root: Path, wanted: Sequence[str] | None = None) -> list[tuple[str, Workspace]]:
    """(profile name, the workspace loaded with it) for each profile, or for ``wanted``."""
    first = Workspace(root)
    names = list(dict.fromkeys(wanted)) if wanted else list(first.profile_names)
    return [(n, first if n == DEFAULT_PROFILE else Workspace(root, n)) for n in names]


def suffix(profile: str) -> str:
    """What a profile's release folder and target add to the release's: none for
    [profile], ``-NAME`` for a variant."""
    return "" if profile == DEFAULT_PROFILE else f"-{profile}"


def releases(root: Path, wanted: Sequence[str] | None = None) -> list[dict[str, str]]:
    """One row per profile: the release the merge of its jobs makes."""
    return [
        {
            "profile": name,
            "label": profile_label(ws.profile),
            "release": ws.release.name,
            "suffix": suffix(name),
            "folder": ws.release.name + suffix(name),
            # the partial releases of this profile (download-artifact's pattern): names
            # hold no '.', so one profile's pattern never takes another's
            "partials": f"partial.{name}.*",
        }
        for name, ws in workspaces(root, wanted)
    ]


def jobs(root: Path, wanted: Sequence[str] | None = None) -> list[dict[str, str]]:
    """One row per vendor x profile: a build job."""
    return [
        {
            "vendor": v.name,
            "kind": v.build.kind,
            "profile": name,
            "label": profile_label(ws.profile),
            "release": ws.release.name,
            # the artifact that carries this job's partial release (unique per job)
            "artifact": f"partial.{name}.{v.name}",
        }
        for name, ws in workspaces(root, wanted)
        for v in ws.vendors.values()
    ]


def as_json(rows: Sequence[Mapping[str, str]]) -> str:
    """The matrix on one line (what ``$GITHUB_OUTPUT`` needs)."""
    return json.dumps({"include": rows}, sort_keys=True, separators=(",", ":"))


def as_table(rows: Sequence[Mapping[str, str]]) -> str:
    if not rows:
        return ""
    head = tuple(k for k in rows[0] if k != "release")
    cells = [tuple(str(r[k]) for k in head) for r in rows]
    widths = [max(len(r[i]) for r in [head, *cells]) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *cells]
    )
