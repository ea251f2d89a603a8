"""The manifest: the single record of how every output of a release was made.

Typed: pydantic models for the manifest, a vendor's entry and an output (``kind`` a
``Literal``); kiln writes and reads it only through them. The JSON Schema
``schemas/manifest.schema.json`` is generated from the models (``python -m kiln manifest
schema``; a test checks that the committed file equals it). Written atomically (temp
file, then rename); a model dumps exactly the fields it was given (``exclude_unset``),
so a manifest read and written again is the same bytes.

Written in two halves (:mod:`kiln.release.runrecord`): ``manifest.json`` holds what the
inputs decide, the same bytes for two builds of them (a signed release's envelope too);
the run's figures (timings, schedules, caches, learned, the proof's seconds) go to the
run record in the build's logs, and :func:`read` puts them back where it finds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiln import fsutil
from kiln.errors import ManifestError
from kiln.fsutil import sha256_file
from kiln.release import runrecord

SCHEMA_ID = "kiln.manifest/1"
FILE_NAME = "manifest.json"
SCHEMA_FILE = "schemas/manifest.schema.json"

Sha40 = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Arch = Annotated[str, Field(pattern=r"^sm_\d{2,3}[af]?$|^compute_\d{2,3}[af]?$")]
OutputKind = Literal["wheel", "tarball", "license", "patch"]
FileKind = Literal[
    "install-script",
    "requirements",
    "rebuild-script",
    "build-script",
    "readme",
    "jit-cache",
    "provenance",
    "sbom",
    "variant-wheel",
    "variants-index",
    "verify-script",
]


class Model(BaseModel):
    """Every manifest model: unknown fields refused, only given fields written."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def data(self) -> dict[str, object]:
        """The JSON form, exactly the fields this was made with."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class JitCacheInfo(Model):
    name: str
    variable: str


class ReleaseInfo(Model):
    name: str
    description: str = ""
    install_root: str | None = None
    jit_caches: list[JitCacheInfo] = Field(default_factory=list)
    hub_repo: str | None = None
    variant_wheels: bool = False
    require_signature: bool = False
    signed_by: str | None = Field(
        default=None,
        description="the keyid (securesystemslib's) of the key whose DSSE envelope "
        "(provenance.intoto.dsse.json) vouches for every file of the release",
    )
    signer_identity: str | None = Field(
        default=None,
        description="a Sigstore keyless signature's signer: its identity (the workflow "
        "that signed) and OIDC issuer; signed_by is the keyid of that identity",
    )
    signer_scheme: str | None = Field(
        default=None,
        description="the signing key's scheme (securesystemslib's: ed25519, "
        "ecdsa-sha2-nistp256, rsassa-pss-sha256, ...): which openssl command checks "
        "SHA256SUMS.sig, as the README writes it out",
    )
    readme_template: str | None = Field(
        default=None, description="the workspace's README template, as a path in it"
    )
    readme_template_text: str | None = Field(
        default=None, description="that template's text (the README is written from it)"
    )


class ProfileInfo(Model):
    """The profile as loaded (a ``[profiles.NAME]`` variant merged in)."""

    cuda: str
    python: str
    torch: str | None
    archs: list[Arch]
    torch_index: str | None = None
    image: str | None = None
    platform: str = "linux_x86_64"
    build_tools: list[str] = Field(default_factory=list)


class Component(Model):
    name: str
    version: str
    sha256: Sha256


class ToolchainInfo(Model):
    """What compiled, read where the build ran (in the container for the Docker runner)."""

    cuda_home: str | None = Field(
        default=None, description="where this machine had it (the run record's)"
    )
    nvcc_version: str
    gcc_version: str
    python: str | None = None
    python_version: str
    site_packages: str | None = None
    torch_version: str | None
    torch_cuda: str | None
    torch_cxx11_abi: bool | None
    components: list[Component] = Field(default_factory=list)
    pip_cuda: dict[str, object] = Field(default_factory=dict)


class RunnerInfo(Model):
    kind: Literal["local", "docker"]
    image: str | None = Field(
        description="the base image by digest (NAME:TAG@sha256:...), 'unpinned:<ref>', "
        "or null for the local runner"
    )
    builder: str | None = Field(
        default=None, description="id of the builder image the steps ran in (Docker runner)"
    )
    network: Literal["isolated", "not isolated"] | None = Field(
        default=None,
        description="whether the build steps could reach the network: 'isolated' (the "
        "Docker runner's network_mode none; the local runner's network namespace of its "
        "own), 'not isolated' (a machine that forbids namespaces)",
    )


class SubmoduleInfo(Model):
    path: str
    url: str
    commit: Sha40
    license: str | None = Field(default=None, description="its license file, in the submodule")
    license_file: str | None = Field(
        default=None, description="its license in the release (licenses/...)"
    )
    license_id: str | None = None


class SourceInfo(Model):
    url: str
    requested: str = Field(description="the SHA as written in the lock")
    commit: Sha40
    commit_time: int = Field(description="committer time; used as SOURCE_DATE_EPOCH")
    submodules: list[SubmoduleInfo]
    license: str | None = Field(default=None, description="the license file's path")
    license_id: str | None = None


class PatchInfo(Model):
    file: str
    sha256: Sha256
    locked_sha256: Sha256 | None
    status: Literal["applied", "already-applied"]


class SharedObjectInfo(Model):
    path: str
    sass: list[Arch]
    ptx: list[Arch]
    needed: list[str] = Field(default_factory=list)
    runpath: list[str] = Field(default_factory=list)


class ImportedModule(Model):
    """One module of the import proof: imported in the consumer's environment (or
    skipped, with the reason: the recipe's, or a GPU it needs and this machine lacks)."""

    module: str
    kind: Literal["extension", "package", "declared"] = Field(
        description="extension: a shared object of the output exporting PyInit_<name>; "
        "package: a top-level package or module; declared: named by the recipe"
    )
    shared_object: str | None = Field(
        default=None, description="the extension's file, as the output holds it"
    )
    status: Literal["ok", "skipped"]
    seconds: float | None = Field(default=None, description="its import's wall time")
    reason: str | None = Field(default=None, description="why it was skipped")


