"""arch_control = "rewrite" end to end (docs/archs.md): an upstream whose setup.py hard-codes
``-gencode`` for sm_75 ... sm_120 builds exactly the profile's sm_100a and sm_103a with no
patch (cuobjdump, through kiln's verify, reads the wheel), and one whose unit is written
for sm_90a alone is refused, explained on the first screen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln.errors import BuildError
from kiln.orchestrate import stages
from kiln.sources.gitrepo import CommitSpec, make_repo
from tests.upstreams import HOST_C, INIT_PY, MIT, SETUP_PY
from tests.workspace import write

BASE_URL = "https://archs.invalid/"
# The plain fixture's kernel without its submodule's header: one small unit.
KERNEL = """\
#include <cuda_runtime.h>
__global__ void scale_kernel(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
extern "C" void launch_scale(float* x, float a, int n) {
  scale_kernel<<<(n + 255) / 256, 256>>>(x, a, n);
}
"""


def _vendor(commit: str, dist: str) -> dict[str, Any]:
    return {
        "source": {"url": f"{BASE_URL}archs.git", "commit": commit},
        # no build.archs: the profile's (sm_100a, sm_103a)
        "build": {"kind": "wheel", "arch_control": "rewrite", "env": {"PLAIN_DIST_NAME": dist}},
    }


def test_hard_coded_archs_are_rewritten_to_the_profiles_and_a_foreign_unit_is_refused(
    tmp_path: Path, options
) -> None:
    commits = make_repo(
        tmp_path / "up" / "archs.git",
        [
            CommitSpec(
                "archs: the usual hard-coded list",
                {
                    "setup.py": SETUP_PY,
                    "archs.txt": "sm_75 sm_80 sm_90 sm_100a sm_120\n",
                    "csrc/host.c": HOST_C,
                    "csrc/kernels.cu": KERNEL,
                    "plainext/__init__.py": INIT_PY,
                    "LICENSE": MIT,
                },
            ),
            CommitSpec("archs: Hopper only", {"archs.txt": "sm_90a\n"}),
        ],
    )
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(f'[mirrors]\n"{BASE_URL}" = "{tmp_path / "up"}/"\n')
    ws = write(
        tmp_path / "ws",
        {"wide": _vendor(commits[0], "wideext"), "hopper": _vendor(commits[1], "hopperext")},
    )

    with pytest.raises(BuildError) as info:
        stages.build(options(ws, mirrors=mirrors))
    msg = str(info.value)
    for line in (
        "in csrc/kernels.cu:",
        "    csrc/kernels.cu: written for sm_90a only, none of the archs this build makes "
        "(sm_100a, sm_103a): kiln compiles no unit for an arch it was not written for",
        '  cause: kiln\'s arch rewrite (arch_control = "rewrite") compiles a unit only for '
        "the archs its own flags cover, and csrc/kernels.cu's (sm_90a) cover none of "
        "sm_100a, sm_103a",
        # setup.py runs nvcc itself, silently: the flags to drop are read off the wrapper's
        # refusal (issue 41: "build sm_90a too" is gone: that would be arch-uncovered)
        "  fix: where csrc/kernels.cu's code is valid on sm_100a, sm_103a, drop its own arch "
        "flags so the rewrite gives it the build's archs: build.nvcc_drop_flags = "
        '["-gencode=arch=compute_90a,code=sm_90a"] in vendors/hopper.toml',
        "else leave csrc/kernels.cu out of this build with the upstream's own switch "
        '(arch_control = "toggles" with build.arch_toggles in vendors/hopper.toml) or a patch',
    ):
        assert line in msg, msg
    assert "kept, verified, in the artifact cache: wide" in msg, msg

    # the wide upstream was verified in that run; its release now comes from the cache
    release = stages.build(options(ws, mirrors=mirrors, vendors=("wide",)))
    entry = json.loads((release / "manifest.json").read_text())["vendors"]["wide"]
    assert entry["environment"]["KILN_NVCC_ARCHS"] == "sm_100a sm_103a"
    (wheel,) = [o for o in entry["outputs"] if o["kind"] == "wheel"]
    objects = {o["path"].split(".")[0]: o for o in wheel["shared_objects"]}
    assert objects["plainext/_kernels"]["sass"] == ["sm_100a", "sm_103a"]
    assert objects["plainext/_kernels"]["ptx"] == []
