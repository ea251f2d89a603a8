"""Build kinds and the environment each build runs in.

The recipe's settings (arch control, job counts, environment) come from the
vendor TOML; this module turns them into an environment and a command. Values
in ``build.env`` may reference other variables as ``${NAME}`` (expanded by
kiln, never by a shell).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from string import Template

from kiln import proc
from kiln.config import Profile, Vendor, arch_to_torch
from kiln.errors import BuildError

# Variables that would leak the caller's machine into the build.
_SCRUBBED = (
    "TORCH_CUDA_ARCH_LIST",
    "PYTHONPATH",
    "PIP_REQUIRE_VIRTUALENV",
    "MAX_JOBS",
    "NVCC_THREADS",
    "CUDA_PATH",
)


def build_environment(
    vendor: Vendor,
    profile: Profile,
    cuda_home: str,
    source_date_epoch: int,
    base: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(full environment, the part kiln and the recipe set: recorded in the manifest)."""
    env = dict(os.environ if base is None else base)
    for key in _SCRUBBED:
        env.pop(key, None)
    b = vendor.build
    own: dict[str, str] = {
        "CUDA_HOME": cuda_home,
        "PATH": f"{cuda_home}/bin:{env.get('PATH', '/usr/bin:/bin')}",
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "MAX_JOBS": str(b.max_jobs),
        "PYTHONNOUSERSITE": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if b.nvcc_threads is not None:
        own["NVCC_THREADS"] = str(b.nvcc_threads)
    if b.arch_control == "torch-arch-list":
        own["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_to_torch(a) for a in b.archs)
    env.update(own)
    for key, value in b.env.items():
        own[key] = env[key] = Template(value).safe_substitute(env)
    recorded = {k: v for k, v in own.items() if k != "PATH"}
    return env, recorded


def clean_tree(tree: Path) -> None:
    """Remove stale build state that ninja would otherwise reuse."""
    for stale in [tree / "build", tree / "dist", *tree.glob("*.egg-info")]:
        if stale.is_dir():
            shutil.rmtree(stale)


def build_wheel(
    python: Path, tree: Path, out_dir: Path, env: Mapping[str, str], log_file: Path, what: str
) -> Path:
    """``pip wheel --no-build-isolation`` in ``tree``; returns the one wheel it made."""
    clean_tree(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.whl"))
    proc.run(
        [
            python,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-cache-dir",
            "--verbose",
            "--wheel-dir",
            out_dir,
            tree,
        ],
        cwd=tree,
        env=env,
        log_file=log_file,
        what=f"building {what}",
        error=BuildError,
    )
    made = sorted(set(out_dir.glob("*.whl")) - before)
    if len(made) != 1:
        raise BuildError(f"building {what} made {len(made)} wheels, expected one; see {log_file}")
    return made[0]


def run_inplace(
    command: list[str], tree: Path, env: Mapping[str, str], log_file: Path, what: str
) -> Path:
    """Run the upstream's own build command in its tree (e.g. ``./build.sh``)."""
    proc.run(
        command,
        cwd=tree,
        env=env,
        log_file=log_file,
        what=f"building {what} in place",
        error=BuildError,
    )
    return tree
