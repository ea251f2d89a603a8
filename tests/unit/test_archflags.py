"""arch_control = "rewrite": kiln's compiler wrapper replaces every nvcc call's own arch
flags with the archs the build makes, by the rule of kiln/inside/kit/archflags.py
(docs/archs.md). The parser on every form nvcc accepts, the rule's table, the real nvcc
through the wrapper (cuobjdump reads what it made), the refusal as the user sees it, and
the recipe's archs and environment."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.config.workspace import Workspace
from kiln.errors import ConfigError
from kiln.inside import diagnose
from kiln.inside.kit import archflags, contract, objcache
from kiln.plan.environment import build_environment
from kiln.verify.binaries import device_archs
from tests.workspace import PROFILE, plain_vendor, write

NVCC = "/usr/local/cuda/bin/nvcc"
BUILT = ["sm_100a", "sm_103a"]
BOTH = ["-gencode=arch=compute_100a,code=sm_100a", "-gencode=arch=compute_103a,code=sm_103a"]
ONLY_100A = ["-gencode=arch=compute_100a,code=sm_100a"]
ONLY_103A = ["-gencode=arch=compute_103a,code=sm_103a"]

# The upstream's arch flags -> what the compile gets instead (profile sm_100a + sm_103a).
FORMS: list[tuple[list[str], list[str] | str]] = [
    # the hard-coded list of many setup.py files: generic sm_75 covers both
    (
        [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ("75", "80", "90", "100a", "120")],
        BOTH,
    ),
    (["-gencode", "arch=compute_100a,code=sm_100a"], ONLY_100A),
    (["--generate-code=arch=compute_103a,code=[sm_103a,compute_103a]"], ONLY_103A),
    (["--generate-code", 'arch=compute_103a,code="sm_103a,compute_103a"'], ONLY_103A),
    (["-arch=sm_100a"], ONLY_100A),
    (["-arch", "sm_80"], BOTH),
    (["--gpu-architecture=compute_90"], BOTH),
    (["--gpu-architecture", "sm_103a"], ONLY_103A),
    (["-arch=compute_100a", "-code=sm_100a,compute_100a"], ONLY_100A),
    (["-arch=compute_100f", "--gpu-code=sm_100f"], BOTH),  # the family: 100 and 103
    (["-arch=sm_103f"], ONLY_103A),  # a family target covers no older arch
    (["-arch=sm_120"], "refused"),  # generic, but newer than both
    (["-arch=native"], BOTH),
    (["-arch=all"], BOTH),
    (["-arch=all-major"], BOTH),
    ([], BOTH),  # no arch flag: nvcc's default, the oldest generic arch
    (["-gencode=arch=compute_90a,code=sm_90a"], "refused"),
    (["-arch=sm_90a", "-Xcompiler", "-arch=sm_100a"], "refused"),  # the host compiler's
]


@pytest.mark.parametrize(("flags", "expected"), FORMS, ids=lambda x: " ".join(x) or "none")
def test_every_arch_form_nvcc_accepts_is_rewritten(flags: list[str], expected) -> None:
    args = ["-c", "k.cu", "-o", "k.o", "-O2", *flags, "--threads", "4", "-t", "2"]
    if expected == "refused":
        with pytest.raises(archflags.Refused, match=r"^csrc/k\.cu: written for .* only, none"):
            archflags.rewrite(args, BUILT, "csrc/k.cu")
        return
    # the arch flags replaced where the first stood (none: added at the end); nothing else
    # moved, nvcc's --threads and -t kept
    rest = ["--threads", "4", "-t", "2"]
    want = ["-c", "k.cu", "-o", "k.o", "-O2", *expected, *rest] if flags else [*args, *expected]
    assert archflags.rewrite(args, BUILT, "csrc/k.cu") == want


def test_the_host_compilers_flags_are_not_nvccs() -> None:
    args = ["-c", "k.cu", "-arch=sm_100a", "-Xcompiler", "-arch=sm_90a", "-Xptxas", "-v"]
    assert archflags.rewrite(args, BUILT) == ["-c", "k.cu", *ONLY_100A, *args[3:]]


@pytest.mark.parametrize("flag", ["-E", "-M", "--version", "--list-gpu-arch"])
def test_a_call_that_makes_no_device_code_gets_no_archs(flag: str) -> None:
    assert archflags.rewrite([flag, "k.cu"], BUILT) == [flag, "k.cu"]


# (asked, built) -> covered: the rule (docs/archs.md)
RULE = [
    ("sm_75", "sm_100a", True),  # generic, older: portable code
    ("compute_100", "sm_100a", True),
    ("sm_100", "sm_100f", True),
    ("sm_100", "sm_90a", False),  # generic, newer
    ("sm_120", "sm_100a", False),
    ("sm_100f", "sm_100a", True),  # family: same major, not older, a family target
    ("sm_100f", "sm_103a", True),
    ("sm_100f", "sm_103f", True),
    ("sm_103f", "sm_100a", False),
    ("sm_100f", "sm_110a", False),  # another family
    ("sm_120f", "sm_121a", True),
    ("sm_100f", "sm_103", False),  # a generic target has no family features
    ("sm_90a", "sm_90a", True),  # arch-specific: itself alone
    ("compute_90a", "sm_90a", True),
    ("sm_90a", "sm_100a", False),
    ("sm_100a", "sm_103a", False),
    ("sm_100a", "sm_100f", False),
    ("lto_100a", "sm_100a", True),
    ("native", "sm_103a", True),
]


@pytest.mark.parametrize(("asked", "built", "covered"), RULE)
def test_the_rule(asked: str, built: str, covered: bool) -> None:
    assert archflags.covers(asked, archflags.target(built)) is covered


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["-arch"], "csrc/k.cu: -arch has no value"),
        (["-arch=sm_9x"], "csrc/k.cu: 'sm_9x' is not a GPU architecture"),
        (["-gencode=code=sm_90a"], "csrc/k.cu: -gencode code=sm_90a: not in nvcc's"),
        (
            ["-gencode", "arch=compute_90a,code=sm_90a,compute_90a"],
            "csrc/k.cu: -gencode arch=compute_90a,code=sm_90a,compute_90a: not in nvcc's",
        ),
        (
            ["-gencode=arch=compute_90a,cod=sm_90a"],
            "csrc/k.cu: -gencode arch=compute_90a,cod=sm_90a: not in nvcc's arch=...,code=...",
        ),
    ],
)
def test_flags_it_cannot_read_are_an_error_naming_the_unit(flags: list[str], says: str) -> None:
    with pytest.raises(archflags.ArchFlagError, match="^" + says.replace(".", r"\.")):
        archflags.rewrite(["-c", "k.cu", *flags], BUILT, "csrc/k.cu")


def test_the_refusal_names_the_unit_its_archs_the_builds_and_the_fix() -> None:
    with pytest.raises(archflags.Refused) as info:
        archflags.rewrite(
            ["-c", "k.cu", "-gencode=arch=compute_90a,code=[sm_90a,compute_90a]"],
            BUILT,
            "csrc/hopper.cu",
        )
    assert str(info.value) == (
        "csrc/hopper.cu: written for sm_90a only, none of the archs this build makes "
        "(sm_100a, sm_103a): kiln compiles no unit for an arch it was not written for; leave "
        'it out with the upstream\'s own switch (arch_control = "toggles") or a patch '
        "(docs/archs.md); its arch flags: -gencode=arch=compute_90a,code=[sm_90a,compute_90a]"
    )


# --------------------------------------------------------------------------- real nvcc

KERNEL = "__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n"


def _wrapped(tree: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """nvcc through kiln's wrapper, as a build's ``$NVCC`` runs it (object cache off)."""
    return subprocess.run(
        [sys.executable, "-S", objcache.__file__, NVCC, *args],
        cwd=tree,
        env={
            **os.environ,
            "KILN_OBJCACHE_ROOTS": f"TREE={tree}",
            "KILN_NVCC_ARCHS": " ".join(BUILT),
            **env,
        },
        capture_output=True,
        text=True,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if not os.path.exists(NVCC):
        pytest.skip(f"no nvcc at {NVCC}")
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "k.cu").write_text(KERNEL)
    return tmp_path


def test_a_hard_coded_list_builds_exactly_the_profiles_sass(tree: Path) -> None:
    """sm_75 ... sm_120 as many setup.py files hard-code them, one more through nvcc's own
    NVCC_APPEND_FLAGS; and the link, which names no arch (nvcc would add an sm_75 cubin)."""
    hard = [f"-gencode=arch=compute_{a},code=[sm_{a},compute_{a}]" for a in ("75", "90", "100a")]
    res = _wrapped(
        tree,
        *("-c", "-Xcompiler", "-fPIC", "csrc/k.cu", "-o", "k.o", *hard),
        NVCC_APPEND_FLAGS="-gencode=arch=compute_120,code=sm_120",
    )
    assert res.returncode == 0, res.stderr
    assert device_archs(tree / "k.o") == (BUILT, [])  # SASS only: no PTX
    res = _wrapped(tree, "-shared", "k.o", "-o", "k.so")
    assert res.returncode == 0, res.stderr
    assert device_archs(tree / "k.so") == (BUILT, [])


def test_a_unit_for_other_archs_alone_is_refused_as_the_user_sees_it(tree: Path) -> None:
    res = _wrapped(tree, "-c", "csrc/k.cu", "-o", "k.o", "-arch=sm_90a")
    assert res.returncode == 1 and not (tree / "k.o").exists()
    line = res.stderr.strip()
    assert line.startswith("kiln arch rewrite: error: csrc/k.cu: written for sm_90a only, none")
    command = "FAILED: k.o\nnvcc -c csrc/k.cu -o k.o -arch=sm_90a"
    d = diagnose.diagnose(f"{command}\n{line}\nerror: command 'nvcc' failed\n", tree, {}, "v")
    assert d.unit == "csrc/k.cu"
    assert d.errors[0].render().startswith("csrc/k.cu: written for sm_90a only,")
    assert d.cause is not None and d.cause.row == "arch-refused"
    assert "csrc/k.cu's (sm_90a) cover none of sm_100a, sm_103a: an arch-specific" in (
        d.cause.cause
    )
    # building sm_90a too would leave the unit covering some of the archs (arch-uncovered):
    # the fix drops the unit's own flag, or leaves the unit out (issue 41)
    assert d.cause.fix.startswith(
        "where csrc/k.cu's code is valid on sm_100a, sm_103a, drop its own arch flags so the "
        'rewrite gives it the build\'s archs: build.nvcc_drop_flags = ["-arch=sm_90a"] in '
        "vendors/v.toml"
    ), d.cause.fix
    assert 'arch_control = "toggles" with build.arch_toggles in vendors/v.toml' in d.cause.fix
    assert "build sm_90a too" not in d.cause.fix
    # a build that runs nvcc without printing its commands: the refusal names the flags
    assert line.endswith("; its arch flags: -arch=sm_90a"), line
    d = diagnose.diagnose(f"{line}\nerror: command 'nvcc' failed\n", tree, {}, "v")
    assert d.cause is not None
    assert 'build.nvcc_drop_flags = ["-arch=sm_90a"] in vendors/v.toml' in d.cause.fix
    # a two-token flag cannot be dropped token by token: a patch
    res = _wrapped(tree, "-c", "csrc/k.cu", "-o", "k.o", "-gencode", "arch=compute_90a,code=sm_90a")
    two_line = res.stderr.strip()
    assert two_line.endswith("; its arch flags: -gencode arch=compute_90a,code=sm_90a")
    two = "FAILED: k.o\nnvcc -c csrc/k.cu -o k.o -gencode arch=compute_90a,code=sm_90a"
    for said in (f"{two}\n{two_line}", two_line):
        d = diagnose.diagnose(f"{said}\nerror: command 'nvcc' failed\n", tree, {}, "v")
        assert d.cause is not None and "a patch that drops its own arch flags" in d.cause.fix
        assert "nvcc_drop_flags" not in d.cause.fix


def test_a_unit_covering_only_some_built_archs_stops_at_its_first_compile(tree: Path) -> None:
    """Written for sm_100a alone (arch-specific) in a build of sm_100a and sm_103a: the
    rewrite would give it sm_100a only and its kernels would be missing on sm_103a, so the
    wrapper stops there, before the compile, with why the rewrite did not apply (issue 40;
    the wheel was refused after the whole build before)."""
    res = _wrapped(tree, "-c", "csrc/k.cu", "-o", "k.o", "-arch=sm_100a")
    assert res.returncode == 1 and not (tree / "k.o").exists()
    line = res.stderr.strip()
    assert line == (
        "kiln arch rewrite: error: csrc/k.cu: written for sm_100a, which covers sm_100a of "
        "the archs this build makes (sm_100a, sm_103a), not sm_103a: the rewrite gives a unit "
        "only the built archs its own flags cover; kiln stops at this first compile instead "
        "of refusing the wheel after the whole build"
    )
    d = diagnose.diagnose(f"$ nvcc ...\n{line}\nerror: command 'nvcc' failed\n", tree, {}, "v")
    assert d.unit == "csrc/k.cu"
    assert d.cause is not None and d.cause.row == "arch-uncovered"
    assert "csrc/k.cu asks for sm_100a, which covers sm_100a alone" in d.cause.cause
    assert "missing on sm_103a" in d.cause.cause
    assert 'build.archs = ["sm_100a"] in vendors/v.toml' in d.cause.fix
    # the family target, as the fix says, covers both: it compiles, with both archs
    res = _wrapped(tree, "-c", "csrc/k.cu", "-o", "k.o", "-gencode=arch=compute_100f,code=sm_100f")
    assert res.returncode == 0, res.stderr
    assert device_archs(tree / "k.o") == (BUILT, [])
    # a link of such objects is no unit's compile: not stopped
    assert archflags.rewrite(["-shared", "k.o", "-arch=sm_100a"], BUILT, "k.so")


def test_arch_also_builds_an_a_targets_unit_for_the_archs_it_names(tree: Path) -> None:
    """Issue 54 (3): ``build.arch_also = {sm_100a = ["sm_103a"]}`` (what add drafts where
    it compiled the unit for sm_103a): the unit written for sm_100a is built for both, by
    the real nvcc through the wrapper; without it, the same call stops (above); an arch it
    names only for another target changes nothing."""
    also = contract.Archs(rewrite=tuple(BUILT), also={"sm_100a": ("sm_103a",)}).to_env()
    assert also["KILN_NVCC_ALSO"] == "sm_100a:sm_103a"
    res = _wrapped(tree, "-c", "csrc/k.cu", "-o", "k.o", *ONLY_100A, **also)
    assert res.returncode == 0, res.stderr
    assert device_archs(tree / "k.o") == (BUILT, [])
    other = contract.Archs(rewrite=tuple(BUILT), also={"sm_90a": ("sm_103a",)}).to_env()
    res = _wrapped(tree, "-c", "csrc/k.cu", "-o", "k2.o", *ONLY_100A, **other)
    assert res.returncode == 1 and "not sm_103a" in res.stderr
    assert contract.Archs.from_env(also).also == {"sm_100a": ("sm_103a",)}


def test_arch_also_reaches_the_step_and_is_checked_against_the_recipe(tmp_path: Path) -> None:
    also = {"sm_100a": ["sm_103a"]}
    ws = Workspace(write(tmp_path, {"plain": _vendor(BUILT, arch_also=also)}))
    _env, recorded = build_environment(ws.vendors["plain"], ws.profile, "/cuda", 0, base={})
    assert recorded[contract.NVCC_ALSO] == "sm_100a:sm_103a"  # recorded: it makes the SASS
    stray = _vendor(BUILT, arch_also={"sm_100a": ["sm_110a"]})
    with pytest.raises(ConfigError, match="build.arch_also names sm_110a, not in build.archs"):
        Workspace(write(tmp_path / "stray", {"plain": stray}))
    hard = plain_vendor(SHA, arch_also=also)
    with pytest.raises(ConfigError, match="build.arch_also is for build.arch_control = 'rewrite'"):
        Workspace(write(tmp_path / "hard", {"plain": hard}))


@pytest.mark.parametrize("nested", [False, True], ids=["objcache.py", "compileflags.py"])
def test_a_shipped_trees_kit_rewrites_too(tmp_path: Path, nested: bool) -> None:
    """The kit's own copies (``.kiln/``, as ``rebuild_c`` runs them, kiln not importable):
    objcache.py for a build's nvcc calls, compileflags.py for those inside a compile
    (KILN_WRAPPED=1): no path around the rule."""
    from kiln.orchestrate.kit import install_kit

    kit = install_kit(tmp_path)
    (tmp_path / "k.cu").write_text(KERNEL)
    echo = tmp_path / "bin" / "nvcc"
    echo.parent.mkdir()
    echo.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"KILN_NVCC_ARCHS": "sm_100a", "KILN_REAL_NVCC": str(echo), "KILN_DETERMINISTIC": "0"}
    env |= {"KILN_OBJCACHE_PYTHON": sys.executable, **({"KILN_WRAPPED": "1"} if nested else {})}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        wrapper = str(kit / "bin" / "nvcc")
        return subprocess.run(
            [wrapper, *args], env=env, capture_output=True, text=True, cwd=tmp_path
        )

    res = run("-c", "k.cu", "-arch=sm_90")
    assert res.returncode == 0 and res.stdout.split() == ["-c", "k.cu", *ONLY_100A], res.stderr
    res = run("-c", "k.cu", "-arch=sm_90a")
    assert res.returncode == 1 and not res.stdout
    assert res.stderr.startswith("kiln arch rewrite: error: k.cu: written for sm_90a only, none")


# --------------------------------------------------------------------------- the recipe

SHA = "a" * 40


def _vendor(archs: list[str], **build: object) -> dict:
    return plain_vendor(SHA, archs=archs, arch_control="rewrite", **build)


def test_a_rewrite_recipe_builds_the_profiles_archs_or_its_share_of_them(
    tmp_path: Path,
) -> None:
    ws = Workspace(write(tmp_path / "all", {"plain": _vendor([])}))
    assert ws.vendors["plain"].build.archs == ["sm_100a", "sm_103a"]
    ws = Workspace(write(tmp_path / "some", {"plain": _vendor(["sm_90a", "sm_103a"])}))
    assert ws.vendors["plain"].build.archs == ["sm_103a"]
    with pytest.raises(ConfigError, match=r"build\.archs: none of sm_90a is in the profile's"):
        Workspace(write(tmp_path / "none", {"plain": _vendor(["sm_90a"])}))


def test_an_empty_arch_list_is_only_for_rewrite(tmp_path: Path) -> None:
    vendor = plain_vendor(SHA, archs=[], arch_control="hardcoded")
    with pytest.raises(ConfigError, match="build.archs is empty"):
        Workspace(write(tmp_path, {"plain": vendor}))


def test_the_step_gets_the_archs_for_the_wrapper_and_torch(tmp_path: Path) -> None:
    profile = {**PROFILE, "archs": ["sm_100f", "sm_103a"]}
    ws = Workspace(write(tmp_path, {"plain": _vendor([])}, profile=profile))
    env, recorded = build_environment(ws.vendors["plain"], ws.profile, "/cuda", 0, base={})
    assert recorded[contract.NVCC_ARCHS] == "sm_100f sm_103a"
    # the archs built, for the diagnosis: in the step's environment, not recorded
    assert contract.Archs.from_env(env).built == ("sm_100f", "sm_103a")
    assert contract.BUILD_ARCHS not in recorded
    # torch refuses family targets ("10.0f"): their generic form covers them
    assert recorded["TORCH_CUDA_ARCH_LIST"] == "10.0;10.3a"
    hard = plain_vendor(SHA)
    ws = Workspace(write(tmp_path / "hard", {"plain": hard}))
    env, _ = build_environment(ws.vendors["plain"], ws.profile, "/cuda", 0, base={})
    assert contract.NVCC_ARCHS not in env


def test_a_unit_that_drops_an_arch_of_the_recipe_is_stopped_at_its_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: with arch_control = "torch-arch-list" every CUDA unit makes every arch of
    the recipe; an upstream table that left 10.3a out is stopped at the first compile."""
    unit = tmp_path / "k.cu"
    unit.write_text("__global__ void k() {}\n")
    expected = ["sm_100a", "sm_103a"]
    both = ["-gencode=arch=compute_100a,code=sm_100a", "-gencode=arch=compute_103a,code=sm_103a"]
    archflags.check_expected(["-c", str(unit), *both, "-o", "k.o"], expected)  # passes
    with pytest.raises(archflags.Dropped) as err:
        archflags.check_expected(["-c", str(unit), both[0], "-o", "k.o"], expected, "csrc/k.cu")
    m = archflags.DROPPED.match(str(err.value))
    assert m and (m["unit"], m["made"], m["missing"]) == ("csrc/k.cu", "sm_100a", "sm_103a")
    # PTX alone is no SASS; no arch flag at all is nvcc's default, not the recipe's
    ptx = "-gencode=arch=compute_103a,code=compute_103a"
    with pytest.raises(archflags.Dropped, match="not for sm_103a"):
        archflags.check_expected(["-c", str(unit), both[0], ptx], expected)
    with pytest.raises(archflags.Dropped, match="compiled for no SASS only"):
        archflags.check_expected(["-c", str(unit)], expected)
    # nvcc's own NVCC_APPEND_FLAGS count; links and preprocessing are not unit compiles
    monkeypatch.setenv("NVCC_APPEND_FLAGS", both[1])
    archflags.check_expected(["-c", str(unit), both[0]], expected)
    archflags.check_expected(["-shared", "k.o", "-o", "k.so"], expected)
    archflags.check_expected(["-E", str(unit)], expected)


