"""Build kinds and the environment each build runs in.

The recipe's settings (arch control, job counts, environment) come from the
vendor TOML; this module turns them into an environment and a command. Values
in ``build.env`` may reference other variables as ``${NAME}`` (expanded by
kiln, never by a shell).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from string import Template

from kiln.config.models import Profile, Vendor
from kiln.config.workspace import arch_to_torch
from kiln.inside.kit import contract

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
    max_jobs: int = 1,
    nvcc_threads: int | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(full environment, the part kiln and the recipe set: recorded in the manifest).

    ``max_jobs``/``nvcc_threads`` are the scheduler's choice for this machine: set in
    the environment but not recorded with it (they change no output byte, and the
    recorded environment goes into the release's README and tarball)."""
    env = dict(os.environ if base is None else base)
    for key in _SCRUBBED:
        env.pop(key, None)
    b = vendor.build
    own: dict[str, str] = {
        "CUDA_HOME": cuda_home,
        "PATH": f"{cuda_home}/bin:{env.get('PATH', '/usr/bin:/bin')}",
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "PYTHONNOUSERSITE": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    # the recipe's flags, which the compiler wrapper applies to every call
    own.update(
        contract.Flags(
            nvcc_drop=tuple(b.nvcc_drop_flags),
            cxx_append=tuple(b.cxx_append_flags),
            nvcc_append=tuple(b.nvcc_append_flags),
        ).to_env()
    )
    if b.arch_control == "torch-arch-list":
        own["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_to_torch(a) for a in b.archs)
    if b.arch_control == "rewrite":
        # The wrapper rewrites every nvcc call's arch flags to these (kit/archflags.py).
        # torch's list too, so that a torch extension without arch flags of its own does
        # not ask a GPU-less machine for its GPU; torch refuses family targets ("10.0f"):
        # their generic form covers them (docs/archs.md).
        also = {k: tuple(v) for k, v in b.arch_also.items()}
        own.update(contract.Archs(rewrite=tuple(b.archs), also=also).to_env())
        own["TORCH_CUDA_ARCH_LIST"] = ";".join(
            dict.fromkeys(arch_to_torch(a.rstrip("f")) for a in b.archs)
        )
    env.update(own)
    for key, value in b.env.items():
        own[key] = env[key] = Template(value).safe_substitute(env)
    if b.arch_control == "rewrite":
        _cmake_archs(own, env, b.archs)
    recorded = {k: v for k, v in own.items() if k != "PATH"}
    # not recorded: the archs the step builds, for its diagnosis (kiln.inside.causes); and
    # under torch-arch-list, the archs each CUDA unit must make (an upstream that maps
    # TORCH_CUDA_ARCH_LIST through a table of its own is stopped at its first compile)
    expect = tuple(b.archs) if b.arch_control == "torch-arch-list" else ()
    env.update(contract.Archs(expect=expect, built=tuple(b.archs)).to_env())
    env["MAX_JOBS"] = str(max_jobs)
    if nvcc_threads is not None:
        env["NVCC_THREADS"] = str(nvcc_threads)
    return env, recorded


def _cmake_archs(own: dict[str, str], env: dict[str, str], archs: list[str]) -> None:
    """Under the rewrite, CMake is told the build's archs (as numbers: the wrapper gives
    each compile the recipe's targets) through ``CUDAARCHS`` and, for scikit-build-core
    and setup.py's CMake, ``CMAKE_ARGS`` (the recipe's own kept before it): a project
    that defaults to ``native`` (AMYPAD/CuVec) otherwise fails its configure where no GPU
    answers ("CUDA_ARCHITECTURES is set to "native", but no GPU was detected")."""
    numbers = ";".join(dict.fromkeys(a.removeprefix("sm_").rstrip("af") for a in archs))
    if not numbers:
        return
    own.setdefault("CUDAARCHS", numbers)
    given = own.get("CMAKE_ARGS", env.get("CMAKE_ARGS", ""))
    if "CMAKE_CUDA_ARCHITECTURES" not in given:
        own["CMAKE_ARGS"] = f"{given} -DCMAKE_CUDA_ARCHITECTURES={numbers}".strip()
    env.update({k: own[k] for k in ("CUDAARCHS", "CMAKE_ARGS")})


def step_files(
    *, gate: Path, hints: Path, guess_gib: float, jobs: Path, mem: Path, failure: Path
) -> dict[str, str]:
    """Where a step's compiles meet the host (the compile gate, its hints, the step's
    records), as the step's environment carries it (kiln.inside.kit.contract.StepFiles)."""
    return contract.StepFiles(
        gate_dir=str(gate),
        gate_hints=str(hints),
        gate_mem_gib=guess_gib,
        job_stats=str(jobs),
        step_mem=str(mem),
        step_failure=str(failure),
    ).to_env()
