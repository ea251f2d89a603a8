"""Builds in place (an engine's own extension, built by its own script): a tree that
ships as a tarball, not as a wheel.

Before the upstream's own build command runs, kiln puts a small kit into the tree's
``.kiln/`` folder: the object cache (``objcache.py`` with compiler wrappers in
``bin/``) and ``rebuild.py``, both stand-alone. The build's compiles go through the
object cache, so the tarball carries every object it made; ``rebuild_c`` on an
installed tree then recompiles only what a patch changed. After the build kiln
verifies the declared outputs (SASS archs), writes ``.kiln/tree.json`` (what was built,
how to rebuild) and ``.kiln/applied/`` (the patches as applied, so an edited patch can
be swapped in later) and packs the tarball. Once it is kept in the artifact cache, the
vendor's build proves that the tree unpacked from it as install.sh unpacks it imports in
the consumer's environment (:mod:`kiln.orchestrate.importproof`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Final

from kiln.config.models import Profile, Vendor
from kiln.errors import ConfigError, VerifyError
from kiln.orchestrate import beforecompile
from kiln.orchestrate.context import run_step, timed
from kiln.orchestrate.kinds.buildkind import Job
from kiln.orchestrate.kit import KIT
from kiln.release import archive, files
from kiln.release.manifest import Output
from kiln.sources.patches import AppliedPatch
from kiln.verify.binaries import SharedObject, check_archs, check_linkage, device_archs, linkage

log = logging.getLogger(__name__)

TREE_FILE = "tree.json"
# Build leftovers that never go into the tarball (the kit's object cache does).
DEFAULT_EXCLUDE = (
    "build",
    "dist",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    ".ninja_log",
    ".ninja_deps",
    "tmpxft_*",
    ".kiln/host",  # links into this machine's CUDA and site-packages (pipcuda, cudashim)
)


def find_outputs(tree: Path, patterns: list[str], what: str) -> list[Path]:
    """The files ``patterns`` match in the tree, never kiln's own ``.kiln/`` (its links
    to this machine's CUDA libraries: ``**/*.so`` would otherwise name them)."""
    found = sorted(
        {
            p
            for pattern in patterns
            for p in tree.glob(pattern)
            if p.is_file() and p.relative_to(tree).parts[0] != KIT
        }
    )
    if not found:
        raise VerifyError(
            f"{what}: the build left none of {', '.join(patterns)} in the tree; "
            f"check build.outputs or the build log"
        )
    return found


def verify_outputs(tree: Path, vendor: Vendor) -> list[SharedObject]:
    objects = []
    for path in find_outputs(tree, vendor.build.outputs, vendor.name):
        sass, ptx = device_archs(path)
        needed, runpath = linkage(path)
        objects.append(SharedObject(str(path.relative_to(tree)), sass, ptx, needed, runpath))
    check_archs(vendor.name, objects, list(vendor.build.archs))
    check_linkage(vendor.name, objects)
    return objects


def write_tree_metadata(
    tree: Path,
    vendor: Vendor,
    commit: str,
    applied: list[AppliedPatch],
    patches_dir: Path,
    recorded_env: dict[str, str],
) -> None:
    kit = tree / KIT
    applied_dir = kit / "applied"
    if applied_dir.exists():
        shutil.rmtree(applied_dir)
    applied_dir.mkdir(parents=True)
    for p in applied:
        shutil.copy2(patches_dir / p.file, applied_dir / p.file)
    machine = {"CUDA_HOME", "PATH", "SOURCE_DATE_EPOCH"}
    meta = {
        "vendor": vendor.name,
        "commit": commit,
        "command": vendor.build.command,
        "rebuild_command": vendor.build.rebuild_command or vendor.build.command,
        "outputs": vendor.build.outputs,
        "archs": list(vendor.build.archs),
        "env": {k: v for k, v in sorted(recorded_env.items()) if k not in machine},
        "patches": [{"file": p.file, "sha256": p.sha256} for p in applied],
    }
    (kit / TREE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def arch_family(archs: list[str]) -> str:
    """``['sm_100a', 'sm_103a']`` -> ``sm100`` (the family name the model card uses)."""
    majors = sorted({a[3:].rstrip("af")[:-1] for a in archs}, key=int)
    return "-".join(f"sm{m}0" for m in majors) or "host"


def tarball_name(vendor: Vendor, commit: str, tag: str, profile: Profile) -> str:
    return (
        f"{vendor.name}-{commit[:7]}-{tag}-{arch_family(list(vendor.build.archs))}-"
        f"{profile.cuda_tag}-{profile.python_tag}.tar.zst"
    )


def pack_tree(tree: Path, dest: Path, vendor: Vendor, mtime: int) -> Path:
    exclude = [*DEFAULT_EXCLUDE, *vendor.build.exclude]
    return archive.pack([(tree, vendor.name)], dest, mtime, exclude)


class InplaceKind:
    name: Final = "inplace"

    def out_dir(self, stage: Path, vendor: Vendor, tree: Path) -> Path:
        return tree

    def outputs(self, job: Job) -> list[Output]:
        ctx, vendor, step, stage, co = job.ctx, job.vendor, job.step, job.stage, job.co
        applied, timings = job.applied, job.timings
        tree = Path(step.spec.tree)
        with timed(timings, "verify"):  # a second, before minutes of compiling
            beforecompile.check_programs(ctx, step, vendor.build.command or [])
            beforecompile.check_cuda_switches(ctx, step)
        with timed(timings, "build"):
            run_step(ctx, step)
        with timed(timings, "verify"):
            objects = verify_outputs(tree, vendor)
        log.info(
            "%s: %s verified (%s)",
            vendor.name,
            ", ".join(o.path for o in objects),
            ", ".join(sorted({a for o in objects for a in o.sass})) or "host only",
        )
        write_tree_metadata(tree, vendor, co.commit, applied, ctx.ws.patches_dir, job.recorded_env)
        tag = ctx.ws.series.tags.get(vendor.name) or ("unpatched" if not applied else None)
        if tag is None:
            raise ConfigError(
                f"patches/series.toml: tags.{vendor.name}: missing; name the patch "
                f'set for the tarball (e.g. tags = {{ {vendor.name} = "patched" }})'
            )
        name = tarball_name(vendor, co.commit, tag, ctx.ws.profile)
        with timed(timings, "package"):
            tarball = pack_tree(tree, stage / name, vendor, co.commit_time)
        ctx.claim(tarball.name, vendor.name)
        extra: dict[str, object] = {"shared_objects": [o.__dict__ for o in objects]}
        # proven by the vendor's build once kept in the artifact cache (vendor.py)
        return [files.output_entry(tarball, stage, "tarball", **extra)]


KIND = InplaceKind()
