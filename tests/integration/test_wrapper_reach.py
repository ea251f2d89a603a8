"""kiln's compiler wrapper reaches every compile a build runs, or the build is refused on
its first screen (issue 40): two in-place upstreams whose own build.sh compiles a kernel
with nvcc for a generic arch (sm_90: under ``arch_control = "rewrite"`` it covers both
SM100 archs) and links it into a Python module, built by ``kiln build`` with real nvcc,
g++ and cuobjdump.

- ``by-name`` calls ``nvcc`` by name: kiln's wrapper is first on the build's PATH, so
  the rewrite reaches it and the tree carries sm_100a and sm_103a.
- ``by-path`` spells out ``"$CUDA_HOME/bin/nvcc"``: the object it makes has no record of
  the wrapper's, and the build is refused naming the object and build.sh's line; the
  printed fix, applied as a patch, makes the next build release both archs.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import pytest
import tomlkit

from kiln.sources.gitrepo import CommitSpec, make_repo
from tests import landing
from tests.conftest import artifacts_files, compiled_units
from tests.integration.test_import_proof import PROFILE_NO_TORCH, _build
from tests.workspace import write

BASE_URL = "https://reach.invalid/"
NVCC_FLAGS = "-c -Xcompiler -fPIC -O2 -arch=sm_90 csrc/kernel.cu -o build/kernel.o"
BUILD_SH = """\
#!/usr/bin/env bash
# builds landing/_C in place: the kernel with nvcc, the module with $CXX
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p build
{nvcc} {flags}
inc=$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ext=$(python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
"$CXX" -c -fPIC -O2 csrc/ops.cpp -o build/ops.o
"$CXX" -c -fPIC -O2 -I"$inc" csrc/module.cpp -o build/module.o
"$CXX" -shared -o "landing/_C$ext" build/module.o build/ops.o build/kernel.o \\
  -L"$CUDA_HOME/lib64" -lcudart_static -lrt -lpthread -ldl
"""
CALLS = {"by-name": "nvcc", "by-path": '"$CUDA_HOME/bin/nvcc"'}


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("reach")
    commits = {}
    for name, nvcc in CALLS.items():
        files = {k: v for k, v in landing.BASE.items() if k != "setup.py"} | {
            "build.sh": BUILD_SH.format(nvcc=nvcc, flags=NVCC_FLAGS)
        }
        commits[name] = make_repo(
            root / f"{name}.git", [CommitSpec(name, files, executable={"build.sh"})]
        )[0]
    (root / "mirrors.toml").write_text(f'[mirrors]\n"{BASE_URL}" = "{root}/"\n')
    return root, commits


def _vendor(name: str, commit: str) -> dict:
    return {
        "source": {"url": f"{BASE_URL}{name}.git", "commit": commit, "license": "LICENSE"},
        "build": {
            "kind": "inplace",
            "command": ["./build.sh"],
            "outputs": ["landing/_C*.so"],
            "import_check": "landing._C",
            "archs": ["sm_100a", "sm_103a"],
            "arch_control": "rewrite",
            "mem_per_job_gib": 1.0,
        },
    }


def test_every_compile_goes_through_the_wrapper_or_the_build_names_the_one_that_did_not(
    tmp_path: Path, upstreams: tuple[Path, dict[str, str]], build_python: Path
) -> None:
    root, commits = upstreams
    ws = write(
        tmp_path / "ws",
        {name: _vendor(name, commit) for name, commit in commits.items()},
        profile=PROFILE_NO_TORCH,
    )
    res = _build(tmp_path, ws, root / "mirrors.toml", build_python)
    assert res.returncode != 0, res.stderr[-3000:]
    assert artifacts_files(tmp_path / "artifacts") == []
    err = res.stderr
    assert (
        "building by-path: 1 object compiled without kiln's compiler wrapper: build/kernel.o"
    ) in err, err[-3000:]
    line = re.search(r"^    (build\.sh):(\d+): (.+)$", err, re.M)
    assert line and line[3] == f'"$CUDA_HOME/bin/nvcc" {NVCC_FLAGS}', err[-3000:]
    fix = re.search(
        r"fix: call the compiler as the environment names it in (\S+):(\d+) "
        r'\(e\.g\. (".+?") for (".+?")\)',
        err,
    )
    assert fix and (fix[1], fix[2]) == (line[1], line[2]), err[-3000:]
    # the other vendor went on: nvcc by name is the wrapper, the rewrite reached it
    assert "by-name: " in err and "verified (sm_100a, sm_103a)" in err, err[-3000:]

    # the fix, as printed: the compiler as the environment names it, in a patch
    before = BUILD_SH.format(nvcc=CALLS["by-path"], flags=NVCC_FLAGS)
    after = before.replace(fix[4], fix[3], 1)
    patch = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            "a/build.sh",
            "b/build.sh",
        )
    )
    (ws / "patches").mkdir(exist_ok=True)
    (ws / "patches" / "by-path-nvcc.patch").write_text(patch)
    (ws / "patches" / "series.toml").write_text(
        tomlkit.dumps(
            {
                "tags": {"by-path": "wrapped"},
                "patch": [{"file": "by-path-nvcc.patch", "target": "by-path"}],
            }
        )
    )
    res = _build(tmp_path, ws, root / "mirrors.toml", build_python)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((tmp_path / "artifacts/test-release/manifest.json").read_text())
    for name in CALLS:
        (tarball,) = [o for o in manifest["vendors"][name]["outputs"] if o["kind"] == "tarball"]
        assert [so["sass"] for so in tarball["shared_objects"]] == [["sm_100a", "sm_103a"]]


def test_a_parallel_build_ext_with_two_modules_under_rewrite_gives_each_both_archs(
    tmp_path: Path, build_python: Path
) -> None:
    """Issue 40: a setup.py whose build_ext builds its extension modules at once (threads)
    and compiles each one's kernel for a generic arch: the rewrite reaches every compile,
    so both shared objects carry sm_100a and sm_103a."""
    cases = landing.make(tmp_path / "landing")
    recipe = landing.vendor("parallel-two", cases.commits["parallel-two"], arch_control="rewrite")
    ws = write(tmp_path / "ws", {"parallel-two": recipe}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((tmp_path / "artifacts/test-release/manifest.json").read_text())
    (wheel,) = [o for o in manifest["vendors"]["parallel-two"]["outputs"] if o["kind"] == "wheel"]
    found = {so["path"].split(".cpython")[0]: so["sass"] for so in wheel["shared_objects"]}
    assert found == {"landing/_C": ["sm_100a", "sm_103a"], "landing/_C2": ["sm_100a", "sm_103a"]}


CXX20_KERNEL = (
    "#include <concepts>\n"
    "template <typename T> concept Floaty = std::floating_point<T>;\n"
    "template <Floaty T> __device__ T twice(T x) { return x + x; }\n"
    "__global__ void k(float* x) { x[0] = twice(x[0]); }\n"
    'extern "C" int landing_launch(float* x, int n) { k<<<1, 1>>>(x); return 0; }\n'
)


def test_the_printed_standard_fix_reaches_an_in_place_builds_nvcc(
    tmp_path: Path, build_python: Path
) -> None:
    """Issue 41: for a build.sh upstream, nvcc_append_flags = ["-std=c++20"] was printed,
    applied, and the same screen came back (build.sh's nvcc never met kiln's wrapper).
    build.sh calls nvcc by name with -std=c++17 on C++20 code; the printed fix, pasted
    into the recipe as printed, builds."""
    files = {k: v for k, v in landing.BASE.items() if k != "setup.py"} | {
        "build.sh": BUILD_SH.format(nvcc="nvcc", flags=NVCC_FLAGS.replace("-c ", "-c -std=c++17 ")),
        "csrc/kernel.cu": CXX20_KERNEL,
    }
    (commit,) = make_repo(
        tmp_path / "up" / "cxx20.git", [CommitSpec("c", files, executable={"build.sh"})]
    )
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(f'[mirrors]\n"{BASE_URL}" = "{tmp_path / "up"}/"\n')
    ws = write(tmp_path / "ws", {"cxx20": _vendor("cxx20", commit)}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, mirrors, build_python)
    assert res.returncode != 0, res.stderr[-3000:]
    fix = re.search(
        r"fix: add (build\.nvcc_append_flags = \[.*?\]) to (vendors/\S+\.toml)", res.stderr
    )
    assert fix, res.stderr[-3000:]
    key, value = fix[1].removeprefix("build.").split(" = ", 1)
    path = ws / fix[2]
    path.write_text(path.read_text().replace("[build]\n", f"[build]\n{key} = {value}\n", 1))
    res = _build(tmp_path, ws, mirrors, build_python)
    assert res.returncode == 0, res.stderr[-3000:]


def test_a_program_the_command_runs_that_is_missing_is_refused_before_any_compile(
    tmp_path: Path, upstreams: tuple[Path, dict[str, str]], build_python: Path
) -> None:
    """An in-place command running a program the machine lacks (a CMake project's cmake,
    here a made-up tool) is refused before its compile with the program named, not after
    it with the shell's ``not found``; installed there, as the fix says, the build goes on."""
    root, commits = upstreams
    vendor = _vendor("by-name", commits["by-name"])
    vendor["build"]["command"] = ["sh", "-c", "kiln-probe-tool --version && ./build.sh"]
    ws = write(tmp_path / "ws", {"by-name": vendor}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, root / "mirrors.toml", build_python)
    assert res.returncode != 0
    assert (
        "kiln: error: vendors/by-name.toml: build.command runs kiln-probe-tool, not installed "
        "where the build runs (this machine's PATH): install it there (Debian/Ubuntu: "
        "apt-get install kiln-probe-tool)"
    ) in res.stderr, res.stderr[-3000:]
    assert compiled_units(tmp_path / "artifacts") == []
    assert artifacts_files(tmp_path / "artifacts") == []
    # installed where the build runs (on this machine's PATH), the same build releases
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "kiln-probe-tool").write_text("#!/bin/sh\nexit 0\n")
    (tools / "kiln-probe-tool").chmod(0o755)
    path = f"{tools}:{os.environ['PATH']}"
    res = _build(tmp_path, ws, root / "mirrors.toml", build_python, env={"PATH": path})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "by-name: " in res.stderr and "verified (sm_100a, sm_103a)" in res.stderr
