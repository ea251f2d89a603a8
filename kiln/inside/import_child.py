"""``python -m kiln.inside prove SPEC``: import a release's modules where it lands.

Run through the build's runner (here, or in the builder container) once the consumer's
environment holds the wheel (or the unpacked tree); kiln's host side plans the modules
and judges the results (:mod:`kiln.orchestrate.importproof`). Standard library and
:mod:`kiln.inside.proc` only.

Each module is imported by the consumer environment's Python in a process of its own:

- ``-I``: no ``PYTHONPATH``, no user site, no current folder: only what the environment
  itself holds (and its ``.pth`` files) is importable;
- ``LD_BIND_NOW=1``: every symbol of every library it loads is bound at load, so an
  undefined symbol fails the import, not the first call of the function;
- a time limit (an import that hangs is a failure of its own);
- where no GPU driver is found (no ``libcuda.so.1`` loads), a stub answers ``dlopen``:
  the toolkit's ``lib64/stubs/libcuda.so`` (else kiln's, built from ``cuda.h`` as for
  the link, :mod:`kiln.inside.kit.pipcuda`), as ``libcuda.so.1`` in a folder of its own
  on ``LD_LIBRARY_PATH`` for these processes only. It never becomes a dependency: the
  built files were already checked to name the driver, never a stub (verify).

The spec (JSON): ``python`` (the consumer environment's), ``modules`` (each ``name`` and
``preload``: what is imported before it, as its own package would, e.g. torch),
``timeout_s``, ``cuda_home``, ``work`` (a scratch folder), ``out`` (where the results go).
The results (JSON): ``driver`` ("found" or the stub used) and per module its
``returncode``, ``seconds``, ``timed_out``, the output's tail and, when it imported,
``facts`` (its file, and torch's version and file where torch is loaded).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from kiln.inside import proc
from kiln.inside.kit import pipcuda

FACTS_MARK = "KILN-IMPORT-FACTS "


class ModuleSpec(TypedDict):
    name: str
    preload: NotRequired[list[str]]  # imported before it, as its own package would


class ProveSpec(TypedDict):
    """The spec file kiln.orchestrate.importproof writes for one output."""

    python: str  # the consumer environment's
    modules: list[ModuleSpec]
    timeout_s: float
    cuda_home: str | None
    work: str
    out: NotRequired[str]  # where main() writes the results (:class:`Proved`, as JSON)
    jobs: NotRequired[int]  # at once (default: the CPUs)
    # the first module alone, then the rest at once: it compiles the bytecode they share
    first_alone: NotRequired[bool]
    # Where the imports read and write their bytecode (``-X pycache_prefix``): the
    # consumer environment is made without it and stays read-only here.
    pycache: NotRequired[str | None]


class TorchFacts(TypedDict, total=False):
    version: str | None
    file: str | None


class ImportFacts(TypedDict, total=False):
    """What the child printed of what it imported (where the import passed)."""

    file: str | None
    torch: TorchFacts


class Imported(TypedDict):
    """One module's import: its exit, time, output's tail and facts."""

    name: str
    returncode: int
    timed_out: bool
    seconds: float
    output: str
    facts: ImportFacts | None


class Proved(TypedDict):
    driver: str  # how libcuda was found: "found", or the stub kiln put in its place
    modules: list[Imported]


OUTPUT_CHARS = 6000  # the tail kept of each import's output (a traceback fits)

# Imports ``argv[1]`` after ``argv[2:]``; prints what it loaded.
IMPORT_CODE = f"""
import importlib, json, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
mod = importlib.import_module(sys.argv[1])
facts = {{"file": getattr(mod, "__file__", None)}}
torch = sys.modules.get("torch")
if torch is not None:
    facts["torch"] = {{"version": getattr(torch, "__version__", None),
                      "file": getattr(torch, "__file__", None)}}
