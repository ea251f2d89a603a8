"""What compiles: CUDA home and nvcc, the host compiler, the build Python and its torch.

``probe`` reads the facts; ``problems`` compares them with the profile. Both run
before any fetch or compile so a wrong machine fails in a second, not an hour.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from kiln import proc
from kiln.config import Profile
from kiln.errors import ToolchainError

_TORCH_PROBE = (
    "import json, sys, torch, torch.utils.cpp_extension as ce;"
    "print(json.dumps({'python': '%d.%d.%d' % sys.version_info[:3],"
    " 'torch': torch.__version__, 'torch_cuda': torch.version.cuda,"
    " 'cxx11_abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI)}))"
)


@dataclass(frozen=True)
class Toolchain:
    cuda_home: str
    nvcc_version: str
    gcc_version: str
    python: str
    python_version: str
    torch_version: str
    torch_cuda: str | None
    torch_cxx11_abi: bool

    def to_json(self) -> dict[str, object]:
        return asdict(self)


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


def check_cuda(cuda_home: Path, profile: Profile) -> str:
    """nvcc's version; any other CUDA major.minor than the profile's is an error (spill
    checks, minimum-version asserts and JIT cache keys all depend on it)."""
    version = nvcc_version(cuda_home)
    if ".".join(version.split(".")[:2]) != profile.cuda:
        kind = "major" if int(version.split(".")[0]) != profile.cuda_major else "minor"
        raise ToolchainError(
            f"nvcc at {cuda_home} is CUDA {version} (another {kind} version), the profile asks "
            f"for CUDA {profile.cuda}: run inside the profile's builder image "
            f"({profile.image or 'see kiln.toml'}) or point --cuda-home at CUDA {profile.cuda}"
        )
    return version


def probe(python: Path, cuda_home: Path, nvcc: str) -> Toolchain:
    raw = proc.output(
        [python, "-c", _TORCH_PROBE],
        error=ToolchainError,
        what=f"reading torch's version with {python}",
    )
    facts = json.loads(raw.splitlines()[-1])
    return Toolchain(
        cuda_home=str(cuda_home),
        nvcc_version=nvcc,
        gcc_version=gcc_version(),
        python=str(python),
        python_version=facts["python"],
        torch_version=facts["torch"],
        torch_cuda=facts["torch_cuda"],
        torch_cxx11_abi=facts["cxx11_abi"],
    )


def problems(tc: Toolchain, profile: Profile) -> list[str]:
    """What in the build Python and its torch does not match the profile."""
    errors: list[str] = []
    py_mm = ".".join(tc.python_version.split(".")[:2])
    if py_mm != profile.python:
        errors.append(
            f"build Python {tc.python} is {tc.python_version}, the profile asks for "
            f"{profile.python}: pass --python with a Python {profile.python} that has torch "
            f"{profile.torch}"
        )
    if tc.torch_version != profile.torch:
        errors.append(
            f"torch in {tc.python} is {tc.torch_version}, the profile pins {profile.torch}: "
            f"install torch=={profile.torch} there (a different torch means a different ABI)"
        )
    if tc.torch_cuda is None:
        errors.append(f"torch {tc.torch_version} in {tc.python} is a CPU-only build")
    elif int(tc.torch_cuda.split(".")[0]) != profile.cuda_major:
        errors.append(
            f"torch {tc.torch_version} was built for CUDA {tc.torch_cuda}, the profile is CUDA "
            f"{profile.cuda}"
        )
    return errors


def cuobjdump() -> Path:
    """cuobjdump from kiln's own ``nvidia-cuda-cuobjdump`` dependency, else from PATH."""
    try:
        import nvidia.cu13  # type: ignore[import-not-found]

        for base in nvidia.cu13.__path__:
            candidate = Path(base) / "bin" / "cuobjdump"
            if candidate.exists():
                return candidate
    except ImportError:
        pass
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    raise ToolchainError(
        "cuobjdump not found: `pip install nvidia-cuda-cuobjdump` (a kiln dependency) or put "
        "the CUDA toolkit's bin/ on PATH"
    )
