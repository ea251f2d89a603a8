"""`kiln demo`: the bundled torch CUDA extension, end to end, offline; then the
manifest check that must pass on it and fail after one byte of a wheel changes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomlkit
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from in_toto.models.metadata import Envelope as InTotoEnvelope  # type: ignore[import-untyped]
from securesystemslib.signer import SSlibKey

from kiln.release import manifest, signing
from kiln.verify.binaries import device_archs
from tests.conftest import CACHE, REPO, run_kiln
from tests.keys import keypair


@pytest.fixture(scope="module")
def demo_release(tmp_path_factory: pytest.TempPathFactory, build_python: Path) -> Path:
    root = tmp_path_factory.mktemp("demo")
    res = run_kiln(
        "demo",
        "--artifacts",
        root / "artifacts",
        "--work",
        root / "work",
        "--cache",
        CACHE,
        "--python",
        build_python,
    )
    assert res.returncode == 0, res.stderr
    return root / "artifacts" / "kiln-demo"


def test_demo_compiles_with_cuda_13_2_from_pypi(demo_release: Path) -> None:
    tc = json.loads((demo_release / "manifest.json").read_text())["toolchain"]
    assert tc["nvcc_version"].startswith("13.2.")
    names = {c["name"]: c for c in tc["components"]}
    assert names["nvidia-cuda-nvcc"]["version"].startswith("13.2.")
    assert all(len(c["sha256"]) == 64 for c in tc["components"])


def test_demo_leaves_wheel_manifest_and_logs(demo_release: Path) -> None:
    (wheel,) = (demo_release / "wheels").glob("*.whl")
    # the upstream version with kiln's label: CUDA, torch, commit, patch set
    assert re.fullmatch(
        r"vecadd-0\.3\.0\+cu132\.torch2\.14\.gabee68e\.p[0-9a-f]{7}"
        r"-cp311-cp311-manylinux_2_\d+_x86_64\.whl",  # repaired: the tag its symbols allow
        wheel.name,
    ), wheel.name
    data = json.loads((demo_release / "manifest.json").read_text())
    entry = data["vendors"]["vecadd"]
    assert entry["environment"]["TORCH_CUDA_ARCH_LIST"] == "10.0a;10.3a"
    assert entry["source"]["submodules"][0]["path"] == "third_party/mathlib"
    assert [p["file"] for p in entry["patches"]] == ["vecadd-scale.patch"]
    assert (demo_release.parent / "logs" / "kiln-demo" / "vecadd-build.log").stat().st_size > 0
    with zipfile.ZipFile(wheel) as zf:
        assert b"def scale(" in zf.read("vecadd/__init__.py")  # the patch is in


def test_demo_release_layout_matches_the_model_card(demo_release: Path) -> None:
    names = {p.name for p in demo_release.iterdir()}
    (tb,) = [n for n in names if n.endswith(".tar.zst")]
    assert tb == "tinyinfer-3a0e763-prefixcache-sm100-cu132-cp311.tar.zst"
    assert names == {
        "wheels",
        tb,
        "patches",
        "install.sh",
        "rebuild-tinyinfer-C.sh",
        "build-kiln-demo.sh",
        "licenses",
        "manifest.json",
        "README.md",
        "requirements.txt",
        "provenance.intoto.json",
        "sbom.cdx.json",
    }


def test_demo_extension_holds_both_archs(demo_release: Path, tmp_path: Path) -> None:
    """cuobjdump, run on the torch extension's .so by hand, shows sm_100a and sm_103a."""
    (wheel,) = (demo_release / "wheels").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [m for m in zf.namelist() if m.endswith(".so")]
        zf.extract(so, tmp_path)
    assert device_archs(tmp_path / so) == (["sm_100a", "sm_103a"], [])