class ImportProof(Model):
    """What the import proof (``kiln/orchestrate/importproof.py``) found: the output installed
    as ``install.sh`` installs it into the consumer's environment, every module imported
    there with ``LD_BIND_NOW=1``, and every ``DT_NEEDED`` entry of its shared objects
    provided by someone."""

    environment: str = Field(description="the consumer environment's key (its inputs' digest)")
    environment_from: Literal["build-python"] | None = Field(
        default=None,
        description="'build-python': the environment was the build Python's own "
        "distributions, checked to meet the requirements by name and version "
        "(--proof-env build-python, a builder without an index); absent: installed from "
        "the requirements as install.sh installs them",
    )
    requirements: str = Field(
        description="what the environment installs: runtime-requirements.lock, "
        "runtime-requirements.txt or the profile's torch"
    )
    python: str
    torch: str | None = Field(default=None, description="the torch the imports loaded")
    driver: str = Field(description="'found', or the libcuda stub that answered dlopen")
    seconds: float | None = Field(
        default=None, description="the proof's wall time (the environment made before)"
    )
    modules: list[ImportedModule]
    needed: dict[str, str] = Field(
        default_factory=dict,
        description="every DT_NEEDED entry of the output's shared objects -> who provides "
        "it where the release lands (the output itself, a distribution of the "
        "environment, the system's C and C++ runtime, the GPU driver, or a declared "
        "system package)",
    )


class Output(Model):
    """One file a vendor made (or carried: its license, its patches)."""

    path: str = Field(description="relative to the manifest's folder")
    sha256: Sha256
    size: Annotated[int, Field(ge=0)]
    kind: OutputKind
    name: str | None = None
    version: str | None = None
    tags: list[str] | None = None
    shared_objects: list[SharedObjectInfo] | None = None
    auditwheel: dict[str, object] | None = None
    import_proof: ImportProof | None = None


class ReleaseFile(Model):
    """A file of the release as a whole (install.sh, README.md, ...)."""

    path: str
    sha256: Sha256
    size: Annotated[int, Field(ge=0)]
    kind: FileKind


class Schedule(Model):
    """What the scheduler chose for a step and what the step used."""

    max_jobs: Annotated[int, Field(ge=1)] = Field(
        description="the compiles the step offers at once: never more than it can run at "
        "one moment (the CPU slots, the memory for its lightest unit, its units)"
    )
    nvcc_threads: int | None = Field(
        default=None,
        description="NVCC_THREADS: the recipe's cap, at most its archs; each unit runs with "
        "no more threads than its own device targets (null: the recipe does not let kiln "
        "set it)",
    )
    mem_per_job_gib: float
    estimate_source: str
    gate_mem_gib: float | None = None
    translation_units: int | None = None
    compiles: int | None = None
    compiles_remote: int | None = Field(None, description="of them, run by sccache-dist servers")
    objcache_hits: int | None = None
    cache_hits: int | None = Field(
        default=None, description="compiles the compiler cache (ccache) answered: none compiled"
    )
    oom_reruns: int | None = Field(
        default=None,
        description="compiles the kernel killed for memory beside others, compiled again alone",
    )
    compile_cpu_s: float | None = None
    compile_wall_s: float | None = None
    gate_wait_s: float | None = None
    peak_job_gib: float | None = Field(
        default=None, description="the step's largest compile, over its process tree"
    )
    peak_rss_gib: float | None = None
    longest_unit: str | None = Field(
        default=None, description="the unit that took the longest here (its path in the tree)"
    )
    longest_unit_s: float | None = Field(default=None, description="its wall seconds")
    link_s: float | None = Field(
        default=None,
        description="wall seconds of the step's compiler runs that are not compiles (its links)",
    )
    critical_path_s: float | None = Field(
        default=None,
        description="longest_unit_s + link_s + the step's packaging and verification: no "
        "number of CPUs builds this step faster",
    )


