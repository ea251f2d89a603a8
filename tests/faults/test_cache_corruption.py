"""Fault 5a, a damaged bare-clone cache: a truncated loose object, a corrupt pack, a
damaged submodule clone. kiln notices (the checkout does not match its commit, or git
fails), confirms with ``git fsck``, drops the damaged clone and fetches it again from
the mirror; where it cannot, it says so in one line. Never used as is."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kiln.config.mirrors import Mirrors
from kiln.config.models import Source
from kiln.errors import SourceError
from kiln.sources.checkout import GitCache, checkout
from kiln.sources.git import git, git_out
from tests.upstreams import BASE_URL, SCALE_CUH, SETUP_PY, Upstreams

PLAIN = f"{BASE_URL}plain.git"
HDR = f"{BASE_URL}hdr.git"


def _object_file(bare: Path, rev: str) -> Path:
    sha = git_out("rev-parse", rev, cwd=bare)
    return bare / "objects" / sha[:2] / sha[2:]


@pytest.fixture
def warm(tmp_path: Path, upstreams: Upstreams) -> tuple[GitCache, str]:
    """A cache holding plain@2 (and hdr, its submodule), checked out once."""
    cache = GitCache(tmp_path / "cache", Mirrors.load(upstreams.mirrors), offline=True)
    checkout(cache, Source(url=PLAIN, commit=upstreams.plain[2]), tmp_path / "first", "plain")
    return cache, upstreams.plain[2]


def _check_repaired(cache: GitCache, commit: str, dest: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="kiln.sources.checkout"):
        co = checkout(cache, Source(url=PLAIN, commit=commit), dest, "plain")
    assert "is damaged" in caplog.text and "fetching it again" in caplog.text
    assert (dest / "setup.py").read_text() == SETUP_PY
    assert (dest / "third_party/hdr/include/hdr/scale.cuh").read_text() == SCALE_CUH
    assert co.commit == commit
    for url in (PLAIN, HDR):
        bare = cache.cached(url)
        assert bare is not None
        assert git("fsck", "--no-dangling", cwd=bare, check=False).returncode == 0


def test_truncated_loose_object_is_refetched(tmp_path: Path, warm, caplog) -> None:
    cache, commit = warm
    bare = cache.cached(PLAIN)
    assert bare is not None
    obj = _object_file(bare, f"{commit}:setup.py")
    data = obj.read_bytes()
    obj.chmod(0o644)
    obj.write_bytes(data[: len(data) // 2])
    _check_repaired(cache, commit, tmp_path / "again", caplog)


def test_corrupt_pack_is_refetched(tmp_path: Path, warm, caplog) -> None:
    cache, commit = warm
    bare = cache.cached(PLAIN)
    assert bare is not None
    git("repack", "-a", "-d", "-q", cwd=bare)
    (pack,) = (bare / "objects" / "pack").glob("*.pack")
    raw = bytearray(pack.read_bytes())
    for i in range(len(raw) // 3, len(raw) // 3 + 64):  # mid-pack: inside object data
        raw[i] ^= 0xFF
    pack.chmod(0o644)
    pack.write_bytes(bytes(raw))
    _check_repaired(cache, commit, tmp_path / "again", caplog)


def test_damaged_submodule_clone_is_refetched(
    tmp_path: Path, warm, caplog, upstreams: Upstreams
) -> None:
    cache, commit = warm
    bare = cache.cached(HDR)
    assert bare is not None
    obj = _object_file(bare, f"{upstreams.hdr[0]}:include/hdr/scale.cuh")  # plain@2's hdr
    obj.chmod(0o644)
    obj.write_bytes(b"x")
    _check_repaired(cache, commit, tmp_path / "again", caplog)


def test_damaged_clone_without_its_source_is_a_clear_error(
    tmp_path: Path, warm, upstreams: Upstreams
) -> None:
    cache, commit = warm
    bare = cache.cached(PLAIN)
    assert bare is not None
    obj = _object_file(bare, f"{commit}:setup.py")
    obj.chmod(0o644)
    obj.write_bytes(b"")
    gone = GitCache(tmp_path / "cache", Mirrors({BASE_URL: f"{tmp_path}/nowhere/"}), offline=True)
    with pytest.raises(SourceError) as info:
        checkout(gone, Source(url=PLAIN, commit=commit), tmp_path / "again", "plain")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"plain: the cached clone {bare} was damaged (")
    assert "and fetching it again failed: " in msg
    assert not (tmp_path / "again" / "setup.py").exists()
