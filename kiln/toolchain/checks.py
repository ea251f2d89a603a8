"""What compiles, checked against the profile: nvcc, gcc, the build Python and its torch.

The facts come from wherever the build runs (:mod:`kiln.facts`, here or inside the
builder container); the checks run before any fetch or compile, so a wrong machine
fails in a second, not an hour.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kiln.config.models import Profile
from kiln.errors import ToolchainError
from kiln.inside.facts import Facts, find_cuda_home, nvcc_version
from kiln.inside.kit.pipcuda import PipCuda

__all__ = ["Toolchain", "check_cuda", "cuobjdump", "find_cuda_home", "nvcc_version", "problems"]


@dataclass(frozen=True)
class Toolchain:
    cuda_home: str
    nvcc_version: str
    gcc_version: str
    python: str
    python_version: str
    site_packages: str
    torch_version: str | None
    torch_cuda: str | None
    torch_cxx11_abi: bool | None
    # --toolchain pypi: each hash-pinned CUDA wheel (name, version, sha256)
    components: tuple[dict[str, str], ...] = ()
    # What the build Python's pip CUDA offers where builds run (kiln.inside.kit.pipcuda):
    # headers, libraries, missing link names, how -lcuda is satisfied.
    pip_cuda: PipCuda | None = field(default=None, hash=False)
    # Where builds run, ccache's path (the compiler cache); not part of the identity.
    ccache: str | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["components"] = list(self.components)  # as it reads back from JSON
        del data["ccache"]
        return data

    @classmethod
    def from_facts(cls, facts: Facts) -> Toolchain:
        if "error" in facts:
            raise ToolchainError(facts["error"])
        return cls(
            cuda_home=facts["cuda_home"],
            nvcc_version=facts["nvcc"],
            gcc_version=facts["gcc"],
            python=facts["python_path"],
            python_version=facts["python"],
            site_packages=facts["site_packages"],
            torch_version=facts["torch"],
            torch_cuda=facts["torch_cuda"],
            torch_cxx11_abi=facts["cxx11_abi"],
            components=tuple(facts.get("components", ())),
            pip_cuda=facts.get("pip_cuda") or None,
            ccache=facts.get("ccache"),
        )


def check_cuda(version: str, cuda_home: str, profile: Profile) -> None:
    """Any other CUDA major.minor than the profile's is an error (spill checks,
    minimum-version asserts and JIT cache keys all depend on it)."""
    if ".".join(version.split(".")[:2]) != profile.cuda:
        kind = "major" if int(version.split(".")[0]) != profile.cuda_major else "minor"
        raise ToolchainError(
            f"nvcc at {cuda_home} is CUDA {version} (another {kind} version), the profile asks "
            f"for CUDA {profile.cuda}: run inside the profile's builder image "
            f"({profile.image or 'see kiln.toml'}) or point --cuda-home at CUDA {profile.cuda}"
        )


def problems(tc: Toolchain, profile: Profile) -> list[str]:
    """What in the toolchain does not match the profile."""
    errors: list[str] = []
    try:
        check_cuda(tc.nvcc_version, tc.cuda_home, profile)
    except ToolchainError as exc:
        errors.append(str(exc))
    py_mm = ".".join(tc.python_version.split(".")[:2])
    if py_mm != profile.python:
        errors.append(
            f"build Python {tc.python} is {tc.python_version}, the profile asks for "
            f"{profile.python}: pass --python with a Python {profile.python}"
            + (f" that has torch {profile.torch}" if profile.torch else "")
        )
    if profile.torch is None:
        return errors
    if tc.torch_version != profile.torch:
        errors.append(
            f"torch in {tc.python} is {tc.torch_version or 'not installed'}, the profile pins "
            f"{profile.torch}: install torch=={profile.torch} there (a different torch means "
            f"a different ABI)"
        )
    elif tc.torch_cuda is None:
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
        import nvidia.cu13

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
