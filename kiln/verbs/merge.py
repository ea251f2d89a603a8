"""``kiln manifest merge``: partial release folders from CI jobs into one release.

Each job of the release workflow builds some vendors into a release folder of its own
(outputs + ``manifest.json``). Merging is only sound when every partial was made the same
way, so the merge refuses, naming both partials and the field, when they disagree on the
release, profile, kiln version, toolchain or runner (image digest, builder), when one
vendor is in two partials with different contents, or when two partials hold different
files at one path. Each partial is re-hashed first (``manifest check``): a file changed
after its job wrote it is refused. Recorded SASS archs are checked against each vendor's
recipe. The release-level files (install.sh, README, provenance, SBOM) are regenerated
from the merged manifest exactly as a single build would write them (from the manifest
alone: no workspace is made), in a staging folder that replaces ``--out`` only when
everything passed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln import fsutil
from kiln.config.workspace import Workspace
from kiln.errors import MergeError, SignatureError
from kiln.release import files as release_files
from kiln.release import manifest, runrecord, signing
from kiln.release.jsondiff import first_difference
from kiln.release.manifest import Manifest, Output, ReleaseFile, VendorEntry
from kiln.verify import binaries

# What must be equal across the partials of one release. Other top-level keys (such as
# the scheduler's figures) describe one run and are not carried into the merged manifest.
HEADER_FIELDS = (
    "schema",
    "kiln_version",
    "kiln_commit",
    "release",
    "profile",
    "toolchain",
    "runner",
)
# What a vendor's entry says about how its files were made; the rest (timings, cache hits,
# the scheduler's figures) are measurements of one run and may differ between two jobs.
CONTENT_FIELDS = ("source", "patches", "patch_tag", "recipe", "environment", "runner", "outputs")
REQUIREMENTS = "requirements.txt"


@dataclass(frozen=True)
class Partial:
    folder: Path
    manifest: Manifest

    @property
    def data(self) -> dict[str, object]:
        """The manifest's JSON form (what the consistency checks compare)."""
        return self.manifest.data()


def _value(data: Any, dotted: str) -> Any:
    for part in dotted.split(" ")[0].split("."):
        if isinstance(data, list):
            data = data[int(part)] if part.isdigit() and int(part) < len(data) else None
        elif isinstance(data, dict):
            data = data.get(part)
        else:
            return None
    return data


def load(folder: Path) -> Partial:
    """A partial release, re-hashed against its manifest."""
    path = folder / manifest.FILE_NAME
    problems = manifest.check(path)  # a missing or malformed manifest raises, naming it
    if problems:
        p = problems[0]
        raise MergeError(
            f"{folder}: {p.path}: {p.problem} ({len(problems)} file(s) differ from its "
            f"manifest); the partial changed after its job wrote it: rerun that job"
        )
    return Partial(folder, manifest.read(path, with_run=False))  # what its job built


def check_consistent(partials: list[Partial]) -> None:
    first = partials[0]
    for other in partials[1:]:
        for key in HEADER_FIELDS:
            field = first_difference(first.data.get(key), other.data.get(key), key)
            if field:
                raise MergeError(
                    f"{first.folder} and {other.folder} disagree on {field}: "
                    f"{_value(first.data, field)!r} vs {_value(other.data, field)!r}; the "
                    f"partials of one release must come from one kiln, profile, toolchain "
                    f"and builder image: rerun their jobs in one workflow run"
                )
        mine, theirs = first.folder / REQUIREMENTS, other.folder / REQUIREMENTS
        if fsutil.sha256_file(mine) != fsutil.sha256_file(theirs):
            raise MergeError(
                f"{first.folder} and {other.folder} disagree on {REQUIREMENTS}: the "
                f"partials were made from different runtime requirements; rerun their "
                f"jobs from one commit"
            )


def _check_archs(part: Partial, entry: VendorEntry) -> None:
    """The SASS each job recorded must be the vendor's recipe archs (verify's rule)."""
    for out in entry.outputs_of("wheel", "tarball"):
        objects = [
            binaries.SharedObject(o.path, list(o.sass), list(o.ptx))
            for o in out.shared_objects or []
        ]
        binaries.check_archs(f"{part.folder}: {out.path}", objects, entry.recipe["archs"])


