"""The import proof through ``kiln build`` (issue 34): real CUDA extension wheels
(tests/landing.py) that build and verify, installed as the release's install.sh
installs them into the consumer's environment and imported there. The bad inputs fail
their vendor before anything is published, one screen each with the cause and the fix,
exit code 18; a good release records every module's result in its manifest, and its
variant wheels read back with variantlib carry exactly the archs it verified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from kiln.config.workspace import Workspace
from kiln.errors import ImportFailed, VerifyError
from kiln.orchestrate import importproof
from kiln.release import manifest, variants
from tests import landing
from tests.conftest import artifacts_files, build_args, run_kiln, shared_cache
from tests.workspace import PROFILE, write

# No torch (its consumer environment is then a venv with nothing to install): CUDA 13.0
# from /usr/local/cuda, both SM100 archs.
PROFILE_NO_TORCH = {
    **{k: v for k, v in PROFILE.items() if k != "torch"},
    "cuda": "13.0",
    "archs": ["sm_100a", "sm_103a"],
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> landing.Landing:
    return landing.make(tmp_path_factory.mktemp("landing"))


def _build(
    tmp: Path, ws: Path, mirrors: Path, python: Path, *extra: str, env: dict[str, str] | None = None
):
    return run_kiln(
        *build_args(
            ws,
            tmp,
            *("--cuda-home", "/usr/local/cuda", "--no-compiler-cache", *extra),
            mirrors=mirrors,
            toolchain="system",
            python=python,
            cache=shared_cache(tmp / "cache"),
        ),
        env=env,
    )


def _record(tmp: Path, vendor: str) -> dict[str, Any]:
    path = tmp / "artifacts/logs/test-release" / f"{vendor}.failure.json"
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def test_wheels_that_do_not_land_fail_before_anything_is_published(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """Four wheels that kiln verified (SASS, tags, linkage) and that do not work where
    they land: a function declared and called but left out of setup.py's sources, a
    library nobody ships, an extension whose import needs a GPU, a package that raises."""
    bad = ("undefined-symbol", "nobody-ships", "needs-gpu", "raises")
    ws = write(
        tmp_path / "ws",
        {c: landing.vendor(c, cases.commits[c]) for c in bad},
        profile=PROFILE_NO_TORCH,
    )
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == ImportFailed.exit_code == 18, res.stderr[-4000:]
    assert artifacts_files(tmp_path / "artifacts") == []  # nothing published, nothing staged
    err = res.stderr
    # verified first, as the issue saw it: kiln's own checks pass these wheels
    assert "undefined-symbol: landing-0.1.0+" in err and "verified (sm_100a, sm_103a)" in err
    assert "release ready" not in err

    undefined = _record(tmp_path, "undefined-symbol")
    assert undefined["cause"]["row"] == "declared-never-compiled"
    assert "landing._C does not import where the release lands (its consumer environment):" in err
    assert "undefined symbol: _Z10kiln_scalei" in err
    assert "the symbol: kiln_scale(int) (undefined in landing/_C.cpython-311" in err
    assert "kiln_scale(int) is declared at csrc/ops.h:2 and defined at csrc/ops.cpp:2, " in err
    assert "  fix: add csrc/ops.cpp to the extension's sources in setup.py" in err

    ships = _record(tmp_path, "nobody-ships")
    assert ships["cause"]["row"] == "library-nobody-ships"
    assert "landing/_C.cpython-311-x86_64-linux-gnu.so needs libcudart.so.13, and nothing " in err
    assert "  fix: add nvidia-cuda-runtime to runtime-requirements.txt" in err

    gpu = _record(tmp_path, "needs-gpu")
    assert gpu["cause"]["row"] == "needs-gpu" and gpu["unit"].startswith("landing/_gpu.")
    assert "list it in build.import_proof.needs_gpu in vendors/needs-gpu.toml" in err

    raises = _record(tmp_path, "raises")
    assert raises["cause"]["row"] == "raises-at-import"
    assert (
        "  cause: importing landing._C raises RuntimeError: landing: configured for another "
        "cluster at landing/__init__.py:3 (the code of landing, which importing landing._C "
        "runs first)"
    ) in err.splitlines()


def test_a_good_release_records_each_module_and_its_variants_carry_the_verified_archs(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """``good`` imports; ``needs-gpu`` declares its GPU module, which is skipped here with
    the reason recorded. With ``[release] variant_wheels`` each CUDA wheel is also a
    variant wheel whose properties, read back with variantlib, are exactly the archs in
    the manifest; ``manifest check`` covers the variant files. A rerun is a no-op that
    keeps every proof (the artifact cache holds it)."""
    ws = write(
        tmp_path / "ws",
        {
            "good": landing.vendor("good", cases.commits["good"]),
            "needs-gpu": landing.vendor(
                "needs-gpu",
                cases.commits["needs-gpu"],
                import_proof={"needs_gpu": ["landing._gpu"]},
            ),
        },
        profile=PROFILE_NO_TORCH,
    )
    toml = ws / "kiln.toml"
    data = tomlkit.parse(toml.read_text())
    data["release"]["variant_wheels"] = True
    data["release"]["name"] = "test-release"
    toml.write_text(tomlkit.dumps(data))
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 0, res.stderr[-4000:]
    release = tmp_path / "artifacts" / "test-release"
    m = manifest.read(release / "manifest.json")
    assert manifest.check(release / "manifest.json") == []
    good = m.vendors["good"].outputs_of("wheel")[0]
    assert good.import_proof is not None
    assert [(x.module, x.kind, x.status) for x in good.import_proof.modules] == [
        ("landing._C", "extension", "ok"),
        ("landing", "package", "ok"),
    ]
    assert good.import_proof.needed["libc.so.6"] == "the system (C and C++ runtime)"
    gpu = m.vendors["needs-gpu"].outputs_of("wheel")[0].import_proof
    assert gpu is not None
    assert {x.module: (x.status, x.reason) for x in gpu.modules}["landing._gpu"] == (
        "skipped",
        "needs a GPU (build.import_proof.needs_gpu); this machine has no driver",
    )
    assert "good: import proof: landing._C, landing imported in " in res.stderr

    variant_files = [f for f in m.files if f.kind == "variant-wheel"]
    assert len(variant_files) == 2
    for f in variant_files:
        desc = variants.read_variant(release / f.path)
        vendor = next(
            o
            for v in m.vendors.values()
            for o in v.outputs_of("wheel")
            if f.path.startswith(o.path.removesuffix(".whl"))
        )
        verified = sorted({a for so in vendor.shared_objects or [] for a in so.sass})
        assert verified == ["sm_100a", "sm_103a"]
        assert sorted(p.to_str() for p in desc.properties) == [
            "nvidia :: cuda_version_lower_bound :: 13.0",
            *(f"nvidia :: sm_arch :: {variants.arch_value(a)}" for a in verified),
        ]
    versions = sorted(o.version or "" for v in m.vendors.values() for o in v.outputs_of("wheel"))
    assert sorted(f.path for f in m.files if f.kind == "variants-index") == [
        f"wheels/landing-{v}-variants.json" for v in versions
    ]
    # a variant file changed after the release is caught by manifest check
    variant = release / variant_files[0].path
    variant.write_bytes(variant.read_bytes() + b"\0")
    assert [p.path for p in manifest.check(release / "manifest.json")] == [variant_files[0].path]
    variant.write_bytes(variant.read_bytes()[:-1])

    # issue 41: verify-wheel reads variant wheels (it said "Invalid build number: cp311"),
    # one by one and through the manifest, whose every variant it checks too
    owner = next(
        n
        for n, v in m.vendors.items()
        for o in v.outputs_of("wheel")
        if variant.name.startswith(Path(o.path).stem)
    )
    res = run_kiln("verify-wheel", variant, "--workspace", ws, "--vendor", owner)
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_kiln("verify-wheel", "--manifest", release / "manifest.json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("variant properties: nvidia :: cuda_version_lower_bound :: 13.0") == 2
    # a variant whose properties do not say what its SASS holds is refused
    from kiln.verbs.wheel_check import variant_line
    from kiln.verify import binaries

    plain = release / good.path
    forged = variants.make_variant(plain, ["sm_100a"], [], "13.0", 0, tmp_path)
    report = binaries.verify_wheel(forged, ["sm_100a", "sm_103a"], Workspace(ws).profile)
    with pytest.raises(VerifyError, match=r"its variant properties say .*sm_arch :: 100_real, its"):
        variant_line(forged, report, "13.0")
    # ... and by verify-wheel alone (issue 55 (6): it checked only the SASS): a variant
    # whose variant.json claims sm_120a beside the sm_100a and sm_103a its SASS holds
    kept = run_kiln("verify-wheel", variant, "--workspace", ws, "--vendor", owner)
    assert "variant properties: nvidia :: cuda_version_lower_bound :: 13.0" in kept.stdout
    lying = variants.make_variant(plain, ["sm_100a", "sm_103a", "sm_120a"], [], "13.0", 0, tmp_path)
    res = run_kiln("verify-wheel", lying, "--workspace", ws, "--archs", "sm_100a", "sm_103a")
    assert res.returncode != 0, res.stdout + res.stderr
    assert "the variant does not say what is inside" in res.stderr, res.stderr[-2000:]

    again = _build(tmp_path, ws, cases.mirrors, build_python)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "import proof:" not in again.stderr  # the cache's entries keep their proofs
    m2 = manifest.read(release / "manifest.json")
    assert m2.vendors["good"].outputs_of("wheel")[0].import_proof == good.import_proof


def test_a_runtime_lock_with_another_torch_stops_the_build_before_it_starts(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """install.sh would install torch 2.13.0 for wheels compiled against (and requiring)
    torch 2.14.1: refused in preflight, with the pin to change, before anything is
    fetched or compiled."""
    ws = write(
        tmp_path / "ws",
        {"good": landing.vendor("good", cases.commits["good"])},
        profile={**PROFILE, "cuda": "13.0"},
    )
    (ws / "runtime-requirements.txt").write_text("numpy\ntorch==2.13.0\n")
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 9, res.stderr[-3000:]
    assert (
        "  - runtime-requirements.txt pins torch==2.13.0, but the wheels are compiled against "
        "the profile's torch 2.14.1+cu130 and require torch==2.14.1: install.sh would install a "
        "torch they cannot load; pin torch==2.14.1 in runtime-requirements.txt and run `kiln "
        "lock` (or set the profile's torch to the one pinned there)"
    ) in res.stderr.splitlines()
    assert "fetching" not in res.stderr
    assert artifacts_files(tmp_path / "artifacts") == []


def test_a_consumer_environment_that_cannot_be_made_says_what_pip_said(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """A runtime requirement no index has: the one-line error carries the installer's
    own error line and its cause (uv's, with pip's settings: no index), not only the
    log's path, and nothing is published."""
    ws = write(
        tmp_path / "ws",
        {"good": landing.vendor("good", cases.commits["good"])},
        profile=PROFILE_NO_TORCH,
    )
    (ws / "runtime-requirements.txt").write_text("kiln-no-such-distribution==1.0\n")
    # no index at all: pip's answer is immediate and the same on every machine
    res = _build(
        tmp_path, ws, cases.mirrors, build_python, env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    )
    assert res.returncode != 0, res.stderr[-3000:]
    assert "the consumer environment (what the release's install.sh makes from " in res.stderr
    assert (
        "(error: No solution found when resolving dependencies cause: Because "
        "kiln-no-such-distribution was not found in the provided package locations"
    ) in res.stderr, res.stderr[-3000:]
    assert artifacts_files(tmp_path / "artifacts") == []