def test_manifest_check_passes_then_fails_after_one_byte(
    demo_release: Path, tmp_path: Path
) -> None:
    res = run_kiln("manifest", "check", demo_release / "manifest.json")
    assert res.returncode == 0, res.stderr
    assert "every file matches" in res.stdout

    copy = tmp_path / "release"
    shutil.copytree(demo_release, copy)
    wheel = next((copy / "wheels").glob("*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    wheel.write_bytes(bytes(data))
    res = run_kiln("manifest", "check", copy / "manifest.json")
    assert res.returncode == 8  # ManifestError, as the exit-code table says
    assert f"wheels/{wheel.name}: sha256" in res.stderr
    assert "1 file(s) differ from the manifest" in res.stderr


def test_manifest_check_reports_a_missing_file(demo_release: Path, tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_bytes((demo_release / "manifest.json").read_bytes())
    res = run_kiln("manifest", "check", tmp_path / "manifest.json")
    assert res.returncode == 8 and ": missing" in res.stderr


def test_manifest_check_rejects_a_malformed_manifest(demo_release: Path, tmp_path: Path) -> None:
    data = json.loads((demo_release / "manifest.json").read_text())
    data["vendors"]["vecadd"]["source"]["commit"] = "abc"
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    res = run_kiln("manifest", "check", tmp_path / "manifest.json")
    assert res.returncode == 8
    assert "vendors/vecadd/source/commit" in res.stderr


@pytest.fixture(scope="module")
def demo_rebuild(
    demo_release: Path,
    signed_demo: tuple[Path, Path],
    build_python: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The signed release's own build-kiln-demo.sh (which runs `kiln verify`, no key at
    hand): a rebuild from the manifest alone, elsewhere, later, compared file by file.
    Its wheels and tarball are the unsigned demo's (the signed build took them from the
    artifact cache), so one rebuild serves both releases' tests."""
    release, _public = signed_demo
    into = tmp_path_factory.mktemp("verify")
    mirrors = demo_release.parent.parent / "work" / "demo-upstreams" / "mirrors.toml"
    res = subprocess.run(
        [
            "bash",
            str(release / "build-kiln-demo.sh"),
            str(REPO),
            str(into),
            "--mirrors",
            str(mirrors),
            "--offline",
            "--python",
            str(build_python),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "KILN_PYTHON": sys.executable},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "is reproduced bit for bit" in res.stdout
    return into / "artifacts" / "kiln-demo"


def test_verify_reproduces_the_torch_wheel_and_the_tarball(
    demo_release: Path, demo_rebuild: Path
) -> None:
    for pattern in ("wheels/*.whl", "*.tar.zst"):
        (a,) = demo_release.glob(pattern)
        (b,) = demo_rebuild.glob(pattern)
        digest_a, digest_b = (hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b))
        print(f"\n{a.name}: {digest_a} {digest_b}")
        assert digest_a == digest_b


def _rewrite_member(archive: Path, member: str, change) -> None:
    with zipfile.ZipFile(archive) as zf:
        items = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for info, data in items:
            out.writestr(info, change(data) if info.filename == member else data)


def test_verify_explains_a_difference_member_by_member(
    demo_release: Path, demo_rebuild: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "release"
    shutil.copytree(demo_release, copy)
    wheel = next((copy / "wheels").glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        so = next(m for m in zf.namelist() if m.endswith(".so"))
    _rewrite_member(wheel, "vecadd/__init__.py", lambda d: d.replace(b"a + alpha", b"a - alpha"))
    _rewrite_member(wheel, so, lambda d: d[:-1] + bytes([d[-1] ^ 1]))
    res = run_kiln("verify", copy / "manifest.json", "--rebuilt", demo_rebuild)
    assert res.returncode == 8  # NotReproduced
    assert f"wheels/{wheel.name}: sha256" in res.stderr
    assert "member vecadd/__init__.py: sha256" in res.stderr
    assert f"member {so}: sha256" in res.stderr
    assert "SASS sm_100a: identical" in res.stderr and "SASS sm_103a: identical" in res.stderr
    assert "is NOT reproduced" in res.stderr


def test_provenance_and_sbom_describe_the_outputs(demo_release: Path) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    data = json.loads((demo_release / "manifest.json").read_text())
    stmt = json.loads((demo_release / "provenance.intoto.json").read_text())
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    outputs = {
        o["path"]: o["sha256"]
        for v in data["vendors"].values()
        for o in v["outputs"]
        if o["kind"] in ("wheel", "tarball")
    }
    assert {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]} == outputs
    deps = stmt["predicate"]["buildDefinition"]["resolvedDependencies"]
    commits = {d["digest"].get("gitCommit") for d in deps}
    for v in data["vendors"].values():
        assert v["source"]["commit"] in commits
        assert all(s["commit"] in commits for s in v["source"]["submodules"])
    patch_digests = {d["digest"].get("sha256") for d in deps}
    assert all(p["sha256"] in patch_digests for v in data["vendors"].values() for p in v["patches"])
    sbom = (demo_release / "sbom.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(sbom) is None
    names = {c["name"] for c in json.loads(sbom)["components"]}
    assert {"vecadd", "tinyinfer", *outputs} <= names


def test_the_demo_release_as_wheel_variants(
    demo_release: Path, tmp_path: Path, build_python: Path
) -> None:
    """The demo workspace with ``[release] variant_wheels = true``: its vendors come from
    the artifact cache the demo's build filled (the option changes no vendor's output),
    and its CUDA wheel gets a variant wheel and an index beside it. Read back with
    variantlib, the variant's properties are exactly the archs the manifest verified."""
    from kiln.release import variants

    ws = tmp_path / "demo"
    shutil.copytree(REPO / "examples" / "demo", ws)
    toml = ws / "kiln.toml"
    text = toml.read_text()
    toml.write_text(
        text.replace("\ninstall_root = ", "\nvariant_wheels = true\ninstall_root = ", 1)
    )
    res = run_kiln(
        *("demo", "--workspace", ws, "--artifacts", tmp_path / "artifacts"),
        *("--work", tmp_path / "work", "--cache", CACHE, "--python", build_python),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    release = tmp_path / "artifacts" / "kiln-demo"
    data = json.loads((release / "manifest.json").read_text())
    assert data["release"]["variant_wheels"] is True
    (wheel,) = data["vendors"]["vecadd"]["outputs"][:1]
    verified = sorted({a for so in wheel["shared_objects"] for a in so["sass"]})
    assert verified == ["sm_100a", "sm_103a"]
    kinds = {f["path"]: f["kind"] for f in data["files"]}
    (variant,) = [p for p, k in kinds.items() if k == "variant-wheel"]
    assert variant.startswith(wheel["path"].removesuffix(".whl") + "-")
    desc = variants.read_variant(release / variant)
    assert sorted(p.to_str() for p in desc.properties) == [
        "nvidia :: cuda_version_lower_bound :: 13.2",
        "nvidia :: sm_arch :: 100_real",
        "nvidia :: sm_arch :: 103_real",
    ]
    index = f"wheels/vecadd-{wheel['version']}-variants.json"
    assert kinds[index] == "variants-index"
    listed = json.loads((release / index).read_text())["variants"]
    assert listed == {
        desc.label: {
            "nvidia": {"cuda_version_lower_bound": ["13.2"], "sm_arch": ["100_real", "103_real"]}
        }
    }
    # the plain wheel stays what install.sh installs
    assert wheel["path"] in (release / "install.sh").read_text()
    assert variant not in (release / "install.sh").read_text()
    assert run_kiln("manifest", "check", release / "manifest.json").returncode == 0


@pytest.fixture(scope="module")
def signed_demo(
    demo_release: Path, build_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """The demo built again with ``--sign`` (an Ed25519 test key): its outputs come from
    the artifact cache the first build filled; every file is signed. (release, public key)"""
    root = tmp_path_factory.mktemp("signed-demo")
    private, public = keypair(root, "release-signer")
    res = run_kiln(
        "demo",
        "--artifacts",
        root / "artifacts",
        "--work",
        demo_release.parent.parent / "work",
        "--cache",
        CACHE,
        "--python",
        build_python,
        "--sign",
        private,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "artifacts" / "kiln-demo", public


def _install(release: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """install.sh with no index (nothing it could download): a check that passes goes on
    to pip, which then fails on the first requirement; one that refuses stops first."""
    empty = tmp_path / "no-wheels"
    empty.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        ["bash", str(release / "install.sh"), str(tmp_path / "venv"), str(tmp_path / "t")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty), **env},
    )


def test_the_signed_demo_is_checked_by_kiln_in_toto_and_install_sh(
    signed_demo: tuple[Path, Path], tmp_path: Path
) -> None:
    release, public = signed_demo
    res = run_kiln("verify-release", release, "--key", public)
    assert res.returncode == 0, res.stderr
    data = json.loads((release / "provenance.intoto.dsse.json").read_text())
    key = SSlibKey.from_crypto(load_pem_public_key(public.read_bytes()))
    assert set(InTotoEnvelope.from_dict(data).verify([key], 1)) == {key.keyid}
    readme = (release / "README.md").read_text()
    assert f"signed by the key with keyid `{key.keyid}`" in readme
    assert re.search(r"\nbash \S+/install\.sh \S+ \S+ --pubkey \"\$KEY\"\n", readme), readme
    checked = _install(release, tmp_path, KILN_RELEASE_PUBKEY=str(public))
    assert "verify-release: " in checked.stderr and " files checked against " in checked.stderr
    assert checked.returncode not in (0, 19)  # past the check: pip found no torch offline
    # issue 55 (2): a signed release without a key is refused, nothing installed ...
    refused = _install(release, tmp_path / "u")
    assert refused.returncode == 19, refused.stderr
    assert "this release is signed" in refused.stderr and "--no-verify" in refused.stderr
    assert not (tmp_path / "u" / "venv").exists()
    # ... unless told so in so many words
    unchecked = subprocess.run(
        ["bash", str(release / "install.sh"), str(tmp_path / "n" / "venv"),
         str(tmp_path / "n" / "t"), "--no-verify"],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels")},
    )  # fmt: skip
    assert "install.sh: installing UNCHECKED: no public key given (--no-verify)" in (
        unchecked.stderr
    )


def _readme_check(release: Path, public: Path) -> subprocess.CompletedProcess[str]:
    """The signed demo README's install block, from its KEY line up to install.sh, run
    by bash in ``release`` (the README's release folder replaced by it) with ``public``
    as KEY."""
    text = (release / "README.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    start = next(n for n, line in enumerate(block) if line.startswith("KEY="))
    check = block[start + 1 : -1]  # up to install.sh's line
    assert check[-1].endswith("&& echo 'release checked: every file signed' &&"), check
    check[-1] = check[-1].removesuffix(" &&")
    folder = check[0].removeprefix("(cd ").removesuffix(" &&")  # the README's install root
    script = "\n".join([f"KEY={public}", *check]).replace(folder, str(release))
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)


def test_the_signed_demos_readme_check_trusts_nothing_in_the_release(
    signed_demo: tuple[Path, Path], tmp_path: Path
) -> None:
    """Issue 55 (2): the README's first instruction (openssl and sha256sum) passes the
    signed demo as built and as the Hub's client downloads it, and refuses it when its
    verify-release.py and a wheel were both changed (install.sh's own check would then
    run the changed checker)."""
    release, public = signed_demo
    hub = shutil.copytree(release, tmp_path / "hub")
    (hub / ".gitattributes").write_text("*.whl filter=lfs diff=lfs merge=lfs -text\n")
    (hub / ".cache/huggingface/download").mkdir(parents=True)
    (hub / ".cache/huggingface/download/README.md.metadata").write_text("x\ny\n1.0\n")
    for folder in (release, hub):
        res = _readme_check(folder, public)
        assert res.returncode == 0 and "release checked" in res.stdout, res
    changed = shutil.copytree(release, tmp_path / "changed")
    (changed / "verify-release.py").write_text("print('verify-release: 9 files checked')\n")
    (wheel,) = (changed / "wheels").glob("vecadd-*.whl")
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    res = _readme_check(changed, public)
    assert res.returncode != 0 and "release checked" not in res.stdout, res
    assert "verify-release.py: FAILED" in res.stdout and f"{wheel.name}: FAILED" in res.stdout


def test_install_sh_installs_nothing_from_a_signed_release_changed_after(
    signed_demo: tuple[Path, Path], tmp_path: Path
) -> None:
    release, public = signed_demo
    copy = tmp_path / "release"
    shutil.copytree(release, copy)
    (wheel,) = (copy / "wheels").glob("vecadd-*.whl")
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    res = _install(copy, tmp_path, KILN_RELEASE_PUBKEY=str(public))
    assert res.returncode == 19, res.stderr
    assert res.stderr.strip() == (
        f"verify-release: {copy}/wheels/{wheel.name}: changed after signing: do not install it"
    )
    assert not (tmp_path / "venv").exists()
    kiln = run_kiln("verify-release", copy, "--key", public)
    assert kiln.returncode == 19 and f"wheels/{wheel.name}: changed after signing" in kiln.stderr


def test_a_release_that_must_be_signed_is_refused_unsigned_before_anything(
    tmp_path: Path, build_python: Path
) -> None:
    """``[release] require_signature``: a build without --sign stops at its first stage,
    exit 19, and writes nothing into the artifacts folder."""
    ws = shutil.copytree(REPO / "examples" / "demo", tmp_path / "ws")
    doc = tomlkit.parse((ws / "kiln.toml").read_text())
    doc["release"]["require_signature"] = True
    (ws / "kiln.toml").write_text(tomlkit.dumps(doc))
    res = run_kiln(
        "demo", "--workspace", ws, "--artifacts", tmp_path / "a", "--work", tmp_path / "w",
        "--cache", CACHE,
    )  # fmt: skip
    assert res.returncode == 19, res.stderr
    assert res.stderr.strip().endswith(
        "[release] require_signature = true: this release is built signed: pass --sign "
        "KEY-URI (or set KILN_SIGN)"
    )
    assert not (tmp_path / "a").exists()


def test_kiln_verify_reproduces_the_signed_demo_without_its_key(
    signed_demo: tuple[Path, Path], demo_rebuild: Path
) -> None:
    """``kiln verify`` (the signed release's build-kiln-demo.sh: ``demo_rebuild``)
    rebuilds a signed release with no key at hand: every file the manifest lists (its
    README naming the signer, verify-release.py) and the manifest itself come out the
    same, and the release still checks against its signature. The rebuild signed with
    the release's key is the release's envelope, byte for byte: two builds, one key, the
    same signed bytes."""
    release, public = signed_demo
    assert run_kiln("verify-release", release, "--key", public).returncode == 0
    rebuilt = demo_rebuild
    assert (rebuilt / "manifest.json").read_bytes() == (release / "manifest.json").read_bytes()
    key = signing.load_signer(str(public.with_suffix(".pem")))
    signing.sign(rebuilt, manifest.read(rebuilt / "manifest.json"), key)
    envelope = signing.ENVELOPE_FILE
    assert (rebuilt / envelope).read_bytes() == (release / envelope).read_bytes()