print({FACTS_MARK!r} + json.dumps(facts), flush=True)
"""

# Environment variables an import keeps from the caller (nothing that selects libraries
# or Python paths: the environment under test decides those).
KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "CUDA_VISIBLE_DEVICES")


def driver_found() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def stub_folder(work: Path, cuda_home: str | None) -> tuple[Path, str]:
    """A folder holding ``libcuda.so.1``: the toolkit's stub, else kiln's (cuda.h's
    driver functions, each returning CUDA_ERROR_STUB_LIBRARY)."""
    folder = work / "libcuda-stub"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    target = folder / pipcuda.STUB_SONAME
    toolkit = Path(cuda_home or "/nonexistent") / "lib64" / "stubs" / "libcuda.so"
    if toolkit.is_file():
        target.symlink_to(toolkit)
        return folder, f"the toolkit's stub {toolkit}"
    headers = [Path(cuda_home or "/nonexistent") / "include" / "cuda.h"]
    cuda_h = next((str(h) for h in headers if h.is_file()), None)
    source = folder / "stub.c"
    source.write_text(pipcuda.stub_source(cuda_h))
    proc.run(
        ["gcc", "-shared", "-nostdlib", f"-Wl,-soname,{pipcuda.STUB_SONAME}", "-o", target, source],
        what="building kiln's libcuda stub for the import proof",
    )
    source.unlink()
    return folder, "kiln's stub of cuda.h's driver functions"


def _environment(stub: Path | None) -> dict[str, str]:
    env = {k: os.environ[k] for k in KEPT if k in os.environ}
    env.update({"LD_BIND_NOW": "1", "PYTHONUNBUFFERED": "1"})
    if stub is not None:
        env["LD_LIBRARY_PATH"] = str(stub)
    return env


def import_one(
    python: str,
    module: ModuleSpec,
    env: dict[str, str],
    timeout_s: float,
    cwd: Path,
    pycache: str | None = None,
) -> Imported:
    """One module imported in a process of its own; its result. ``pycache``: the folder
    its bytecode is read from and written to (``-I`` ignores ``PYTHON*`` variables)."""
    prefix = ["-X", f"pycache_prefix={pycache}"] if pycache else []
    argv = [python, "-I", *prefix, "-c", IMPORT_CODE, module["name"], *module.get("preload", [])]
    started = time.monotonic()
    try:
        res = proc.run(argv, cwd=cwd, env=env, check=False, timeout=timeout_s)
        rc, output, timed_out = res.returncode, res.output, False
    except subprocess.TimeoutExpired as exc:
        raw = exc.output or ""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        rc, output, timed_out = -9, text, True
    seconds = round(time.monotonic() - started, 2)
    facts: ImportFacts | None = None
    kept = []
    for line in output.splitlines():
        if line.startswith(FACTS_MARK):
            try:
                facts = cast(ImportFacts, json.loads(line[len(FACTS_MARK) :]))
            except ValueError:
                facts = None
        else:
            kept.append(line)
    text = "\n".join(kept)
    return {
        "name": module["name"],
        "returncode": rc,
        "timed_out": timed_out,
        "seconds": seconds,
        "output": text[-OUTPUT_CHARS:],
        "facts": facts,
    }


def run(spec: ProveSpec) -> Proved:
    work = Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    stub = None
    driver = "found"
    if not driver_found():
        stub, driver = stub_folder(work, spec.get("cuda_home"))
    env = _environment(stub)
    modules = spec["modules"]

    def one(m: ModuleSpec) -> Imported:
        return import_one(
            spec["python"], m, env, float(spec["timeout_s"]), work, spec.get("pycache")
        )

    first = [one(modules[0])] if spec.get("first_alone") and len(modules) > 1 else []
    rest = modules[len(first) :]
    jobs = max(1, min(len(rest), int(spec.get("jobs") or os.cpu_count() or 1)))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = first + list(pool.map(one, rest))
    return {"driver": driver, "modules": results}


def main(spec_file: Path) -> None:
    spec = cast(ProveSpec, json.loads(spec_file.read_text()))  # kiln's own, just written
    found = run(spec)
    out = Path(spec["out"])
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(json.dumps(found, indent=1, sort_keys=True))
    tmp.replace(out)