def test_a_cold_caches_consumer_environment_links_torch_from_the_build_venvs_uv_cache(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """A kiln cache with no environments of its own (a cold run's), the build venv kiln
    made in another: the consumer environment's torch is linked from the uv cache that
    filled the build venv (the same inodes as the build venv's files), not unpacked again,
    and the build is proven with it."""
    profile = {**PROFILE_NO_TORCH, "torch": PROFILE["torch"]}
    ws = write(
        tmp_path / "ws", {"good": landing.vendor("good", cases.commits["good"])}, profile=profile
    )
    cache = tmp_path / "cache"
    (cache / "envs").mkdir(parents=True)  # its own folder, not the session's (shared_cache)
    res = run_kiln(
        *build_args(
            ws,
            tmp_path,
            *("--cuda-home", "/usr/local/cuda", "--no-compiler-cache"),
            mirrors=cases.mirrors,
            toolchain="system",
            python=build_python,
            cache=shared_cache(cache),
        )
    )
    assert res.returncode == 0, res.stderr[-4000:]
    made = sorted((cache / "envs").glob("consumer-*/lib/python3*/site-packages/torch/__init__.py"))
    assert len(made) == 1, sorted(p.name for p in (cache / "envs").iterdir())
    theirs = sorted(build_python.parent.parent.glob("lib/python3*/site-packages/torch/__init__.py"))
    assert made[0].stat().st_ino == theirs[0].stat().st_ino
    assert not (cache / "envs" / ".uv-cache").exists()
    # no bytecode compiled for all of it: the proof's imports keep theirs beside it
    env = made[0].parents[4]
    assert not (made[0].parent / "__pycache__").exists()
    kept = sorted(Path(f"{env}.pycache").rglob("*.pyc"))
    assert any(p.parent.name == "landing" for p in kept), kept[:5]
    # torch's bytecode compiled once beside the compiles, before the proof's imports
    # (which each compiled it, side by side): the warm-up's marker and torch's own
    assert (Path(f"{env}.pycache") / importproof.WARM_MARKER).is_file()
    assert any("/torch/" in str(p) for p in kept)


def test_the_build_pythons_own_distributions_prove_a_wheel_where_there_is_no_index(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """Issue 53 (4): a builder without an index (the GPU machine) proves with
    ``--proof-env build-python``: the consumer environment sees the build Python's own
    distributions, checked to meet the requirements first, and the manifest records it;
    requirements the build Python does not meet stop the build, named, nothing published."""
    profile = {**PROFILE_NO_TORCH, "torch": PROFILE["torch"]}
    ws = write(
        tmp_path / "ws", {"good": landing.vendor("good", cases.commits["good"])}, profile=profile
    )
    no_index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    res = _build(
        tmp_path, ws, cases.mirrors, build_python, "--proof-env", "build-python", env=no_index
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "the consumer environment is the build Python's own distributions" in res.stderr
    m = manifest.read(tmp_path / "artifacts" / "test-release" / manifest.FILE_NAME)
    (wheel,) = m.vendors["good"].outputs_of("wheel")
    proof = wheel.import_proof
    assert proof is not None and proof.environment_from == "build-python"
    assert {x.status for x in proof.modules} == {"ok"}

    (ws / "runtime-requirements.txt").write_text(
        f"torch=={PROFILE['torch']}\nkiln-no-such-distribution==1.0\n"
    )
    again = tmp_path / "again"
    res = _build(
        again, ws, cases.mirrors, build_python, "--proof-env", "build-python", env=no_index
    )
    assert res.returncode != 0, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "--proof-env build-python: the build Python" in last, last
    assert "kiln-no-such-distribution==1.0 (not installed)" in last, last
    assert artifacts_files(again / "artifacts") == []


def test_a_wheel_reaching_an_nvidia_wheels_library_by_runpath_is_proven_as_it_lands(
    tmp_path: Path, cases: landing.Landing, build_python: Path
) -> None:
    """Issue 55 (4): a wheel linked to a library an NVIDIA-style wheel of the consumer
    environment ships (``nvidia/cu13/lib/libcublas_kilnfake.so.1``: a ``libcublas*``
    name, so auditwheel does not graft it, as for cuBLAS), reached through RUNPATH
    ``$ORIGIN/../nvidia/cu13/lib`` as torch's extensions reach cuBLAS: install.sh puts
    both in one site-packages, where it loads; the proof lands it the same way and
    releases it (with the environment on a ``.pth`` beside the proof's venv it failed:
    "libcublas_kilnfake.so.1: cannot open shared object file")."""
    import subprocess

    from tests.integration.test_inplace import make_wheel

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "fake.c").write_text("int kiln_fake(void) { return 7; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcublas_kilnfake.so.1", str(lib / "fake.c"),
         "-o", str(lib / "libcublas_kilnfake.so.1")],
        check=True,
    )  # fmt: skip
    (lib / "libcublas_kilnfake.so").symlink_to("libcublas_kilnfake.so.1")
    wheelhouse = tmp_path / "wheelhouse"
    shipped = {
        "nvidia/cu13/lib/libcublas_kilnfake.so.1": (lib / "libcublas_kilnfake.so.1").read_bytes()
    }
    make_wheel(wheelhouse, "kiln_fake_nvidia", "1.1", shipped)
    recipe = landing.vendor("nvidia-runpath", cases.commits["nvidia-runpath"])
    recipe["build"]["env"] = {"LIBRARY_PATH": str(lib)}  # where it links
    ws = write(tmp_path / "ws", {"nvidia-runpath": recipe}, profile=PROFILE_NO_TORCH)
    (ws / "runtime-requirements.txt").write_text("kiln_fake_nvidia==1.1\n")
    offline_pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    res = _build(tmp_path, ws, cases.mirrors, build_python, env=offline_pip)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "release ready" in res.stderr