@pytest.mark.parametrize(
    ("flags", "edit"),
    [
        (
            "-gencode=arch=compute_100a,code=sm_100a -gencode=arch=compute_101a,code=sm_101a",
            ["-gencode=arch=compute_101a,code=sm_101a"],
        ),
        ("-arch=sm_101a", ["-arch=sm_101a"]),
        # two tokens: dropping "-gencode" would break the flag after it: text only
        ("-gencode arch=compute_101a,code=sm_101a", None),
    ],
    ids=["gencode=", "arch=", "two-tokens"],
)
def test_an_unknown_arch_the_upstream_hard_codes_is_dropped_by_an_edit(
    tmp_path: Path, flags: str, edit: list[str] | None
) -> None:
    """unknown-arch: the upstream's own single-token flag becomes the nvcc_drop_flags edit
    ``kiln build --fix`` applies (tests/integration/test_fix.py builds it); a two-token
    form, or an arch kiln itself was asked for, gets the text fix alone."""
    command = f"/usr/local/cuda/bin/nvcc -c csrc/k.cu -o k.o {flags}"
    output = (
        f"FAILED: k.o\n{command}\nnvcc fatal   : Unsupported gpu architecture 'compute_101a'\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    d = diagnose.diagnose(output, tmp_path, {}, "v")
    assert d.cause is not None and d.cause.row == "unknown-arch", d
    if edit is None:
        assert d.cause.edit is None and "nvcc_drop_flags = [" not in d.cause.fix
    else:
        assert d.cause.edit == {
            "file": "vendors/v.toml",
            "keys": ["build", "nvcc_drop_flags"],
            "append": edit,
        }
    asked = diagnose.diagnose(output, tmp_path, {"KILN_BUILD_ARCHS": "sm_101a"}, "v")
    assert asked.cause is not None and asked.cause.edit is None  # kiln's own arch


NATIVE_CMAKE = """\
cmake_minimum_required(VERSION 3.24)
project(p LANGUAGES CXX)
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES native CACHE STRING "CUDA arch" FORCE)
endif()
enable_language(CUDA)
add_library(k SHARED k.cu)
"""


@pytest.mark.skipif(not os.path.exists(NVCC), reason=f"no nvcc at {NVCC}")
def test_cmake_is_told_the_builds_archs_where_it_defaults_to_native(tmp_path: Path) -> None:
    """A CMake project that defaults CMAKE_CUDA_ARCHITECTURES to ``native``
    (AMYPAD/CuVec) fails its configure where no GPU answers; under the rewrite the step's
    CMAKE_ARGS (read by scikit-build-core and setup.py's CMake) and CUDAARCHS carry the
    build's archs, after the recipe's own CMAKE_ARGS. Real cmake, configured both ways."""
    if not shutil.which("cmake"):
        pytest.skip("cmake is not installed")
    ws = Workspace(
        write(tmp_path / "ws", {"plain": _vendor(BUILT, env={"CMAKE_ARGS": "-DWITH_GPU=ON"})})
    )
    env, recorded = build_environment(ws.vendors["plain"], ws.profile, "/cuda", 0, base={})
    assert recorded["CMAKE_ARGS"] == "-DWITH_GPU=ON -DCMAKE_CUDA_ARCHITECTURES=100;103"
    assert recorded["CUDAARCHS"] == "100;103"
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(NATIVE_CMAKE)
    (project / "k.cu").write_text(KERNEL)
    run = {**os.environ, "CUDACXX": NVCC}
    for folder, args in (("told", shlex.split(env["CMAKE_ARGS"])), ("untold", [])):
        res = subprocess.run(
            ["cmake", "-S", str(project), "-B", str(tmp_path / folder), *args],
            env=run, capture_output=True, text=True, check=False,
        )  # fmt: skip
        said = res.stdout + res.stderr
        assert (res.returncode == 0) == (folder == "told"), said[-2000:]
    assert 'CUDA_ARCHITECTURES is set to "native", but no GPU was detected' in said
    hard = Workspace(write(tmp_path / "hard", {"plain": plain_vendor(SHA)}))
    _env, recorded = build_environment(hard.vendors["plain"], hard.profile, "/cuda", 0, base={})
    assert "CMAKE_ARGS" not in recorded  # only where the wrapper rewrites the archs
