"""Facts about the machine a build runs on: CUDA home, nvcc, gcc, the build Python and
its torch. Standard library only: ``python -m kiln.inside probe`` runs this inside the builder
container, where kiln's dependencies are not installed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import TypedDict, cast

from kiln import fsutil
from kiln.errors import ToolchainError
from kiln.inside import proc
from kiln.inside.kit import pipcuda

# torch's facts read from its files, not by importing it (3 CPU-s on 2 cores, before the
# first fetch and compile): its version.py (the version and CUDA torch.version gives) and
# whether libc10.so's symbols carry the C++11 ABI's ``__cxx11`` (torch._C's
# _GLIBCXX_USE_CXX11_ABI); a torch laid out otherwise is imported as before.
PYTHON_PROBE = """\
import importlib.util, json, os, sys, sysconfig
facts = {"python": "%d.%d.%d" % sys.version_info[:3],
         "site_packages": sysconfig.get_paths()["purelib"],
         "torch": None, "torch_cuda": None, "cxx11_abi": None}
spec = importlib.util.find_spec("torch")
if spec is not None and spec.submodule_search_locations:
    root = list(spec.submodule_search_locations)[0]
    try:
        scope = {}
        with open(os.path.join(root, "version.py")) as fh:
            exec(compile(fh.read(), "torch/version.py", "exec"), scope)
        with open(os.path.join(root, "lib", "libc10.so"), "rb") as fh:
            abi = b"__cxx11" in fh.read()
        facts.update(torch=scope["__version__"], torch_cuda=scope.get("cuda"), cxx11_abi=abi)
    except (OSError, KeyError, SyntaxError, ImportError):
        import torch
        facts.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                     cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI))
