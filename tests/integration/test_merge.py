"""``kiln manifest merge``: partial releases of CI jobs into one, on real builds.

Two partial releases (as two matrix jobs make them: one vendor each) and the same release
built in one run are made once per module; each test copies what it changes.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln.errors import VerifyError
from kiln.release import manifest
from kiln.verbs.merge import CONTENT_FIELDS, HEADER_FIELDS
from tests import releases
from tests.conftest import run_kiln
from tests.keys import keypair
from tests.upstreams import Upstreams


@dataclass(frozen=True)
class Built:
    ws: Path
    alpha: Path  # partial: the job that built alpha
    beta: Path  # partial: the job that built beta
    full: Path  # both vendors, one run


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, upstreams: Upstreams, build_python: Path
) -> Built:
    root = tmp_path_factory.mktemp("merge")
    ws = releases.workspace(root / "ws", upstreams)
    args = (ws, root, upstreams, build_python)
    return Built(
        ws,
        releases.build(*args, "job-alpha", ["alpha"]),
        releases.build(*args, "job-beta", ["beta"]),
        releases.build(*args, "full"),
    )


def merge_cli(*args: str | Path):
    res = run_kiln("manifest", "merge", *args)
    return res.returncode, res.stdout, res.stderr


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: error: "), stderr
    return lines[0]


def test_merge_makes_the_release_one_run_makes(built: Built, tmp_path: Path) -> None:
    out = tmp_path / "release"
    rc, stdout, stderr = merge_cli(built.alpha, built.beta, "--workspace", built.ws, "--out", out)
    assert rc == 0, stderr
    assert stdout.strip() == f"merged 2 partial(s) into {out}"
    assert manifest.check(out / "manifest.json") == []

    # the manifests as released (the runs' figures are in their run records, not here)
    merged = json.loads((out / "manifest.json").read_text())
    full = json.loads((built.full / "manifest.json").read_text())
    assert set(merged["vendors"]) == {"alpha", "beta"}

    # Every file (wheels, licenses, patches, install.sh, README, provenance, SBOM) is the
    # one a single build writes, and so is the manifest, byte for byte.
    def hashes(data: dict) -> dict:
        outs = [o for v in data["vendors"].values() for o in v["outputs"]] + data["files"]
        return {o["path"]: o["sha256"] for o in outs}

    assert hashes(merged) == hashes(full)

    def made(data: dict) -> dict:
        return {
            **{k: data[k] for k in (*HEADER_FIELDS, "warnings", "files")},
            "vendors": {
                n: {k: e.get(k) for k in CONTENT_FIELDS} for n, e in data["vendors"].items()
            },
        }

    assert made(merged) == made(full)
    assert (out / "manifest.json").read_bytes() == (built.full / "manifest.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release"]  # no staging left


def test_merge_refuses_partials_that_do_not_cover_the_workspace(
    built: Built, tmp_path: Path
) -> None:
    out = tmp_path / "release"
    rc, _, stderr = merge_cli(built.alpha, "--workspace", built.ws, "--out", out)
    assert rc == 8
    assert "missing beta" in one_error_line(stderr)
    assert not out.exists()


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("toolchain", "nvcc_version", "13.0.88"),
        ("toolchain", "gcc_version", "9.9.9"),
        ("runner", "image", "runpod/pytorch:x@sha256:" + "0" * 64),
        ("runner", "builder", "sha256:" + "1" * 64),
        ("profile", "torch", "2.13.0+cu130"),
        ("release", "name", "another-release"),
    ],
)
def test_merge_refuses_jobs_made_another_way(
    built: Built, tmp_path: Path, section: str, key: str, value: str
) -> None:
    beta = releases.copy(built.beta, tmp_path / "job-beta")
    releases.edit_manifest(beta, lambda d: d[section].__setitem__(key, value))
    out = tmp_path / "release"
    rc, _, stderr = merge_cli(built.alpha, beta, "--out", out)
    assert rc == 8
    line = one_error_line(stderr)
    assert f"{built.alpha} and {beta} disagree on {section}.{key}" in line
    assert repr(value) in line
    assert not out.exists()


def test_a_failed_merge_leaves_the_previous_release_untouched(built: Built, tmp_path: Path) -> None:
    out = tmp_path / "release"
    assert merge_cli(built.alpha, built.beta, "--out", out)[0] == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    beta = releases.copy(built.beta, tmp_path / "job-beta")
    releases.edit_manifest(beta, lambda d: d["toolchain"].__setitem__("nvcc_version", "13.1.0"))
    assert merge_cli(built.alpha, beta, "--out", out)[0] == 8
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_merge_refuses_a_modified_wheel(built: Built, tmp_path: Path) -> None:
    alpha = releases.copy(built.alpha, tmp_path / "job-alpha")
    (wheel,) = (alpha / "wheels").glob("*.whl")
    with wheel.open("ab") as fh:
        fh.write(b"\0")
    out = tmp_path / "release"
    rc, _, stderr = merge_cli(alpha, built.beta, "--out", out)
    assert rc == 8
    line = one_error_line(stderr)
    assert f"{alpha}: wheels/{wheel.name}: size" in line and "rerun that job" in line
    assert not out.exists()


def test_merge_refuses_one_vendor_with_two_contents(built: Built, tmp_path: Path) -> None:
    again = releases.copy(built.alpha, tmp_path / "job-alpha-again")
    releases.edit_manifest(
        again, lambda d: d["vendors"]["alpha"]["environment"].__setitem__("MAX_JOBS", "8")
    )
    rc, _, stderr = merge_cli(built.alpha, again, built.beta, "--out", tmp_path / "release")
    assert rc == 8
    assert (
        f"vendor alpha is in both {built.alpha} and {again} with different contents "
        f"(vendors.alpha.environment.MAX_JOBS)" in one_error_line(stderr)
    )


def test_merge_accepts_one_vendor_twice_when_only_timings_differ(
    built: Built, tmp_path: Path
) -> None:
    again = releases.copy(built.alpha, tmp_path / "job-alpha-again")
    releases.edit_manifest(
        again, lambda d: d["vendors"]["alpha"].setdefault("timings", {}).update(build=99.0)
    )
    out = tmp_path / "release"
    rc, _, stderr = merge_cli(built.alpha, again, built.beta, "--out", out)
    assert rc == 0, stderr
    assert set(json.loads((out / "manifest.json").read_text())["vendors"]) == {"alpha", "beta"}


def test_merge_refuses_recorded_sass_other_than_the_recipe(built: Built, tmp_path: Path) -> None:
    alpha = releases.copy(built.alpha, tmp_path / "job-alpha")

    def drop_sm103(d: dict) -> None:
        for out in d["vendors"]["alpha"]["outputs"]:
            for so in out.get("shared_objects", []):
                if so["sass"]:
                    so["sass"] = ["sm_100a"]

    releases.edit_manifest(alpha, drop_sm103)
    rc, _, stderr = merge_cli(alpha, built.beta, "--out", tmp_path / "release")
    assert rc == 7
    assert "missing sm_103a" in one_error_line(stderr)


def test_merge_refuses_an_out_folder_that_is_not_a_release(built: Built, tmp_path: Path) -> None:
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    rc, _, stderr = merge_cli(built.alpha, built.beta, "--out", out)
    assert rc == 8
    assert "is not a kiln release folder" in one_error_line(stderr)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_merge_refuses_a_folder_without_manifest(built: Built, tmp_path: Path) -> None:
    rc, _, stderr = merge_cli(built.alpha, tmp_path, "--out", tmp_path / "release")
    assert rc == 8
    assert f"{tmp_path}/manifest.json: no manifest there" in one_error_line(stderr)


def test_verify_wheel_reads_the_sass_of_a_release_again(built: Built, tmp_path: Path) -> None:
    """What the release job runs after the merge, and what cibuildwheel's test runs."""
    res = run_kiln("verify-wheel", "--manifest", built.full / "manifest.json")
    assert res.returncode == 0, res.stderr
    assert "_kernels" in res.stdout and "sm_100a, sm_103a" in res.stdout
    assert "  imported where it lands (the profile's torch; libcuda: " in res.stdout
    assert "): plainext._host (" in res.stdout

    (wheel,) = (built.alpha / "wheels").glob("*.whl")
    ok = run_kiln("verify-wheel", wheel, "--workspace", built.ws, "--vendor", "alpha")
    assert ok.returncode == 0, ok.stderr
    wrong = run_kiln("verify-wheel", wheel, "--workspace", built.ws, "--archs", "sm_100a")
    assert wrong.returncode == 7 and "unexpected sm_103a" in one_error_line(wrong.stderr)

    copy = releases.copy(built.full, tmp_path / "release")

    def record_sm100_only(d: dict) -> None:
        for out in d["vendors"]["alpha"]["outputs"]:
            for so in out.get("shared_objects", []):
                if so["sass"]:
                    so["sass"] = ["sm_100a"]

    releases.edit_manifest(copy, record_sm100_only)
    res = run_kiln("verify-wheel", "--manifest", copy / "manifest.json")
    assert res.returncode == 7
    assert "the manifest records" in one_error_line(res.stderr)


