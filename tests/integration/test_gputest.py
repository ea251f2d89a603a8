"""`kiln gpu-test` (issue 12): a recipe's own GPU test against the release's wheel.

The real run needs a GPU (tests/integration/test_gpu.py, FlashMLA's dense-decoding test on an H200).
Here: every refusal on a machine without one, and the whole flow (test files from the
pinned commit, a fresh environment with exactly the release's wheel, the result beside
the manifest) against a stand-in GPU: a fake ``nvidia-smi`` and a fake ``torch`` that
says CUDA is there. The stand-ins are mocks of what cannot exist here; the test's name
says so."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kiln.orchestrate import stages
from kiln.orchestrate.options import Options
from tests.conftest import run_kiln, shared_cache
from tests.releases import edit_manifest
from tests.upstreams import Upstreams
from tests.workspace import plain_vendor, write

CHECK = (
    "import plainext, sys; print('greeting:', plainext.GREETING);"
    "print('from', plainext.__file__); sys.exit(0 if 'site-packages' in plainext.__file__ else 3)"
)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory, upstreams: Upstreams, build_python: Path):
    root = tmp_path_factory.mktemp("gputest")
    vendor = plain_vendor(
        upstreams.plain[0],
        archs=[],
        gpu_test={"files": ["setup.py"], "command": ["python", "-c", CHECK]},
    )
    ws = write(root / "ws", {"plain": vendor, "other": plain_vendor(upstreams.plain[0], archs=[])})
    (ws / "vendors" / "other.toml").write_text(
        (ws / "vendors" / "other.toml").read_text() + '\n[build.env]\nPLAIN_DIST_NAME = "other"\n'
    )
    opts = Options(
        workspace=ws,
        artifacts=root / "artifacts",
        cache=shared_cache(root / "cache"),
        work=root / "work",
        mirrors=upstreams.mirrors,
        offline=True,
        python=str(build_python),
        toolchain="pypi",
    )
    return stages.build(opts), root, upstreams.mirrors


def _gpu_test(release: Path, root: Path, mirrors: Path, *args: str, env=None):
    return run_kiln(
        "gpu-test",
        release,
        *args,
        "--cache",
        root / "cache",
        "--mirrors",
        mirrors,
        "--offline",
        env=env,
    )


def test_without_a_gpu_it_says_so_and_writes_no_result(release) -> None:
    rel, root, mirrors = release
    res = _gpu_test(rel, root, mirrors, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 16, res.stderr
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert "no GPU here" in line and "run kiln gpu-test on a GPU machine" in line
    assert not list((rel / "gpu-tests").glob("*.json"))


def test_a_vendor_without_a_declared_test_is_named(release) -> None:
    rel, root, mirrors = release
    res = _gpu_test(rel, root, mirrors, "other")
    assert res.returncode == 16
    assert "other: its recipe declares no GPU test: add [build.gpu_test]" in res.stderr


def test_a_release_that_changed_is_not_tested(release, tmp_path: Path) -> None:
    rel, root, mirrors = release
    import shutil

    copy = shutil.copytree(rel, tmp_path / "copy")
    (wheel,) = (copy / "wheels").glob("plainext*.whl")
    wheel.write_bytes(wheel.read_bytes() + b"x")
    res = _gpu_test(copy, root, mirrors)
    assert res.returncode == 16
    assert "no longer matches its manifest" in res.stderr


def _stand_in_gpu(tmp_path: Path, python: Path) -> tuple[dict[str, str], Path]:
    """A fake nvidia-smi on PATH and a Python whose fake torch reports a CUDA device."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Stand-in GPU, 999.1, 1 MiB, 9.0'\n")
    smi.chmod(0o755)
    fake = tmp_path / "fake-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "__version__ = '0.0+standin'\n"
        "class version: cuda = '13.0'\n"
        "class cuda:\n    @staticmethod\n    def is_available(): return True\n"
    )
    env_dir = tmp_path / "gpu-python"
    import subprocess

    subprocess.run([str(python), "-m", "venv", str(env_dir)], check=True)
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    (site / "fake_torch.pth").write_text(f"{fake}\n")
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, env_dir / "bin" / "python"


def test_gpu_test_flow_with_a_stand_in_gpu_mock(release, tmp_path: Path) -> None:
    rel, root, mirrors = release
    env, python = _stand_in_gpu(tmp_path, Path(sys.executable))
    res = _gpu_test(rel, root, mirrors, "plain", "--python", str(python), env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "gpu-test plain: passed" in res.stdout
    result = json.loads((rel / "gpu-tests" / "plain.json").read_text())
    data = json.loads((rel / "manifest.json").read_text())
    (wheel,) = [o for o in data["vendors"]["plain"]["outputs"] if o["kind"] == "wheel"]
    assert result["passed"] and result["wheel"]["sha256"] == wheel["sha256"]
    assert result["gpus"][0]["name"] == "Stand-in GPU"
    assert result["source"]["commit"] == data["vendors"]["plain"]["source"]["commit"]
    log = (rel / "gpu-tests" / "plain.log").read_text()
    assert "greeting: hello from plainext" in log  # the release's wheel, installed fresh


def test_a_failing_gpu_test_is_an_error_with_its_result_kept(release, tmp_path: Path) -> None:
    """The check above can fail: a test command that exits non-zero."""
    rel, root, mirrors = release
    import shutil

    copy = shutil.copytree(rel, tmp_path / "copy")

    def fail(data: dict) -> None:
        data["vendors"]["plain"]["recipe"]["gpu_test"]["command"] = ["python", "-c", "exit(5)"]

    edit_manifest(copy, fail)
    env, python = _stand_in_gpu(tmp_path, Path(sys.executable))
    res = _gpu_test(copy, root, mirrors, "--python", str(python), env=env)
    assert res.returncode == 16, res.stderr[-2000:]
    assert "the GPU test of plain failed" in res.stderr
    result = json.loads((copy / "gpu-tests" / "plain.json").read_text())
    assert not result["passed"] and result["returncode"] == 5