class LearnedUnit(Model):
    cpu_s: float = Field(description="CPU seconds of its compile")
    rss_gib: float = Field(
        description="its compile's peak memory over its process tree, nvcc threads included "
        "(an older kiln's: its largest process)"
    )


class LearnedVendor(Model):
    """What builds learned of one vendor's recipe: the compile gate's figures, so that
    another machine's first build is scheduled as this one's next (docs/performance.md)."""

    recipe: str = Field(
        description="the fingerprint of the recipe (the vendor's [build], archs included) "
        "they were learned with; figures of another recipe are never used"
    )
    archs: list[Arch] = Field(default_factory=list)
    peak_job_gib: float = Field(
        description="the step's largest compile: per compile, over its process tree ('tree'), "
        "or its largest process (absent: an older kiln's)"
    )
    tail_cpu_s: float = Field(
        default=0.0, description="CPU seconds of the step's links (what follows its last compile)"
    )
    units: dict[str, LearnedUnit] = Field(
        default_factory=dict, description="per translation unit, by its path in the tree"
    )
    memory: Literal["tree"] | None = Field(
        default=None,
        description="'tree': each memory figure is per compile, over its process tree (its "
        "nvcc threads included); absent: an older kiln's figure of the compile's largest "
        "process, taken times the recipe's threads for CUDA units",
    )


class ArtifactCacheInfo(Model):
    status: Literal["hit", "miss", "off"]
    key: str


class DistributedInfo(Model):
    servers: dict[str, int] = Field(description="compiles each sccache-dist build server ran")
    errors: int = Field(description="distributed compiles that failed and ran here instead")


class CompilerCacheInfo(Model):
    tool: str | None = None
    hits: int | None = None
    misses: int | None = None
    local_hits: int | None = None  # sccache: hits from the local folder
    remote_hits: int | None = None  # sccache: hits from the shared store
    errors: int | None = None  # sccache: the store's read and write errors (compiles ran)
    store: Literal["reachable", "unreachable"] | None = None
    warnings: list[str] | None = None
    distributed: DistributedInfo | None = None
    note: str | None = None


class Caches(Model):
    artifact: ArtifactCacheInfo | None = None
    compiler: CompilerCacheInfo | None = None


class VendorEntry(Model):
    """How one upstream's outputs were made."""

    source: SourceInfo
    patches: list[PatchInfo]
    patch_tag: str | None = None
    recipe: dict[str, Any] = Field(description="the vendor TOML's [build], defaults filled")
    environment: dict[str, str]
    toolchain_fixes: dict[str, Any] | None = Field(
        default=None,
        description="what kiln added for the build Python's pip CUDA (kiln/inside/kit/"
        "pipcuda.py), machine paths as ${SITE_PACKAGES}, ${CUDA_HOME}, ${KILN_LINKS}",
    )
    runner: RunnerInfo | None = None
    outputs: list[Output]
    timings: dict[str, float] = Field(default_factory=dict)
    schedule: Schedule | None = None
    caches: Caches | None = None
    learned: LearnedVendor | None = Field(
        default=None,
        description="what kiln knows of this recipe's units after this build (kiln build "
        "--learned-from this manifest starts from it)",
    )

    def outputs_of(self, *kinds: str) -> list[Output]:
        return [o for o in self.outputs if o.kind in kinds]


class Bound(Model):
    """What no schedule on this machine beats, and the build's wall time against it."""

    critical_path_s: float = Field(
        description="the longest unit plus its step's links and packaging (the largest "
        "of the steps' critical_path_s)"
    )
    critical_vendor: str | None = None
    critical_unit: str | None = None
    cpu_floor_s: float = Field(description="compile_cpu_s / cpus")
    compile_cpu_s: float = Field(description="CPU seconds of this build's compiles")
    cpus: int = Field(description="the CPU slots")
    wall_s: float
    provision_s: float = Field(
        default=0.0,
        description="the part of wall_s before the build's first step (loading, provisioning "
        "the toolchain and the build venv): not the steps' schedule's",
    )
    bound_by: Literal["critical path", "CPU floor"] = Field(
        description="the larger of the two: what the build is up against"
    )
    wall_over_bound: float = Field(
        description="(wall_s - provision_s) / max(critical_path_s, cpu_floor_s): the steps' "
        "wall against what no schedule of them beats"
    )


