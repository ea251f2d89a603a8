"""The pipeline end to end on fixture upstreams: real git, real nvcc, real cuobjdump."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import zipfile
from pathlib import Path

import pytest

from kiln.errors import BuildError, PreflightError, VerifyError
from kiln.orchestrate import stages
from kiln.release import manifest
from kiln.runners import isolation
from tests.conftest import artifacts_files, build_args, run_kiln, start_kiln_until, step_marker
from tests.releases import manifest_json
from tests.upstreams import Upstreams
from tests.workspace import PATCH, PROFILE, plain_vendor, write


def test_build_verify_and_manifest(tmp_path: Path, upstreams: Upstreams, options) -> None:
    ws = write(
        tmp_path / "ws",
        {"plain": plain_vendor(upstreams.plain[2][:7])},
        patches={"greeting.patch": PATCH},
        series=[{"file": "greeting.patch", "target": "plain"}],
    )
    release = stages.build(options(ws))

    data = manifest_json(release)
    entry = data["vendors"]["plain"]
    assert entry["source"]["commit"] == upstreams.plain[2]
    assert entry["source"]["requested"] == upstreams.plain[2][:7]
    assert entry["source"]["submodules"] == [
        {
            "path": "third_party/hdr",
            "url": "https://fixtures.invalid/hdr.git",
            "commit": upstreams.hdr[0],
            "license": "LICENSE",
            "license_file": "licenses/plain-third_party_hdr-LICENSE",
            "license_id": None,
        }
    ]
    assert entry["patches"][0]["file"] == "greeting.patch"
    assert entry["patches"][0]["status"] == "applied"
    assert set(entry["timings"]) == {"fetch", "patch", "build", "package", "verify"}
    assert data["toolchain"]["nvcc_version"].startswith("13.2")
    assert data["toolchain"]["torch_version"] == "2.14.1+cu130"
    # the local runner's steps: a network and mount namespace of their own (issue 41)
    network = isolation.state()
    assert data["runner"] == {"kind": "local", "image": None, "builder": None, "network": network}

    out, license_out, sub_license, patch_out = entry["outputs"]
    assert license_out["kind"] == "license" and license_out["path"] == "licenses/plain-LICENSE"
    assert sub_license["kind"] == "license"
    assert sub_license["path"] == "licenses/plain-third_party_hdr-LICENSE"
    sbom = json.loads((release / "sbom.cdx.json").read_text())
    (plain,) = [c for c in sbom["components"] if c["name"] == "plain"]
    (hdr,) = plain["components"]
    assert {"name": "kiln:license-file", "value": sub_license["path"]} in hdr["properties"]
    assert patch_out["kind"] == "patch" and patch_out["path"] == "patches/greeting.patch"
    wheel = release / out["path"]
    patch_digest = entry["patches"][0]["sha256"]
    label = (
        f"cu132.torch2.14.g{upstreams.plain[2][:7]}.p"
        + hashlib.sha256(patch_digest.encode()).hexdigest()[:7]
    )
    # repaired: the tag its glibc symbols allow (this Debian 12 host: manylinux_2_34)
    assert re.fullmatch(
        rf"plainext-1\.2\.0\+{re.escape(label)}-cp311-cp311-manylinux_2_(\d+)_x86_64\.whl",
        wheel.name,
    ), wheel.name
    assert out["version"] == f"1.2.0+{label}"
    objects = {o["path"].split(".")[0]: o for o in out["shared_objects"]}
    assert objects["plainext/_kernels"]["sass"] == ["sm_100a", "sm_103a"]
    assert objects["plainext/_host"]["sass"] == []
    assert "auditwheel" in out and out["auditwheel"]["output"]
    with zipfile.ZipFile(wheel) as zf:
        assert b"hello from patched plainext" in zf.read("plainext/__init__.py")
        info = f"plainext-1.2.0+{label}.dist-info"
        assert "Requires-Dist: torch==2.14.1\n" in zf.read(f"{info}/METADATA").decode()
        assert "Tag: cp311-cp311-manylinux_2_" in zf.read(f"{info}/WHEEL").decode()
        assert not [n for n in zf.namelist() if ".libs/" in n], "nothing grafted"

    assert manifest.check(release / "manifest.json") == []
    assert (tmp_path / "artifacts/logs/test-release/plain-build.log").exists()


def test_wheel_over_its_size_budget_fails_naming_its_largest_members(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    vendor = plain_vendor(upstreams.plain[0], archs=[], max_wheel_mib=0.001)
    ws = write(tmp_path / "ws", {"plain": vendor})
    with pytest.raises(BuildError) as info:
        stages.build(options(ws))
    msg = str(info.value)
    assert "over vendors/plain.toml's build.max_wheel_mib = 0.001" in msg
    assert "largest members (compressed): plainext/_host" in msg, msg
    assert artifacts_files(tmp_path / "artifacts") == []


def test_wheel_missing_an_arch_fails_and_leaves_nothing(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    """plain@1 compiles sm_100a only; the recipe asks for sm_100a and sm_103a."""
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[1])})
    with pytest.raises(VerifyError) as info:
        stages.build(options(ws))
    msg = str(info.value)
    assert "plainext/_kernels" in msg and "missing sm_103a" in msg
    assert artifacts_files(tmp_path / "artifacts") == []
    # the refused wheel is kept beside the logs, with the command that checks it again
    (kept,) = (tmp_path / "artifacts" / "logs" / "test-release" / "plain-refused").glob("*.whl")
    assert f"  the refused wheel: {kept} (kiln verify-wheel {kept} --workspace " in msg
    res = run_kiln("verify-wheel", kept, "--workspace", ws, "--vendor", "plain")
    assert res.returncode == 7 and "missing sm_103a" in res.stderr


def test_host_only_wheel_passes_when_recipe_builds_no_device_code(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[0], archs=[])})
    release = stages.build(options(ws))
    outputs = manifest_json(release)["vendors"]["plain"]["outputs"]
    (out,) = [o for o in outputs if o["kind"] == "wheel"]
    assert [o["sass"] for o in out["shared_objects"]] == [[]]


def test_device_code_where_recipe_says_none_fails(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2], archs=[])})
    with pytest.raises(VerifyError, match="holds device code .* the recipe builds none"):
        stages.build(options(ws))
    assert artifacts_files(tmp_path / "artifacts") == []


def test_absent_patch_stops_before_any_work(tmp_path: Path, upstreams: Upstreams, options) -> None:
    ws = write(
        tmp_path / "ws",
        {"plain": plain_vendor(upstreams.plain[2])},
        series=[{"file": "missing.patch", "target": "plain"}],
    )
    with pytest.raises(
        PreflightError, match=r"missing.patch \(for plain\) is listed .* absent"
    ) as info:
        stages.build(options(ws))
    # Where it belongs: the workspace's patches/, not the build's snapshot of it.
    assert f"put it at {ws.resolve()}/patches/missing.patch (" in str(info.value)
    # nothing fetched or built: the cache holds only what the tests link in (shared_cache)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["envs", "facts", "toolchains"]
    assert not (tmp_path / "work").exists()


def test_nvcc_missing(tmp_path: Path, upstreams: Upstreams, options) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    with pytest.raises(PreflightError, match=r"nvcc not found at /nonexistent/bin/nvcc"):
        stages.build(options(ws, cuda_home="/nonexistent", toolchain="system"))


def test_nvcc_of_another_cuda_major(tmp_path: Path, upstreams: Upstreams, options) -> None:
    ws = write(
        tmp_path / "ws",
        {"plain": plain_vendor(upstreams.plain[2], archs=["sm_90a"])},
        profile={**PROFILE, "cuda": "12.8", "archs": ["sm_90a"]},
    )
    with pytest.raises(
        PreflightError,
        match=r"is CUDA 13\.0\.\d+ \(another major version\), "
        r"the profile asks for CUDA 12\.8",
    ):
        stages.build(options(ws, toolchain="system"))


def test_torch_of_another_version_is_refused(tmp_path: Path, upstreams: Upstreams, options) -> None:
    ws = write(
        tmp_path / "ws",
        {"plain": plain_vendor(upstreams.plain[2])},
        profile={**PROFILE, "torch": "2.13.0+cu130"},
    )
    with pytest.raises(
        PreflightError,
        match=r"torch in .* is 2\.14\.1\+cu130, the profile "
        r"pins 2\.13\.0\+cu130",
    ):
        stages.build(options(ws))


def test_rebuilding_one_vendor_keeps_the_others(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    beta = plain_vendor(upstreams.plain[0], archs=[], env={"PLAIN_DIST_NAME": "plainbeta"})
    ws = write(tmp_path / "ws", {"alpha": plain_vendor(upstreams.plain[0], archs=[]), "beta": beta})
    release = stages.build(options(ws))
    first = manifest_json(release)
    stages.build(options(ws, vendors=["alpha"]))
    second = manifest_json(release)
    assert set(second["vendors"]) == {"alpha", "beta"}
    assert second["vendors"]["beta"] == first["vendors"]["beta"]
    assert manifest.check(release / "manifest.json") == []


def test_two_vendors_making_one_wheel_name_is_an_error(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    ws = write(
        tmp_path / "ws",
        {
            "alpha": plain_vendor(upstreams.plain[0], archs=[]),
            "beta": plain_vendor(upstreams.plain[0], archs=[]),
        },
    )
    with pytest.raises(
        BuildError,
        match=r"alpha and beta both made plainext-1\.2\.0\+cu132\.torch2\.14\.g\w{7}-.*whl",
    ):
        stages.build(options(ws))
    assert artifacts_files(tmp_path / "artifacts") == []


def test_cli_unknown_vendor(tmp_path: Path, upstreams: Upstreams) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[2])})
    res = run_kiln("build", "--workspace", ws, "deepep")
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"kiln: error: unknown vendor 'deepep': known vendors are plain (files in {ws}/vendors)"
    )


def test_build_all_here_says_what_is_missing(tmp_path: Path) -> None:
    """The real release cannot build on this machine: one clear report, no traceback."""
    res = run_kiln(
        "build",
        "--runner",
        "local",
        "--artifacts",
        tmp_path / "a",
        "--cache",
        tmp_path / "c",
        "--work",
        tmp_path / "w",
        "--offline",
    )
    assert res.returncode == 9, res.stderr
    assert "Traceback" not in res.stderr
    assert "cannot build deepinfer-sm100-cu132 here" in res.stderr
    assert "the profile asks for CUDA 13.2" in res.stderr
    assert "deepinfer-prefix-cache.patch" in res.stderr
    assert "deepep: https://github.com/deepseek-ai/DeepEP is not in the cache" in res.stderr
    assert "To build offline" in res.stderr
    assert not (tmp_path / "a" / "deepinfer-sm100-cu132").exists()


def _descendants_running(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if marker in ln and "ps -eo" not in ln]


def test_interrupted_build_leaves_no_partial_output(
    tmp_path: Path, upstreams: Upstreams, build_python: Path
) -> None:
    vendor = plain_vendor(upstreams.plain[2])
    marker = step_marker(tmp_path, "compiling")
    vendor["build"]["env"] = {"PLAIN_BUILD_DELAY": "120", "PLAIN_STARTED_MARKER": str(marker)}
    ws = write(tmp_path / "ws", {"plain": vendor})
    work = tmp_path / "work-interrupt"
    proc = start_kiln_until(
        marker,
        *build_args(
            ws,
            tmp_path,
            mirrors=upstreams.mirrors,
            python=build_python,
            toolchain="pypi",
            work=work,
            runner=None,
        ),
    )
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert artifacts_files(tmp_path / "artifacts") == []
    assert _descendants_running(str(work)) == []
