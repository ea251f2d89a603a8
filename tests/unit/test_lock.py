"""`kiln lock`: short SHAs become full ones, submodule commits and patch hashes are
recorded, and comments in the TOML files survive."""

from __future__ import annotations

from pathlib import Path

from kiln.config.mirrors import Mirrors
from kiln.config.workspace import Workspace
from kiln.fsutil import sha256_file
from kiln.sources.checkout import GitCache
from kiln.verbs.runtime_lock import lock, lock_runtime
from tests.conftest import run_kiln
from tests.upstreams import BASE_URL, Upstreams
from tests.workspace import write

VENDOR = f"""\
# the fixture upstream
[source]
url = "{BASE_URL}plain.git"
commit = "{{short}}"  # pinned by hand

[[source.submodules]]
path = "third_party/hdr"

[build]
kind = "wheel"
archs = ["sm_100a", "sm_103a"]
arch_control = "hardcoded"
"""


def test_lock_pins_full_shas_submodules_and_patch_hashes(
    tmp_path: Path, upstreams: Upstreams
) -> None:
    ws_dir = write(
        tmp_path / "ws",
        {},
        patches={"a.patch": "--- a/x\n+++ b/x\n"},
        series=[{"file": "a.patch", "target": "plain"}],
    )
    (ws_dir / "vendors" / "plain.toml").write_text(VENDOR.format(short=upstreams.plain[2][:7]))
    cache = GitCache(tmp_path / "cache", Mirrors.load(upstreams.mirrors), offline=True)

    changes = lock(Workspace(ws_dir), cache)
    assert f"plain: source.commit {upstreams.plain[2][:7]} -> {upstreams.plain[2]}" in changes

    text = (ws_dir / "vendors" / "plain.toml").read_text()
    assert f'commit = "{upstreams.plain[2]}"  # pinned by hand' in text
    assert "# the fixture upstream" in text
    ws = Workspace(ws_dir)
    assert ws.vendors["plain"].source.submodules[0].commit == upstreams.hdr[0]
    assert ws.series.patch[0].sha256 == sha256_file(ws_dir / "patches" / "a.patch")
    assert lock(ws, cache) == ["everything already pinned"]


def test_lock_with_unknown_commit_fails(tmp_path: Path, upstreams: Upstreams) -> None:
    ws_dir = write(tmp_path / "ws", {})
    (ws_dir / "vendors" / "plain.toml").write_text(VENDOR.format(short="deadbee"))
    res = run_kiln(
        "lock",
        "--workspace",
        ws_dir,
        "--cache",
        tmp_path / "cache",
        "--mirrors",
        upstreams.mirrors,
        "--offline",
    )
    assert res.returncode == 3
    assert "plain: commit deadbee is not in" in res.stderr
    assert 'commit = "deadbee"' in (ws_dir / "vendors" / "plain.toml").read_text()


def test_lock_with_malformed_commit_fails(tmp_path: Path) -> None:
    ws_dir = write(tmp_path / "ws", {})
    (ws_dir / "vendors" / "plain.toml").write_text(VENDOR.format(short="not-a-sha"))
    res = run_kiln("lock", "--workspace", ws_dir, "--cache", tmp_path / "cache")
    assert res.returncode == 2
    assert "vendors/plain.toml: source.commit: 'not-a-sha' is not a commit SHA" in res.stderr


def _offline_workspace(tmp_path: Path, monkeypatch, profile: dict | None = None) -> Path:
    """A workspace whose runtime-requirements.txt names the fixture wheel, with pip kept
    to the local wheelhouse (``tmp_path/wheelhouse``)."""
    ws_dir = write(tmp_path / "ws", {}, profile=profile)
    (ws_dir / "vendors" / "plain.toml").write_text(VENDOR.format(short="a" * 40))
    (ws_dir / "runtime-requirements.txt").write_text("kiln_fixture_dep==1.0\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheelhouse"))
    return ws_dir


def test_lock_pins_runtime_requirements_by_hash(tmp_path: Path, monkeypatch) -> None:
    from tests.integration.test_inplace import NO_TORCH, make_wheel

    wheel = make_wheel(tmp_path / "wheelhouse")
    ws_dir = _offline_workspace(tmp_path, monkeypatch, NO_TORCH)
    assert lock_runtime(Workspace(ws_dir)) == [
        "runtime requirements: 1 packages pinned by hash in runtime-requirements.lock"
    ]
    digest = sha256_file(wheel)
    lock = (ws_dir / "runtime-requirements.lock").read_text()
    assert f"kiln_fixture_dep==1.0 --hash=sha256:{digest}" in lock
    assert "torch==" not in lock
    assert lock_runtime(Workspace(ws_dir)) == []  # unchanged: nothing rewritten


def test_a_runtime_list_without_torch_keeps_the_profiles_torch(tmp_path: Path, monkeypatch) -> None:
    """The wheels are compiled against the profile's torch and require it: a
    runtime-requirements.txt that lists only the other packages (as the import proof's
    fix asks) must not lock a release without torch. Real pip, resolving from a local
    wheelhouse that holds a stand-in torch 2.14.1 (PyPI's is 5 GB with its CUDA wheels)."""
    from tests.integration.test_inplace import make_wheel

    make_wheel(tmp_path / "wheelhouse")
    torch = make_wheel(tmp_path / "wheelhouse", "torch", "2.14.1")
    ws_dir = _offline_workspace(tmp_path, monkeypatch)  # the profile's torch: 2.14.1+cu130
    assert lock_runtime(Workspace(ws_dir)) == [
        "runtime requirements: 2 packages pinned by hash in runtime-requirements.lock "
        "(runtime-requirements.txt names no torch: kept the profile's torch==2.14.1)"
    ]
    lock = (ws_dir / "runtime-requirements.lock").read_text()
    assert f"torch==2.14.1 --hash=sha256:{sha256_file(torch)}" in lock.splitlines()
    assert "# runtime-requirements.txt names no torch: the profile's torch" in lock


def test_install_requirements_keep_the_profiles_torch_unless_the_list_names_one(
    tmp_path: Path,
) -> None:
    from kiln.release.files import requirements

    (tmp_path / "runtime-requirements.txt").write_text("numpy==2.1.0\n")
    text = requirements(tmp_path, "2.14.1+cu130")
    assert text.splitlines()[0] == "numpy==2.1.0" and text.splitlines()[-1] == "torch==2.14.1"
    assert requirements(tmp_path, None) == "numpy==2.1.0\n"  # a profile without torch
    for named in ("torch==2.13.0\n", "Torch>=2\n", "torch  # any\n"):
        (tmp_path / "runtime-requirements.txt").write_text(named)
        assert requirements(tmp_path, "2.14.1+cu130") == named  # the list's own torch
    (tmp_path / "runtime-requirements.txt").write_text("torchvision==0.29.1\n")
    assert requirements(tmp_path, "2.14.1+cu130").endswith("torch==2.14.1\n")