class Scheduler(Model):
    """The run's memory budget and CPU slots, what ran at once, its peak and wall time."""

    mem_gib: float
    cpus: int
    source: str
    cpus_from: str | None = Field(
        default=None,
        description="what bounds the CPU slots: --jobs, affinity, or the cgroup CPU quota",
    )
    steps_at_once: int | None = None
    compiles_at_once: int | None = None
    remote_slots: int | None = Field(
        default=None, description="sccache-dist build-server CPUs the gate could send compiles to"
    )
    distributed_to: str | None = None
    peak_rss_gib: float | None = None
    wall_s: float | None = None
    bound: Bound | None = Field(
        default=None, description="null where nothing compiled (every vendor reused)"
    )


class Manifest(Model):
    """The record of a release: its inputs, toolchain, and every output's sha256."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={"$id": "https://kiln.invalid/manifest.schema.json"},
        title="kiln release manifest",
    )

    schema_id: Literal["kiln.manifest/1"] = Field(alias="schema")
    kiln_version: str
    kiln_commit: str | None = Field(
        default=None,
        description="git describe of kiln's own source (-dirty: uncommitted changes); "
        "null for a copy outside git",
    )
    release: ReleaseInfo
    profile: ProfileInfo
    toolchain: ToolchainInfo
    runner: RunnerInfo
    warnings: list[str] = Field(default_factory=list)
    vendors: dict[str, VendorEntry]
    files: list[ReleaseFile] = Field(
        default_factory=list,
        description="release-level files (install.sh, requirements.txt, rebuild scripts, "
        "JIT caches, README.md)",
    )
    scheduler: Scheduler | None = None

    def outputs(self) -> list[Output | ReleaseFile]:
        """Every file the manifest lists: the vendors' outputs and the release's own."""
        return [o for v in self.vendors.values() for o in v.outputs] + list(self.files)


def json_schema() -> dict[str, Any]:
    """The manifest's JSON Schema, generated from the models."""
    out = Manifest.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **out}


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def committed_schema_text() -> str:
    return resources.files("kiln").joinpath(SCHEMA_FILE).read_text()


def parse(data: dict[str, Any], where: str) -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = "/".join(str(p) for p in err["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ManifestError(f"{where}: {loc}: {err['msg']}{more}") from None


def write(path: Path, manifest: Manifest, run_file: Path | None = None) -> None:
    """``manifest.json`` at ``path`` (what was built, the same bytes for two builds of the
    same inputs) and the run's figures in its run record (:mod:`kiln.release.runrecord`):
    ``run_file``, by default where :func:`read` looks for it."""
    data = parse(manifest.data(), str(path)).data()  # what would read back, validated
    what, run = runrecord.split(data)
    text = json.dumps(what, indent=2, sort_keys=True) + "\n"
    fsutil.write_atomic(path, text)
    if run:
        fsutil.write_atomic(run_file or runrecord.path_for(path), runrecord.text(run, text))


def read(path: Path, with_run: bool = True) -> Manifest:
    """The manifest at ``path``, with the figures of its run where its run record is
    found (``artifacts/logs/<release>/run.json``, written with this very manifest);
    ``with_run=False``: as released, what was built alone."""
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest there (build first)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON: {exc}") from None
    if with_run and isinstance(data, dict):
        data = runrecord.join(data, runrecord.read(runrecord.path_for(path), raw))
    return parse(data, str(path))


@dataclass(frozen=True)
class Mismatch:
    path: str
    problem: str


def check(path: Path) -> list[Mismatch]:
    """Re-hash every listed file; return each difference (empty list: all good)."""
    found = read(path)
    base = path.parent
    problems: list[Mismatch] = []
    for out in found.outputs():
        target = base / out.path
        if not target.is_file():
            problems.append(Mismatch(out.path, "missing"))
            continue
        size = target.stat().st_size
        if size != out.size:
            problems.append(Mismatch(out.path, f"size {size}, manifest says {out.size}"))
            continue
        digest = sha256_file(target)
        if digest != out.sha256:
            problems.append(Mismatch(out.path, f"sha256 {digest}, manifest: {out.sha256}"))
    return problems
