"""``kiln verify``: rebuild a release from its manifest alone and compare, byte for byte.

The manifest says everything needed: each upstream's URL, full commit and submodule
commits, the recipe, the profile, the runner and image; the patches come from the
release's own ``patches/`` (checked against their recorded sha256). kiln writes that
into a fresh workspace in another folder, builds it, and compares every wheel, tarball
and release file with the original. Equal sha256 everywhere is a pass; otherwise each
differing file is explained: members added or missing, members whose bytes differ, and
for shared objects whether the SASS of each arch (``cuobjdump -sass``) is the same.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import tomlkit
import zstandard

from kiln.config.fields import SERIES_FILE, WORKSPACE_FILE
from kiln.errors import ManifestError, ToolchainError
from kiln.fsutil import sha256_file
from kiln.inside import proc
from kiln.orchestrate import pipeline, stages
from kiln.orchestrate.options import Options
from kiln.release import manifest, signing
from kiln.release.jsondiff import differences
from kiln.release.manifest import Manifest
from kiln.runners import registry
from kiln.toolchain.checks import cuobjdump

SKIPPED_KINDS = {"jit-cache"}  # packed from a GPU run, not built: nothing to rebuild


def workspace_from_manifest(m: Manifest, release_dir: Path, dest: Path) -> Path:
    """A workspace that builds exactly what the manifest records."""
    (dest / "vendors").mkdir(parents=True)
    (dest / "patches").mkdir()
    profile = {k: v for k, v in m.profile.data().items() if v is not None}
    release = _drop_none(m.release.data())
    # a signed release: rebuilt unsigned unless `kiln verify --sign` has the key (then
    # the envelopes are compared too), its files written as signed ones are
    # (Options.signed_by)
    release.pop("signed_by", None)
    release.pop("signer_identity", None)
    release.pop("signer_scheme", None)
    release.pop("require_signature", None)
    template = release.pop("readme_template_text", None)
    if template is not None and release.get("readme_template"):
        (dest / release["readme_template"]).parent.mkdir(parents=True, exist_ok=True)
        (dest / release["readme_template"]).write_text(template)
    else:
        release.pop("readme_template", None)  # none then: the default path stays absent
    (dest / WORKSPACE_FILE).write_text(tomlkit.dumps({"release": release, "profile": profile}))
    series: list[dict[str, str]] = []
    tags = {}
    for name, entry in m.vendors.items():
        src = entry.source
        source: dict[str, object] = {
            "url": src.url,
            "commit": src.commit,
            "license": src.license or "LICENSE",
        }
        if src.license_id:
            source["license_id"] = src.license_id
        if src.submodules:  # each with the license file and id its build found
            source["submodules"] = [
                _drop_none({"path": s.path, "license": s.license, "license_id": s.license_id})
                for s in src.submodules
            ]
        (dest / "vendors" / f"{name}.toml").write_text(vendor_toml(source, entry.recipe))
        for p in entry.patches:
            patch = release_dir / "patches" / p.file
            if not patch.is_file() or sha256_file(patch) != p.sha256:
                raise ManifestError(
                    f"{patch}: missing or not the patch the manifest records "
                    f"(sha256 {p.sha256[:12]}…)"
                )
            shutil.copy2(patch, dest / "patches" / p.file)
            series.append({"file": p.file, "target": name})
        if entry.patch_tag:
            tags[name] = entry.patch_tag
    # install.sh's requirements as the release resolved them (hash-pinned where it did)
    shutil.copy2(release_dir / "requirements.txt", dest / "runtime-requirements.lock")
    doc: dict[str, object] = {"patch": series}
    if tags:
        doc["tags"] = tags
    (dest / "patches" / SERIES_FILE).write_text(tomlkit.dumps(doc))
    return dest


def vendor_toml(source: Mapping[str, object], recipe: Mapping[str, object]) -> str:
    """A vendor TOML from the manifest's record of its source and recipe (JSON)."""
    return tomlkit.dumps({"source": source, "build": _drop_none(recipe)})


