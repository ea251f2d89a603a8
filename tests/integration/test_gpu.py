"""On a machine with a GPU: the bundled torch extension, built by kiln for the GPU's
own arch, imports and computes the right result. Skipped where no GPU answers.

Run there with ``pytest tests/integration/test_gpu.py``; the build Python is ``$KILN_GPU_PYTHON`` or
the interpreter running pytest, and must hold torch with CUDA. The profile is taken from
that machine (its Python, torch and nvcc), the arch from the GPU (e.g. sm_90a on an H200).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from kiln.orchestrate import stages
from kiln.orchestrate.options import Options
from kiln.toolchain.checks import find_cuda_home, nvcc_version
from kiln.verbs import demo_workspace as demo
from tests.conftest import REPO, artifacts_files

PROBE = (
    "import json, sys, torch; ok = torch.cuda.is_available();"
    "cap = torch.cuda.get_device_capability() if ok else None;"
    "print(json.dumps({'ok': ok, 'cap': cap, 'torch': torch.__version__,"
    " 'python': '%d.%d' % sys.version_info[:2]}))"
)


def _gpu_python() -> tuple[str, dict]:
    python = os.environ.get("KILN_GPU_PYTHON", sys.executable)
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no GPU here (nvidia-smi not found)")
    res = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"{python} has no usable torch: {res.stderr.strip()[-200:]}")
    facts = json.loads(res.stdout.strip().splitlines()[-1])
    if not facts["ok"]:
        pytest.skip("torch sees no CUDA device")
    return python, facts


@pytest.mark.gpu
def test_demo_extension_computes_on_the_gpu(tmp_path: Path) -> None:
    python, facts = _gpu_python()
    major, minor = facts["cap"]
    arch = f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"
    nvcc = nvcc_version(find_cuda_home())

    ws = tmp_path / "ws"
    shutil.copytree(REPO / "examples/demo", ws)
    meta = tomlkit.parse((ws / "kiln.toml").read_text())
    meta["profile"].update(
        {
            "cuda": ".".join(nvcc.split(".")[:2]),
            "python": facts["python"],
            "torch": facts["torch"],
            "archs": [arch],
        }
    )
    (ws / "kiln.toml").write_text(tomlkit.dumps(meta))
    # Only the torch extension: tinyinfer's compile weight is beside the point here.
    (ws / "vendors/tinyinfer.toml").unlink()
    (ws / "patches/series.toml").write_text(
        'tags = { vecadd = "scale" }\n\n[[patch]]\nfile = "vecadd-scale.patch"\ntarget = "vecadd"\n'
    )
    vendor = tomlkit.parse((ws / "vendors/vecadd.toml").read_text())
    vendor["build"]["archs"] = [arch]
    (ws / "vendors/vecadd.toml").write_text(tomlkit.dumps(vendor))

    mirrors = demo.prepare(ws, tmp_path / "upstreams")
    release = stages.build(
        Options(
            workspace=ws,
            artifacts=tmp_path / "artifacts",
            cache=tmp_path / "cache",
            work=tmp_path / "work",
            mirrors=mirrors,
            offline=True,
            python=python,
        )
    )
    data = json.loads((release / "manifest.json").read_text())
    (out,) = [o for o in data["vendors"]["vecadd"]["outputs"] if o["kind"] == "wheel"]
    assert out["shared_objects"][0]["sass"] == [arch]
    assert f"kiln-demo/{out['path']}" in artifacts_files(tmp_path / "artifacts")

    target = tmp_path / "site"
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            target,
            release / out["path"],
        ],
        check=True,
    )
    check = (
        "import torch, vecadd;"
        "a = torch.randn(1 << 20, device='cuda'); b = torch.randn(1 << 20, device='cuda');"
        "c = vecadd.axpy(a, b, 2.5); torch.cuda.synchronize();"
        "err = (c - (a + 2.5 * b)).abs().max().item();"
        "s = vecadd.scale(a, -3.0); err2 = (s + 3.0 * a).abs().max().item();"
        "print('max abs error', err, err2, torch.cuda.get_device_name());"
        "assert err < 1e-5 and err2 < 1e-5"
    )
    res = subprocess.run(
        [python, "-c", check],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    print(res.stdout, res.stderr)
    assert res.returncode == 0, res.stderr
    assert "max abs error" in res.stdout


@pytest.mark.gpu
def test_flashmla_from_its_bundle_passes_its_own_gpu_test(tmp_path: Path) -> None:
    """FlashMLA (examples/public) built by kiln's local runner for this GPU's arch from
    its git bundle, then `kiln gpu-test`: FlashMLA's own dense-decoding test against the
    release's wheel in a fresh environment. Needs the bundles ($KILN_BUNDLES)."""
    from tests import public

    python, facts = _gpu_python()
    major, minor = facts["cap"]
    arch = f"sm_{major}{minor}a"
    nvcc = nvcc_version(find_cuda_home())
    ws = public.copy_workspace(tmp_path / "ws")
    for other in ("deepep", "deepgemm"):
        (ws / "vendors" / f"{other}.toml").unlink()
    # FlashMLA's history and its CUTLASS commit are all this needs (what travels to a GPU
    # machine: $KILN_BUNDLES may hold just those two bundles).
    (ws / "bundles.toml").write_text(
        '[bundles]\n"https://github.com/deepseek-ai/FlashMLA" = "FlashMLA.bundle"\n'
        '"https://github.com/NVIDIA/cutlass.git" = "cutlass.bundle"\n'
    )
    meta = tomlkit.parse((ws / "kiln.toml").read_text())
    meta["profile"].update(
        {
            "cuda": ".".join(nvcc.split(".")[:2]),
            "python": facts["python"],
            "torch": facts["torch"],
            "archs": [arch],  # FlashMLA's toggles leave its other arch out
        }
    )
    (ws / "kiln.toml").write_text(tomlkit.dumps(meta))
    mirrors = public.mirrors(tmp_path / "mirrors", ws)
    release = stages.build(
        Options(
            workspace=ws,
            artifacts=tmp_path / "artifacts",
            cache=tmp_path / "cache",
            work=tmp_path / "work",
            mirrors=mirrors,
            offline=True,
            python=python,
            runner="local",
        )
    )
    res = subprocess.run(
        [
            sys.executable,
            *("-m", "kiln", "gpu-test", release, "flashmla", "--python", python),
            *("--cache", tmp_path / "cache", "--mirrors", mirrors, "--offline"),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    print(res.stdout[-3000:], res.stderr[-3000:])
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((release / "gpu-tests" / "flashmla.json").read_text())
    assert result["passed"] and result["gpus"][0]["name"]
    wheel = json.loads((release / "manifest.json").read_text())["vendors"]["flashmla"]["outputs"][0]
    assert result["wheel"]["sha256"] == wheel["sha256"]
