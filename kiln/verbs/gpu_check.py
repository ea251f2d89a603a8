"""``kiln gpu-test``: an upstream's own GPU test against the wheel of a release.

A recipe may declare its upstream's GPU test (``[build.gpu_test]``: the files of the
pinned tree it needs and the command). On a machine with a GPU, kiln then:

1. checks the release against its manifest (``manifest check``: the wheel tested is the
   one released, byte for byte);
2. makes a fresh virtual environment on top of the test Python (``--python``, which
   holds torch with CUDA; ``--system-site-packages``, so torch is not downloaded) and
   installs exactly the release's wheel of that vendor into it, nothing else;
3. takes the test's files from the pinned commit (through kiln's source cache and its
   mirrors, as a build does) into a scratch folder, never from a work tree;
4. runs the command there, the environment's ``bin/`` first on ``PATH``, and writes the
   result, the GPU (``nvidia-smi``), the driver, torch and the log beside the manifest:
   ``gpu-tests/<vendor>.json`` and ``gpu-tests/<vendor>.log`` (not release files: the
   manifest does not list them and ``publish`` does not send them).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TypedDict

from kiln.config.models import GpuTest
from kiln.errors import GpuTestError
from kiln.fsutil import sha256_file
from kiln.inside import proc
from kiln.release import manifest
from kiln.release.manifest import Manifest, VendorEntry
from kiln.sources.checkout import GitCache
from kiln.sources.git import git

log = logging.getLogger(__name__)

RESULTS_DIR = "gpu-tests"
GPU_QUERY = "name,driver_version,memory.total,compute_cap"


def gpu_facts() -> list[dict[str, str]]:
    """The GPUs ``nvidia-smi`` sees (none: an error, there is nothing to test on)."""
    try:
        res = proc.run(
            ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader"],
            check=False,
            error=GpuTestError,
        )
    except GpuTestError as exc:
        raise GpuTestError(f"no GPU here: {exc}; run kiln gpu-test on a GPU machine") from None
    if res.returncode != 0 or not res.output.strip():
        raise GpuTestError(
            f"nvidia-smi found no GPU ({res.output.strip()[-200:]}); run on a GPU machine"
        )
    keys = GPU_QUERY.split(",")
    return [
        dict(zip(keys, (c.strip() for c in line.split(",")), strict=False))
        for line in res.output.strip().splitlines()
    ]


def _files_from_commit(
    cache: GitCache, url: str, commit: str, files: list[str], dest: Path, vendor: str
) -> None:
    """The listed paths of ``commit`` into ``dest`` (``git archive``; unpacked with the
    ``data`` filter, so no member lands outside ``dest``)."""
    full = cache.resolve(url, commit, vendor)
    repo = cache.bare(url)
    listed = git("ls-tree", "--name-only", "-z", full, "--", *files, cwd=repo, error=GpuTestError)
    found = set(listed.output.split("\0"))
    absent = [f for f in files if f.rstrip("/") not in found]
    if absent:
        raise GpuTestError(
            f"{vendor}: build.gpu_test.files: {', '.join(absent)} not in {url} at {full[:12]}; "
            f"fix the list in the vendor TOML"
        )
    archive = dest.parent / f"{vendor}-test-files.tar"
    git("archive", "--format=tar", "-o", archive, full, "--", *files, cwd=repo, error=GpuTestError)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()


def _wheel_of(entry: VendorEntry, release: Path, vendor: str) -> Path:
    wheels = entry.outputs_of("wheel")
    if len(wheels) != 1:
        raise GpuTestError(f"{vendor}: the release holds {len(wheels)} wheels of it, not one")
    return release / wheels[0].path


SITE_DIRS = (
    "import json, site, sysconfig; p = sysconfig.get_paths();"
    "print(json.dumps([p['purelib'], p['platlib'], *site.getsitepackages()]))"
)


def _make_env(python: str, env_dir: Path, wheel: Path, log_file: Path) -> Path:
    """A venv whose own site-packages (the wheel) comes first and the test Python's
    packages (torch) after: a ``.pth`` naming them. ``--system-site-packages`` would not
    do where the test Python is itself a venv (it gives the base interpreter's)."""
    proc.run(
        [python, "-m", "venv", env_dir],
        error=GpuTestError,
        log_file=log_file,
        what="creating the test environment",
    )
    test_python = env_dir / "bin" / "python"
    base = json.loads(proc.output([python, "-c", SITE_DIRS], error=GpuTestError))
    own = proc.output(
        [test_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    )
    dirs = list(dict.fromkeys(d for d in base if Path(d).is_dir() and d != own))
    # addsitedir, not a plain path: the test Python's own .pth files (editable installs,
    # path hooks) count too.
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
    (Path(own) / "_kiln_test_python.pth").write_text(lines)
    proc.run(
        [test_python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel],
        error=GpuTestError,
        log_file=log_file,
        what=f"installing {wheel.name} into the test environment",
    )
    return test_python


class TorchFacts(TypedDict):
    """The test environment's Python and torch, as it printed them."""

    python: str
    torch: str
    torch_cuda: str | None
    cuda_available: bool


class WheelTested(TypedDict):
    path: str
    sha256: str


class GpuTestResult(TypedDict):
    """One vendor's GPU test (``gpu-test/<vendor>.json`` in the release folder)."""

    vendor: str
    wheel: WheelTested
    source: dict[str, str]  # url, commit
    files: list[str]
    command: list[str]
    returncode: int
    passed: bool
    timed_out: bool
    duration_s: float
    gpus: list[dict[str, str]]
    environment: TorchFacts
    log: str


def _torch_facts(python: Path) -> TorchFacts:
    code = (
        "import json, sys, torch; print(json.dumps({'python': sys.version.split()[0], "
        "'torch': torch.__version__, 'torch_cuda': torch.version.cuda, "
        "'cuda_available': torch.cuda.is_available()}))"
    )
    res = proc.run([python, "-c", code], check=False)
    try:
        facts: TorchFacts = json.loads(res.output.strip().splitlines()[-1])  # the line above's
        return facts
    except (ValueError, IndexError):
        raise GpuTestError(
            f"the test Python has no usable torch: {res.output.strip()[-300:]}; pass --python "
            f"with a Python whose torch has CUDA"
        ) from None


def run_one(release: Path, m: Manifest, vendor: str, python: str, cache: GitCache) -> GpuTestResult:
    entry = m.vendors[vendor]
    spec = GpuTest.model_validate(entry.recipe["gpu_test"])
    wheel = _wheel_of(entry, release, vendor)
    out_dir = release / RESULTS_DIR
    out_dir.mkdir(exist_ok=True)
    log_file = out_dir / f"{vendor}.log"
    log_file.write_text("")
    gpus = gpu_facts()
    with tempfile.TemporaryDirectory(prefix=f"kiln-gpu-test-{vendor}-") as tmp:
        root = Path(tmp)
        src = entry.source
        _files_from_commit(cache, src.url, src.commit, spec.files, root / "tree", vendor)
        test_python = _make_env(python, root / "env", wheel, log_file)
        facts = _torch_facts(test_python)
        if not facts["cuda_available"]:
            raise GpuTestError(f"torch {facts['torch']} in {python} sees no CUDA device")
        env = {
            **os.environ,
            **spec.env,
            "PATH": f"{root / 'env' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "VIRTUAL_ENV": str(root / "env"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        log.info("%s: running %s on %s", vendor, " ".join(spec.command), gpus[0]["name"])
        started = time.monotonic()
        try:
            res = proc.run(
                spec.command,
                cwd=root / "tree",
                env=env,
                log_file=log_file,
                check=False,
                echo=True,
                timeout=spec.timeout_s,
                error=GpuTestError,
            )
            rc, timed_out = res.returncode, False
        except subprocess.TimeoutExpired:
            rc, timed_out = -9, True
    result: GpuTestResult = {
        "vendor": vendor,
        "wheel": {"path": str(wheel.relative_to(release)), "sha256": sha256_file(wheel)},
        "source": {"url": entry.source.url, "commit": entry.source.commit},
        "files": spec.files,
        "command": spec.command,
        "returncode": rc,
        "passed": rc == 0,
        "timed_out": timed_out,
        "duration_s": round(time.monotonic() - started, 1),
        "gpus": gpus,
        "environment": facts,
        "log": f"{RESULTS_DIR}/{vendor}.log",
    }
    (out_dir / f"{vendor}.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def gpu_test(
    release: Path, vendors: list[str] | None, python: str, cache: GitCache
) -> list[GpuTestResult]:
    """Run the declared GPU tests of ``vendors`` (default: every vendor that has one)."""
    mf = release / manifest.FILE_NAME
    m = manifest.read(mf)
    problems = manifest.check(mf)
    if problems:
        raise GpuTestError(
            f"{release}: {problems[0].path}: {problems[0].problem}; the release no longer "
            f"matches its manifest, so its wheel is not the one to test"
        )
    declared = [n for n, e in m.vendors.items() if e.recipe.get("gpu_test")]
    chosen = vendors or declared
    for name in chosen:
        if name not in m.vendors:
            raise GpuTestError(f"{name}: not in {release} (vendors: {', '.join(m.vendors)})")
        if name not in declared:
            raise GpuTestError(
                f"{name}: its recipe declares no GPU test: add [build.gpu_test] (files, "
                f"command) to vendors/{name}.toml"
            )
    if not chosen:
        raise GpuTestError(f"{release}: no vendor declares a GPU test ([build.gpu_test])")
    results = [run_one(release, m, n, python, cache) for n in chosen]
    shutil.rmtree(release / RESULTS_DIR / ".tmp", ignore_errors=True)
    return results
