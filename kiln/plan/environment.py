"""Build kinds and the environment each build runs in.

The recipe's settings (arch control, job counts, environment) come from the
vendor TOML; this module turns them into an environment and a command. Values
in ``build.env`` may reference other variables as ``${NAME}`` (expanded by
kiln, never by a shell).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from string import Template

from kiln.config.models import Profile, Vendor
from kiln.config.workspace import arch_to_torch

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
    if b.nvcc_drop_flags:
        own["KILN_NVCC_DROP"] = " ".join(b.nvcc_drop_flags)
    if b.cxx_append_flags:
        own["KILN_CXX_APPEND"] = " ".join(b.cxx_append_flags)
    if b.nvcc_append_flags:
        own["KILN_NVCC_APPEND"] = " ".join(b.nvcc_append_flags)
    if b.arch_control == "torch-arch-list":
        own["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_to_torch(a) for a in b.archs)
    if b.arch_control == "rewrite":
        # The wrapper rewrites every nvcc call's arch flags to these (kit/archflags.py).
        # torch's list too, so that a torch extension without arch flags of its own does
        # not ask a GPU-less machine for its GPU; torch refuses family targets ("10.0f"):
        # their generic form covers them (docs/archs.md).
        own["KILN_NVCC_ARCHS"] = " ".join(b.archs)
        own["TORCH_CUDA_ARCH_LIST"] = ";".join(
            dict.fromkeys(arch_to_torch(a.rstrip("f")) for a in b.archs)
        )
    env.update(own)
    for key, value in b.env.items():
        own[key] = env[key] = Template(value).safe_substitute(env)
    recorded = {k: v for k, v in own.items() if k != "PATH"}
    env["MAX_JOBS"] = str(max_jobs)
    if nvcc_threads is not None:
        env["NVCC_THREADS"] = str(nvcc_threads)
    return env, recorded