def _drop_none(value: Any) -> Any:
    """TOML has no null: a recipe's unset options are left out, also those of its tables
    and of the tables in its arrays (``[[build.system]]`` with a header and no library)."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _sass_by_arch(data: bytes) -> dict[str, str]:
    with tempfile.NamedTemporaryFile(suffix=".so") as fh:
        fh.write(data)
        fh.flush()
        tool = cuobjdump()  # -sass needs nvdisasm: kiln's nvidia-cuda-nvdisasm puts it beside
        env = {**os.environ, "PATH": f"{tool.parent}:{os.environ.get('PATH', '')}"}
        out = proc.run([tool, "-sass", fh.name], check=False, env=env).output
    if "Could not find executable file 'nvdisasm'" in out:
        raise ToolchainError("cuobjdump -sass needs nvdisasm: `pip install nvidia-cuda-nvdisasm`")
    sections: dict[str, list[str]] = {}
    arch = None
    for line in out.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m:
            arch = m.group(1)
        elif arch and not line.startswith("Fatbin"):
            sections.setdefault(arch, []).append(line)
    return {a: "\n".join(lines) for a, lines in sections.items()}


def _members(path: Path) -> dict[str, bytes]:
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as zf:
            return {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}
    if path.name.endswith(".tar.zst"):
        raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read()
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]
    return {}


def explain(original: Path, rebuilt: Path) -> list[str]:
    """Why two files differ, member by member."""
    a, b = _members(original), _members(rebuilt)
    if not a and not b:
        return ["  contents differ (not an archive)"]
    lines = [f"  only in the release: {m}" for m in sorted(set(a) - set(b))]
    lines += [f"  only in the rebuild: {m}" for m in sorted(set(b) - set(a))]
    for member in sorted(set(a) & set(b)):
        if a[member] == b[member]:
            continue
        lines.append(
            f"  member {member}: sha256 {hashlib.sha256(a[member]).hexdigest()[:16]} "
            f"!= {hashlib.sha256(b[member]).hexdigest()[:16]}"
        )
        if member.endswith(".so") or ".so." in member:
            sa, sb = _sass_by_arch(a[member]), _sass_by_arch(b[member])
            for arch in sorted(set(sa) | set(sb)):
                same = sa.get(arch) == sb.get(arch)
                lines.append(f"    SASS {arch}: {'identical' if same else 'differs'}")
    return lines


BUILDER_KEYS = ("kiln_version", "kiln_commit")  # the kiln that built: not an input


def compare(m: Manifest, release_dir: Path, rebuilt_dir: Path) -> list[str]:
    """Every difference between the release and its rebuild (empty: identical): the
    files the manifest lists, the manifest itself, and the signature files (the envelope,
    SHA256SUMS and its signature) where the
    rebuild was signed too (``kiln verify --sign`` with the release's key). A manifest
    that differs only in the kiln that wrote it (:func:`builder_note`) is not a
    difference, nor then is the envelope over it: every file it lists is the same."""
    report = []
    for out in m.outputs():
        if out.kind in SKIPPED_KINDS:
            continue
        report += _compare_file(out.path, release_dir, rebuilt_dir)
    if builder_note(release_dir, rebuilt_dir) is None:
        report += _compare_file(manifest.FILE_NAME, release_dir, rebuilt_dir)
        for name in signing.SIGNATURE_FILES:
            if (rebuilt_dir / name).is_file():
                report += _compare_file(name, release_dir, rebuilt_dir)
    return report


def builder_note(release_dir: Path, rebuilt_dir: Path) -> str | None:
    """Where the two manifests differ in the kiln that wrote them alone (a release
    verified with a newer kiln), a line saying so; None otherwise."""
    try:
        a = json.loads((release_dir / manifest.FILE_NAME).read_text())
        b = json.loads((rebuilt_dir / manifest.FILE_NAME).read_text())
    except (OSError, ValueError):
        return None
    if a == b or {k: v for k, v in a.items() if k not in BUILDER_KEYS} != {
        k: v for k, v in b.items() if k not in BUILDER_KEYS
    }:
        return None
    kilns = ", ".join(f"{k} {a.get(k)} != {b.get(k)}" for k in BUILDER_KEYS if a.get(k) != b.get(k))
    return (
        f"note: {manifest.FILE_NAME} differs only in the kiln that wrote it ({kilns}): the "
        "rebuild ran another kiln; every file the manifest lists is compared"
    )


def _compare_file(rel: str, release_dir: Path, rebuilt_dir: Path) -> list[str]:
    original, rebuilt = release_dir / rel, rebuilt_dir / rel
    if not rebuilt.is_file():
        return [f"{rel}: not made by the rebuild"]
    if not original.is_file():
        return [f"{rel}: missing from the release"]
    da, db = sha256_file(original), sha256_file(rebuilt)
    if da == db:
        return []
    head = f"{rel}: sha256 {da} (release) != {db} (rebuild)"
    if rel.endswith(".json"):
        return [head, *_json_differences(original, rebuilt)]
    return [head, *explain(original, rebuilt)]


def _json_differences(original: Path, rebuilt: Path, most: int = 12) -> list[str]:
    """The keys whose values differ between two JSON files (the first ``most``)."""
    try:
        a, b = json.loads(original.read_text()), json.loads(rebuilt.read_text())
    except (OSError, ValueError):
        return ["  contents differ (not both JSON)"]
    found = [
        f"  {path or '(whole)'}: {json.dumps(x)[:60]} != {json.dumps(y)[:60]}"
        for path, x, y in differences(a, b)
    ]
    more = [f"  (and {len(found) - most} more)"] if len(found) > most else []
    return found[:most] + more


def rebuild(manifest_file: Path, opts: Options) -> Path:
    """Build the release again from its manifest into ``opts.work``; return the rebuild:
    the same options, but the manifest's workspace, its toolchain and runner, no caches
    (cached outputs or objects would prove nothing)."""
    m = manifest.read(manifest_file)
    # the given workspace's bundles.toml names the bundles
    mirrors = pipeline.decide_origins(opts).mirrors_file
    workspace = workspace_from_manifest(m, manifest_file.parent, opts.work / "verify-workspace")
    runner = m.runner
    image, unpinned = opts.image, opts.allow_unpinned_image
    if registry.capabilities(runner.kind).records_image and not image and runner.image:
        image = runner.image.removeprefix("unpinned:")
        unpinned = runner.image.startswith("unpinned:")
    again = replace(
        opts,
        workspace=workspace,
        mirrors=mirrors,
        bundles=None,
        profile=None,  # the manifest's profile, as built, is the workspace's [profile]
        vendors=None,
        artifacts=opts.work / "artifacts",
        work=opts.work / "trees",
        artifact_cache=False,
        no_compiler_cache=True,
        toolchain="pypi" if m.toolchain.components else opts.toolchain,
        runner=runner.kind if opts.runner == "auto" else opts.runner,
        image=image,
        allow_unpinned_image=unpinned,
        sign=opts.sign,  # the same Ed25519 key signs the same bytes: the envelope compared
        signed_by=None if opts.sign else m.release.signed_by,
        signer_identity=None if opts.sign else m.release.signer_identity,
        signer_scheme=None if opts.sign else m.release.signer_scheme,
    )
    return stages.build(again)