def combine(partials: list[Partial]) -> tuple[Manifest, dict[str, Path]]:
    """The merged manifest (no ``files`` but the JIT caches) and, per path, the file to copy."""
    vendors: dict[str, VendorEntry] = {}
    owner: dict[str, Partial] = {}
    files: dict[str, Path] = {}
    hashes: dict[str, tuple[str, Path]] = {}

    def take(item: Output | ReleaseFile, part: Partial, fix: str) -> None:
        """One file of the merged release, from ``part``; another one at its path is refused."""
        seen = hashes.get(item.path)
        if seen and seen[0] != item.sha256:
            raise MergeError(
                f"{seen[1]} and {part.folder} both hold {item.path} with different contents: {fix}"
            )
        hashes[item.path] = (item.sha256, part.folder)
        files[item.path] = part.folder / item.path

    for part in partials:
        for name, entry in part.manifest.vendors.items():
            _check_archs(part, entry)
            if name in vendors:
                mine = {k: vendors[name].data().get(k) for k in CONTENT_FIELDS}
                theirs = {k: entry.data().get(k) for k in CONTENT_FIELDS}
                field = first_difference(mine, theirs, f"vendors.{name}")
                if field:
                    raise MergeError(
                        f"vendor {name} is in both {owner[name].folder} and {part.folder} "
                        f"with different contents ({field}): build each vendor in one job only"
                    )
                continue
            vendors[name], owner[name] = entry, part
            for out in entry.outputs:
                take(out, part, "two vendors made one file name; rename one")
    jit: dict[str, ReleaseFile] = {}
    for part in partials:  # packed JIT caches (not built by CI jobs, but kept if present)
        for f in part.manifest.files:
            if f.kind == "jit-cache":
                take(f, part, "keep one")
                jit[f.path] = f
    warnings: list[str] = []
    for part in partials:
        warnings += [w for w in part.manifest.warnings if w not in warnings]
    header = {k: partials[0].data[k] for k in HEADER_FIELDS}
    merged = Manifest.model_validate({**header, "vendors": {}}).model_copy(
        update={
            "warnings": warnings,
            "vendors": dict(sorted(vendors.items())),
            "files": sorted(jit.values(), key=lambda f: f.path),
        }
    )
    return merged, files


def check_covers(ws: Workspace, m: Manifest, partials: list[Partial]) -> None:
    """With ``--workspace``: the merged release is that workspace's, every vendor present."""
    if m.release.name != ws.release.name:
        raise MergeError(
            f"{partials[0].folder} is a partial of {m.release.name}, the workspace "
            f"{ws.root} builds {ws.release.name}: merge the partials of one release"
        )
    if m.profile.data() != ws.profile.model_dump(mode="json"):
        field = first_difference(m.profile.data(), ws.profile.model_dump(mode="json"), "profile")
        raise MergeError(
            f"the partials were built with another profile than {ws.root}/kiln.toml's "
            f"{ws.profile_name or 'default'} ({field}): merge one profile's partials "
            f"(--profile NAME), or rerun the jobs from this commit"
        )
    missing = sorted(set(ws.vendors) - set(m.vendors))
    extra = sorted(set(m.vendors) - set(ws.vendors))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"not in vendors/: {', '.join(extra)}"] if extra else []
        )
        raise MergeError(
            f"the partials do not cover the workspace's vendors ({'; '.join(parts)}): "
            f"merge the partials of every job of the plan (`python -m kiln plan`)"
        )


def merge(
    folders: list[Path],
    out: Path,
    workspace: Path | None = None,
    profile: str | None = None,
    sign: str | None = None,
) -> Path:
    """Merge partial release folders into ``out``; return it. With ``workspace``, they
    must cover it with its ``profile`` (a ``[profiles.NAME]``; None: ``[profile]``).
    ``sign``: the key that signs the merged release (a partial's own signature vouches
    for its folder alone, so the merged one is signed anew)."""
    if not folders:
        raise MergeError("manifest merge: name at least one partial release folder")
    key = signing.load_signer(sign) if sign else None
    if out.exists() and any(out.iterdir()) and not (out / manifest.FILE_NAME).exists():
        raise MergeError(
            f"{out} exists and is not a kiln release folder: name a new folder for --out"
        )
    partials = [load(f) for f in folders]
    check_consistent(partials)
    merged, files = combine(partials)
    if workspace is not None:
        ws = Workspace(workspace, profile)
        check_covers(ws, merged, partials)
        if key is None and ws.release.require_signature:
            raise SignatureError(
                f"{ws.root / 'kiln.toml'}: [release] require_signature = true: sign the "
                "merged release: pass --sign KEY-URI (or set KILN_SIGN)"
            )
    release = merged.release.model_copy(
        update={
            "signed_by": key.keyid if key else None,
            "signer_identity": key.identity if key else None,
            "signer_scheme": key.scheme if key else None,
        }
    )
    merged = merged.model_copy(update={"release": release})
    jit = list(merged.files)
    with fsutil.staged_dir(out) as stage:
        for rel, src in sorted(files.items()):
            dest = stage / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
        reqs = (partials[0].folder / REQUIREMENTS).read_text()
        # ``previous`` is none: JIT caches come from the partials, not from whatever
        # ``out`` held before.
        listed = release_files.write_files(stage, merged.model_copy(update={"files": []}), reqs)
        if jit:
            listed = release_files.finish_readme(
                stage, merged.model_copy(update={"files": [*listed, *jit]})
            )
        final = merged.model_copy(update={"files": listed})
        # figures only where a partial of an older kiln carried them in its manifest
        run_file = runrecord.path_for(out / manifest.FILE_NAME)
        manifest.write(stage / manifest.FILE_NAME, final, run_file)
        problems = manifest.check(stage / manifest.FILE_NAME)
        if problems:  # the copy itself went wrong (disk, concurrent writer)
            raise MergeError(f"{stage}: {problems[0].path}: {problems[0].problem} after copying")
        if key is not None:  # last: the envelope vouches for every file of the merge
            signing.sign(stage, final, key)
        fsutil.swap_in(stage, out)
    return out
