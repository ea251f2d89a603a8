"""``kiln lock``: pin what can be pinned, on a machine with network.

Rewrites each vendor TOML's ``source.commit`` to the full 40-character SHA and
records its submodules' commits from the pinned tree; fetches absent patches from
their published source and records every present patch's sha256 in the series.
Files are edited with tomlkit, so comments and layout survive.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

import tomlkit
from packaging.version import Version

from kiln.config.fields import SERIES_FILE, WORKSPACE_FILE
from kiln.config.models import PatchEntry, Profile
from kiln.config.workspace import Workspace
from kiln.errors import DockerUnavailable, PatchError
from kiln.fsutil import sha256_file, write_atomic
from kiln.inside import proc
from kiln.release.files import REQUIREMENTS as REQUIREMENTS_NAME
from kiln.sources.checkout import GitCache, gitlinks


def _write_toml(path: Path, doc: tomlkit.TOMLDocument) -> None:
    write_atomic(path, tomlkit.dumps(doc))  # whole or not at all, 0644


def lock_vendor(ws: Workspace, name: str, cache: GitCache) -> list[str]:
    vendor = ws.vendors[name]
    path = ws.vendor_file(name)
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    changes = []
    full = cache.resolve(vendor.source.url, vendor.source.commit, name)
    if full != vendor.source.commit:
        doc["source"]["commit"] = full
        changes.append(f"{name}: source.commit {vendor.source.commit} -> {full}")
    links = gitlinks(cache.bare(vendor.source.url), full)
    for i, sub in enumerate(vendor.source.submodules):
        recorded = links.get(sub.path)
        if recorded is None:
            changes.append(f"{name}: submodule {sub.path} is not in the tree at {full[:12]}")
            continue
        if sub.commit != recorded:
            doc["source"]["submodules"][i]["commit"] = recorded
            changes.append(f"{name}: submodule {sub.path} -> {recorded}")
    for path_ in sorted(set(links) - {s.path for s in vendor.source.submodules}):
        changes.append(f"{name}: the tree also records submodule {path_}; add it to the TOML")
    if changes:
        _write_toml(path, doc)
    return changes


def fetch_patch(entry: PatchEntry, dest: Path) -> None:
    """Download a published patch (https:// or hf://REPO/PATH on the Hugging Face Hub)."""
    assert entry.source
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        if entry.source.startswith("hf://"):
            from huggingface_hub import hf_hub_download

            parts = entry.source.removeprefix("hf://").split("/")
            cached = hf_hub_download("/".join(parts[:2]), "/".join(parts[2:]))
            tmp.write_bytes(Path(cached).read_bytes())
        else:
            with urllib.request.urlopen(entry.source, timeout=60) as resp:
                tmp.write_bytes(resp.read())
        os.replace(tmp, dest)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise PatchError(f"patch {entry.file}: cannot fetch {entry.source}: {exc}") from None


def lock_series(ws: Workspace) -> list[str]:
    path = ws.patches_dir / SERIES_FILE
    if not ws.series.patch:
        return []
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    changes = []
    for i, entry in enumerate(ws.series.patch):
        target = ws.patches_dir / entry.file
        if not target.exists() and entry.source:
            fetch_patch(entry, target)
            changes.append(f"patch {entry.file}: fetched from {entry.source}")
        if not target.exists():
            changes.append(f"patch {entry.file}: absent and has no source; not recorded")
            continue
        digest = sha256_file(target)
        if entry.sha256 != digest:
            doc["patch"][i]["sha256"] = digest
            was = f" (was {entry.sha256})" if entry.sha256 else ""
            changes.append(f"patch {entry.file}: sha256 {digest}{was}")
    _write_toml(path, doc)
    return changes


def lock_image(ws: Workspace) -> list[str]:
    """Pin ``profile.image`` by digest (asks the registry through the Docker daemon)."""
    ref = ws.profile.image
    if not ref or "@sha256:" in ref:
        return []
    from docker.errors import DockerException

    from kiln.runners import registry

    try:
        digest = registry.image_digest(ref)
    except (DockerUnavailable, DockerException) as exc:
        first = str(exc).splitlines()[0][:200]
        return [f"profile.image {ref}: not pinned, the registry could not be asked ({first})"]
    path = ws.root / WORKSPACE_FILE
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    doc["profile"]["image"] = f"{ref}@{digest}"
    _write_toml(path, doc)
    return [f"profile.image {ref} -> {ref}@{digest}"]


RUNTIME_LOCK = "runtime-requirements.lock"


def _platforms(profile: Profile) -> list[str]:
    machine = profile.platform.split("_", 1)[1]
    return [f"manylinux_2_{minor}_{machine}" for minor in range(17, 40)] + [
        f"manylinux2014_{machine}",
        f"linux_{machine}",
    ]


def lock_runtime(ws: Workspace) -> list[str]:
    """Resolve what install.sh installs (``runtime-requirements.txt``, else the profile's
    torch) for the profile's Python and platform with pip's installation report, and
    write every package with its sha256 to ``runtime-requirements.lock``."""
    from kiln.release.files import KEPT_TORCH, requirements

    text = requirements(ws.root, ws.profile.torch, locked=False)
    with tempfile.TemporaryDirectory(prefix="kiln-lock-") as tmp:
        reqs, report = Path(tmp) / "requirements.txt", Path(tmp) / "report.json"
        reqs.write_text(text)
        index = ["--extra-index-url", ws.profile.torch_index] if ws.profile.torch_index else []
        platforms = [x for p in _platforms(ws.profile) for x in ("--platform", p)]
        res = proc.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--disable-pip-version-check",
                "--report",
                report,
                "--target",
                Path(tmp) / "target",
                "--python-version",
                ws.profile.python,
                "--only-binary=:all:",
                *platforms,
                *index,
                "-r",
                reqs,
            ],
            check=False,
            what="resolving the runtime requirements",
        )
        if res.returncode != 0:
            last = (res.output.strip().splitlines() or ["?"])[-1]
            return [f"runtime requirements: not locked, pip could not resolve them ({last})"]
        installs = json.loads(report.read_text())["install"]
    kept = KEPT_TORCH in text
    lines = [
        f"# Resolved by `kiln lock` from {REQUIREMENTS_NAME} (or the profile's torch) for "
        f"Python {ws.profile.python}, {ws.profile.platform}.",
        "# install.sh installs exactly these, with pip --require-hashes.",
    ]
    if kept:
        lines.append(
            f"# {REQUIREMENTS_NAME} names no torch: the profile's torch "
            f"(torch=={Version(ws.profile.torch or '0').public}) kept, which the wheels require."
        )
    for item in sorted(installs, key=lambda i: i["metadata"]["name"].lower()):
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            return [f"runtime requirements: not locked, {item['metadata']['name']} has no sha256"]
        lines.append(
            f"{item['metadata']['name']}=={item['metadata']['version']} --hash=sha256:{digest}"
        )
    path = ws.root / RUNTIME_LOCK
    new = "\n".join(lines) + "\n"
    if path.exists() and path.read_text() == new:
        return []
    path.write_text(new)
    return [
        f"runtime requirements: {len(installs)} packages pinned by hash in {RUNTIME_LOCK}"
        + (
            f" ({REQUIREMENTS_NAME} names no torch: kept the profile's "
            f"torch=={Version(ws.profile.torch or '0').public})"
            if kept
            else ""
        )
    ]


def lock(ws: Workspace, cache: GitCache) -> list[str]:
    changes = lock_image(ws) + lock_runtime(ws)
    for name in ws.vendors:
        changes.extend(lock_vendor(ws, name, cache))
    changes.extend(lock_series(ws))
    return changes or ["everything already pinned"]