def _rewrite(wheel: Path, dest: Path, edit) -> Path:
    """A copy of ``wheel`` named ``dest`` with ``edit(name, data) -> data`` applied."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w") as out:
        for info in src.infolist():
            out.writestr(info, edit(info.filename, src.read(info)))
    return dest


def test_verify_refuses_an_unrepaired_tag_and_a_missing_torch_pin(
    built: Built, tmp_path: Path
) -> None:
    from kiln.config.models import Profile
    from kiln.verify import binaries

    (wheel,) = (built.alpha / "wheels").glob("*.whl")
    profile = Profile.model_validate(manifest.read(built.alpha / "manifest.json").profile.data())
    archs = ["sm_100a", "sm_103a"]
    assert "-manylinux_2_" in wheel.name
    binaries.verify_wheel(wheel, archs, profile)  # as built: passes

    plain = re.sub(r"manylinux_2_\d+_x86_64", "linux_x86_64", wheel.name)
    unrepaired = _rewrite(wheel, tmp_path / plain, lambda _n, d: d)
    with pytest.raises(VerifyError, match="has shared objects but a linux_x86_64 tag"):
        binaries.verify_wheel(unrepaired, archs, profile)

    def drop_pin(name: str, data: bytes) -> bytes:
        if name.endswith(".dist-info/METADATA"):
            return data.replace(b"Requires-Dist: torch==2.14.1\n", b"")
        return data

    unpinned = _rewrite(wheel, tmp_path / wheel.name, drop_pin)
    with pytest.raises(VerifyError, match="METADATA does not pin torch==2.14.1"):
        binaries.verify_wheel(unpinned, archs, profile)
    binaries.verify_wheel(unpinned, archs, profile, torch_pin=False)  # cibuildwheel's wheels


def test_merge_signs_the_merged_release(built: Built, tmp_path: Path) -> None:
    """A partial's signature vouches for its own folder; the merged release is signed
    anew (``--sign``), every file of the merge a subject, and checks as one."""
    private, public = keypair(tmp_path, "merger")
    out = tmp_path / "release"
    rc, _stdout, stderr = merge_cli(built.alpha, built.beta, "--out", out, "--sign", private)
    assert rc == 0, stderr
    res = run_kiln("verify-release", out, "--key", public)
    assert res.returncode == 0, res.stderr
    assert manifest.read(out / "manifest.json").release.signed_by is not None
    unsigned = tmp_path / "unsigned"
    rc, _stdout, stderr = merge_cli(built.alpha, built.beta, "--out", unsigned)
    assert rc == 0, stderr
    refused = run_kiln("verify-release", unsigned, "--key", public)
    assert refused.returncode == 19 and "no signature envelope" in refused.stderr
