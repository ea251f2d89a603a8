"""A manifest's two halves: what was built (the release's ``manifest.json``) and how one
run on one machine went (its run record, ``run.json`` in the build's logs folder).

Two builds of the same inputs make the same files, but never take the same seconds,
hit the same caches or get the same memory budget. Kept in ``manifest.json`` those
figures made it differ between two builds, and with it the signed statement, whose
subjects are every file of the release (issue 43): a release could be reproduced but
its envelope never. So the manifest in the release holds only what the inputs decide,
and the figures of the run (per vendor: ``timings``, ``schedule``, ``caches``,
``learned``, each import's seconds and where ``CUDA_HOME`` was; the ``scheduler`` of
the whole build; where this machine kept the toolchain and the build venv: the
toolchain's ``cuda_home``, ``python``, ``site_packages`` and ``pip_cuda`` paths) go to
``artifacts/logs/<release>/run.json``, tied to the manifest they belong to by its
sha256. :func:`kiln.release.manifest.read` puts them back where the run record of that
very manifest is found, so that kiln's own readers (``kiln timings``,
``--learned-from``, the benchmarks) see one model as before.

These functions work on the JSON form (what is read from and written to disk).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

FILE_NAME = "run.json"
SCHEMA_ID = "kiln.run/1"
RUN_KEYS = ("timings", "schedule", "caches", "learned")  # of a vendor's entry
SECONDS = "import_seconds"  # output path -> [the proof's seconds, each module's]
# Where this machine keeps the toolchain and the build venv (kiln's cache, --python):
# another machine, or another --cache, builds the same bytes from elsewhere.
WHERE_TOOLCHAIN = ("cuda_home", "python", "site_packages")
WHERE_ENV = ("CUDA_HOME",)  # of a vendor's environment
PIP_CUDA_KEPT = ("cuda_link",)  # of toolchain.pip_cuda: how -lcuda was met, not a path


def path_for(manifest_file: Path) -> Path:
    """Where the run record of ``artifacts/<release>/manifest.json`` is written:
    ``artifacts/logs/<release>/run.json`` (the build's logs, outside the release)."""
    folder = manifest_file.parent
    return folder.parent / "logs" / folder.name / FILE_NAME


def split(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what was built, the run's figures) of a manifest's JSON form; the first is what
    ``manifest.json`` holds, the second empty where the manifest carried no figures."""
    what = copy.deepcopy(data)
    run: dict[str, Any] = {}
    if "scheduler" in what:
        run["scheduler"] = what.pop("scheduler")
    toolchain = what.get("toolchain", {})
    where = {k: toolchain.pop(k) for k in WHERE_TOOLCHAIN if k in toolchain}
    pip_cuda = toolchain.get("pip_cuda") or {}
    paths = {k: pip_cuda.pop(k) for k in list(pip_cuda) if k not in PIP_CUDA_KEPT}
    if paths:
        where["pip_cuda"] = paths
    if where:
        run["toolchain"] = where
    for name, entry in what.get("vendors", {}).items():
        figures = {k: entry.pop(k) for k in RUN_KEYS if k in entry}
        env = entry.get("environment") or {}
        where_env = {k: env.pop(k) for k in WHERE_ENV if k in env}
        if where_env:
            figures["environment"] = where_env
        seconds = {}
        for out in entry.get("outputs", []):
            proof = out.get("import_proof")
            if proof is None:
                continue
            modules = [m.pop("seconds", None) for m in proof.get("modules", [])]
            seconds[out["path"]] = [proof.pop("seconds", None), *modules]
        if any(s is not None for times in seconds.values() for s in times):
            figures[SECONDS] = seconds
        if figures:
            run.setdefault("vendors", {})[name] = figures
    return what, run


def join(what: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The manifest's whole JSON form again: ``what`` with ``run``'s figures put back."""
    data = copy.deepcopy(what)
    if "scheduler" in run:
        data["scheduler"] = run["scheduler"]
    where = dict(run.get("toolchain") or {})
    if where and "toolchain" in data:
        pip_cuda = where.pop("pip_cuda", None)
        data["toolchain"].update(where)
        if pip_cuda:
            data["toolchain"]["pip_cuda"] = {**data["toolchain"].get("pip_cuda", {}), **pip_cuda}
    for name, figures in run.get("vendors", {}).items():
        entry = data.get("vendors", {}).get(name)
        if entry is None:
            continue
        entry.update({k: v for k, v in figures.items() if k in RUN_KEYS})
        if figures.get("environment"):
            entry["environment"] = {**entry.get("environment", {}), **figures["environment"]}
        for out in entry.get("outputs", []):
            times = figures.get(SECONDS, {}).get(out["path"])
            proof = out.get("import_proof")
            if not times or proof is None:
                continue
            if times[0] is not None:
                proof["seconds"] = times[0]
            for module, s in zip(proof.get("modules", []), times[1:], strict=False):
                if s is not None:
                    module["seconds"] = s
    return data


def text(run: dict[str, Any], manifest_text: str) -> str:
    """The run record's file: its figures and the sha256 of the manifest they belong to."""
    digest = hashlib.sha256(manifest_text.encode()).hexdigest()
    record = {"schema": SCHEMA_ID, "manifest_sha256": digest, **run}
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def read(path: Path, manifest_bytes: bytes) -> dict[str, Any]:
    """The figures of the run record at ``path`` if it belongs to the manifest of
    ``manifest_bytes`` (empty: none there, unreadable, or another build's)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("schema") != SCHEMA_ID:
        return {}
    if record.get("manifest_sha256") != hashlib.sha256(manifest_bytes).hexdigest():
        return {}  # a run record left by another build of this release
    return {k: v for k, v in record.items() if k in ("scheduler", "toolchain", "vendors")}