print(json.dumps(facts))
"""


class PythonFacts(TypedDict):
    """What :data:`PYTHON_PROBE` prints of the build Python."""

    python: str
    site_packages: str
    torch: str | None
    torch_cuda: str | None
    cxx11_abi: bool | None


class Facts(TypedDict, total=False):
    """What :func:`probe` finds where builds run (printed as JSON by ``python -m kiln.inside
    probe`` in a builder container); ``error``: why the rest is missing."""

    cuda_home: str
    python_path: str
    ccache: str | None
    nvcc: str
    gcc: str
    python: str
    site_packages: str
    torch: str | None
    torch_cuda: str | None
    cxx11_abi: bool | None
    pip_cuda: pipcuda.PipCuda
    components: list[dict[str, str]]  # --toolchain pypi: each CUDA wheel (the runner adds)
    error: str


def find_cuda_home(explicit: str | None = None) -> Path:
    """``--cuda-home``, else ``$CUDA_HOME``, else the first of (nvcc's parent on PATH,
    /usr/local/cuda) that is a real toolkit (``bin/nvcc`` and ``include/cuda_runtime.h``).

    torch guesses wrong when nvcc is reached through a symlink or a wrapper script,
    so kiln always passes the result on as ``CUDA_HOME`` explicitly.
    """
    if explicit:
        return Path(explicit)
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent)
    candidates.append(Path("/usr/local/cuda"))
    for home in candidates:
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            return home
    return candidates[-1]


def nvcc_version(cuda_home: Path) -> str:
    nvcc = cuda_home / "bin" / "nvcc"
    if not nvcc.exists():
        raise ToolchainError(
            f"nvcc not found at {nvcc}: install the CUDA toolkit or point --cuda-home "
            f"(or $CUDA_HOME) at one"
        )
    out = proc.output([nvcc, "--version"], error=ToolchainError, what="nvcc --version")
    m = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", out)
    if not m:
        raise ToolchainError(f"{nvcc} --version printed no release number: {out[-200:]!r}")
    return m.group(2)


def gcc_version() -> str:
    cxx = os.environ.get("CXX", "g++")
    return proc.output([cxx, "-dumpfullversion"], error=ToolchainError, what=f"{cxx} version")


def _install_stamp(python: Path) -> str | None:
    """What changes when the Python or its packages change: the interpreter's and its
    venv's files, and every site-packages folder (installing or removing a package adds
    or removes entries there). None where the layout is not a plain prefix."""
    prefix = python.parent.parent
    sites = sorted(prefix.glob("lib/python3*/site-packages"))
    if not sites:
        return None
    paths = [python, python.resolve(), prefix / "pyvenv.cfg", *sites]
    paths += [p for s in sites for p in (s / "torch", s / "torch" / "version.py")]
    stamp = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            stamp.append(f"{p}:-")
            continue
        stamp.append(f"{p}:{st.st_mtime_ns}:{st.st_size}:{st.st_ino}")
    return hashlib.sha256("\n".join(stamp).encode()).hexdigest()


def python_facts(python: Path, cache: Path | None = None, save: bool = True) -> PythonFacts:
    """The build Python's version, site-packages and torch. Importing torch takes
    seconds, so with ``cache`` the answer is kept per install stamp (a no-op build
    should take about a second): probed once under the entry's lock by builds that share
    the cache, renamed into place. ``save=False`` (a dry run) reads a kept answer but
    never writes one."""
    stamp = _install_stamp(python) if cache is not None else None
    saved = cache / f"python-{stamp}.json" if cache is not None and stamp else None
    found = _read(saved)
    if found is not None:
        return found
    if saved is None or not save:
        return _probe_python(python)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(fsutil.making(saved, f"the facts of the build Python {python}"))
        except OSError:  # a cache kiln cannot write: probe, keep nothing
            return _probe_python(python)
        found = _read(saved)
        if found is None:
            found = _probe_python(python)
            with contextlib.suppress(OSError):
                fsutil.write_atomic(saved, json.dumps(found))
    return found


def _read(saved: Path | None) -> PythonFacts | None:
    """A kept answer of the probe (kiln wrote it: a JSON object of the probe's keys)."""
    if saved is None or not saved.is_file():
        return None
    with contextlib.suppress(ValueError, OSError):
        data = json.loads(saved.read_text())
        return cast(PythonFacts, data) if isinstance(data, dict) else None
    return None


def _probe_python(python: Path) -> PythonFacts:
    raw = proc.output(
        [python, "-c", PYTHON_PROBE],
        error=ToolchainError,
        what=f"reading the build Python {python}",
    )
    facts: PythonFacts = json.loads(raw.splitlines()[-1])  # PYTHON_PROBE's line
    return facts


def missing_system(
    requirements: list[dict[str, str]], include_dirs: list[str]
) -> list[dict[str, str]]:
    """The declared system files (``build.system``) this machine lacks: a header the C++
    compiler cannot include (with kiln's pip-CUDA include folders added), a library the
    linker does not find."""
    cxx = os.environ.get("CXX", "g++")
    cc = os.environ.get("CC", "gcc")
    have = [p for p in os.environ.get("CPLUS_INCLUDE_PATH", "").split(os.pathsep) if p]
    env = {**os.environ, "CPLUS_INCLUDE_PATH": os.pathsep.join([*have, *include_dirs])}
    missing = []
    for req in requirements:
        if req.get("header"):
            res = proc.run(
                [cxx, "-E", "-x", "c++", "-o", os.devnull, "-include", req["header"], os.devnull],
                env=env,
                check=False,
            )
            ok = res.returncode == 0
        else:
            lib = req.get("library", "")
            ok = any(
                Path(p).is_absolute() and Path(p).exists()
                for p in (
                    proc.run([cc, f"-print-file-name=lib{lib}{ext}"], check=False).output.strip()
                    for ext in (".so", ".a")
                )
            )
        if not ok:
            missing.append(req)
    return missing


def probe(python: Path, cuda_home: Path, cache: Path | None = None, save: bool = True) -> Facts:
    """Everything, with a failure recorded as ``error`` instead of raised (so a container
    can report it as data). ``save``: see :func:`python_facts`."""
    facts: Facts = {
        "cuda_home": str(cuda_home),
        "python_path": str(python),
        "ccache": shutil.which("ccache"),
    }
    try:
        facts["nvcc"] = nvcc_version(cuda_home)
        facts["gcc"] = gcc_version()
        found = python_facts(python, cache, save)
        facts["python"], facts["site_packages"] = found["python"], found["site_packages"]
        facts["torch"], facts["torch_cuda"] = found["torch"], found["torch_cuda"]
        facts["cxx11_abi"] = found["cxx11_abi"]
        facts["pip_cuda"] = pipcuda.discover(
            found["site_packages"], str(cuda_home), os.environ.get("CC", "gcc")
        )
    except ToolchainError as exc:
        facts["error"] = str(exc)
    return facts
