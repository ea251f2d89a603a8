"""Sources: bare-clone cache, SHA resolution, pinned checkouts with submodules, mirrors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kiln.config.mirrors import Mirrors
from kiln.config.models import Source, Submodule
from kiln.errors import ConfigError, SourceError
from kiln.sources.checkout import GitCache, availability, checkout, resolve_relative, verify
from kiln.sources.git import git, git_out
from kiln.sources.gitrepo import CommitSpec, make_repo
from tests.upstreams import BASE_URL, Upstreams

PLAIN = f"{BASE_URL}plain.git"


@pytest.fixture
def cache(tmp_path: Path, upstreams: Upstreams) -> GitCache:
    return GitCache(tmp_path / "cache", Mirrors.load(upstreams.mirrors), offline=True)


def test_short_sha_resolves_to_full(cache: GitCache, upstreams: Upstreams) -> None:
    assert cache.resolve(PLAIN, upstreams.plain[1][:7], "plain") == upstreams.plain[1]


def test_unknown_sha_is_an_error(cache: GitCache) -> None:
    with pytest.raises(SourceError, match=r"plain: commit 0000000 is not in .*plain.git"):
        cache.resolve(PLAIN, "0000000", "plain")


def _colliding_commits(prefix_len: int = 7) -> tuple[bytes, bytes, str]:
    """Two commit objects whose SHAs share their first ``prefix_len`` hex digits."""
    tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the empty tree
    seen: dict[str, bytes] = {}
    i = 0
    while True:
        body = (f"tree {tree}\nauthor a <a@b> 0 +0000\ncommitter a <a@b> 0 +0000\n\n{i}\n").encode()
        sha = hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()
        key = sha[:prefix_len]
        if key in seen:
            return seen[key], body, key
        seen[key] = body
        i += 1


def test_ambiguous_sha_is_an_error(tmp_path: Path) -> None:
    repo = tmp_path / "amb.git"
    make_repo(repo, [CommitSpec("one", {"a": "a"})])
    first, second, prefix = _colliding_commits()
    for body in (first, second):
        (tmp_path / "obj").write_bytes(body)
        git("hash-object", "-t", "commit", "-w", tmp_path / "obj", cwd=repo)
    git("mktree", cwd=repo)  # ensure the empty tree exists
    cache = GitCache(tmp_path / "cache", Mirrors({"https://x.invalid/": f"{tmp_path}/"}))
    cache.fetch("https://x.invalid/amb.git", "amb")
    for body in (first, second):  # fetch copies reachable objects only: add both directly
        (tmp_path / "obj").write_bytes(body)
        git(
            "hash-object",
            "-t",
            "commit",
            "-w",
            tmp_path / "obj",
            cwd=cache.bare("https://x.invalid/amb.git"),
        )
    with pytest.raises(SourceError, match=rf"commit {prefix} is ambiguous .*pin more digits"):
        cache.resolve("https://x.invalid/amb.git", prefix, "amb")


def test_checkout_with_submodule(tmp_path: Path, cache: GitCache, upstreams: Upstreams) -> None:
    co = checkout(cache, Source(url=PLAIN, commit=upstreams.plain[2][:8]), tmp_path / "wt", "plain")
    assert co.commit == upstreams.plain[2]
    assert [(s.path, s.commit) for s in co.submodules] == [("third_party/hdr", upstreams.hdr[0])]
    assert (tmp_path / "wt/third_party/hdr/include/hdr/scale.cuh").exists()
    assert git_out("status", "--porcelain", cwd=tmp_path / "wt") == ""


def test_declared_submodule_commit_must_match(
    tmp_path: Path, cache: GitCache, upstreams: Upstreams
) -> None:
    source = Source(
        url=PLAIN,
        commit=upstreams.plain[2],
        submodules=[Submodule(path="third_party/hdr", commit=upstreams.hdr[1])],
    )
    with pytest.raises(SourceError, match="submodule third_party/hdr is at .* the lock says"):
        checkout(cache, source, tmp_path / "wt", "plain")


def test_declared_submodule_absent_from_tree(
    tmp_path: Path, cache: GitCache, upstreams: Upstreams
) -> None:
    source = Source(
        url=PLAIN,
        commit=upstreams.plain[2],
        submodules=[Submodule(path="third_party/hdr"), Submodule(path="third_party/other")],
    )
    with pytest.raises(SourceError, match="lists third_party/other, but the tree"):
        checkout(cache, source, tmp_path / "wt", "plain")


def test_missing_submodule_commit(tmp_path: Path) -> None:
    """The superproject records a submodule commit its upstream does not have."""
    hdr = make_repo(tmp_path / "up/hdr.git", [CommitSpec("hdr", {"x.h": "x"})])
    ghost = "1234567" + hdr[0][7:]
    sup = make_repo(
        tmp_path / "up/sup.git",
        [
            CommitSpec(
                "sup",
                {"a.txt": "a"},
                submodules={"third_party/hdr": ("https://x.invalid/hdr.git", ghost)},
            )
        ],
    )
    cache = GitCache(
        tmp_path / "cache", Mirrors({"https://x.invalid/": f"{tmp_path}/up/"}), offline=True
    )
    with pytest.raises(SourceError) as info:
        checkout(
            cache, Source(url="https://x.invalid/sup.git", commit=sup[0]), tmp_path / "wt", "sup"
        )
    assert f"sup: submodule third_party/hdr: commit {ghost} is not in" in str(info.value)


def test_verify_detects_a_moved_head(tmp_path: Path, cache: GitCache, upstreams: Upstreams) -> None:
    co = checkout(cache, Source(url=PLAIN, commit=upstreams.plain[2]), tmp_path / "wt", "plain")
    git("checkout", "--quiet", "--detach", upstreams.plain[1], cwd=co.path)
    with pytest.raises(SourceError, match="HEAD is .* expected"):
        verify(co, "plain")


def test_verify_detects_a_moved_submodule(
    tmp_path: Path, cache: GitCache, upstreams: Upstreams
) -> None:
    co = checkout(cache, Source(url=PLAIN, commit=upstreams.plain[2]), tmp_path / "wt", "plain")
    sub = co.path / "third_party/hdr"
    git("checkout", "--quiet", "--detach", upstreams.hdr[1], cwd=sub)
    with pytest.raises(SourceError, match="submodule third_party/hdr is at"):
        verify(co, "plain")


def test_offline_without_mirror_refuses_to_fetch(tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "cache", Mirrors(), offline=True)
    with pytest.raises(SourceError, match="--offline forbids fetching"):
        cache.resolve("https://github.com/deepseek-ai/DeepEP", "f6aa38f", "deepep")


def test_offline_with_a_network_mirror_says_the_mirror_is_the_problem(tmp_path: Path) -> None:
    """Issue 35: a mirror is configured, but it is an http:// URL: saying "not in the
    cache, add a local mirror" would send the user to what they already did."""
    url = "https://github.com/deepseek-ai/DeepEP"
    mirrors = Mirrors({"https://github.com/deepseek-ai/": "http://git.internal/mirrors/"})
    cache = GitCache(tmp_path / "cache", mirrors, offline=True)
    expected = (
        "deepep: the mirror configured for https://github.com/deepseek-ai/DeepEP is a network "
        "URL (http://git.internal/mirrors/DeepEP), which --offline forbids fetching from; map "
        "it to a local mirror (a folder) or drop --offline"
    )
    with pytest.raises(SourceError) as err:
        cache.resolve(url, "f6aa38f", "deepep")
    assert str(err.value) == expected
    assert str(availability(cache, url, "f6aa38f", "deepep")) == expected


def test_cache_is_reused_without_fetching(tmp_path: Path, upstreams: Upstreams) -> None:
    cache = GitCache(tmp_path / "cache", Mirrors.load(upstreams.mirrors), offline=True)
    cache.resolve(PLAIN, upstreams.plain[0], "plain")
    # A mirror that no longer exists: a cached commit still resolves, no fetch.
    gone = GitCache(tmp_path / "cache", Mirrors({BASE_URL: "/nonexistent/"}), offline=True)
    assert gone.resolve(PLAIN, upstreams.plain[0][:10], "plain") == upstreams.plain[0]


def test_a_mirror_whose_extra_tag_lacks_its_objects_still_serves_the_pinned_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 54 (5): a mirror with a tag whose commit object is gone (an incomplete mirror:
    git's fetch of every tag fails with "not our ref"). The pinned commit, complete, is
    fetched alone and checks out, with a warning naming the broken tag; a pinned commit
    that is itself the missing one fails naming that ref and the fix, not "rerun"."""
    mirror = tmp_path / "m" / "inc.git"
    pinned, side = make_repo(mirror, [CommitSpec("one", {"a": "1"}), CommitSpec("two", {"a": "2"})])
    git("tag", "extra", side, cwd=mirror)
    git("update-ref", "refs/heads/main", pinned, cwd=mirror)
    loose = mirror / ".git" / "objects" / side[:2] / side[2:]
    assert loose.is_file()  # make_repo leaves loose objects
    loose.unlink()
    cache = GitCache(tmp_path / "cache", Mirrors({"https://x.invalid/": f"{tmp_path}/m/"}))
    url = "https://x.invalid/inc.git"
    with caplog.at_level("WARNING"):
        assert cache.resolve(url, pinned, "inc") == pinned
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "the mirror's refs/tags/extra points at an object it does not hold" in said, said
    assert f"fetched the pinned commit {pinned[:12]} alone" in said
    co = checkout(cache, Source(url=url, commit=pinned), tmp_path / "co", "inc")
    assert (co.path / "a").read_text() == "1"
    # the pinned commit is the one missing: named, with the fix
    other = GitCache(tmp_path / "cache2", Mirrors({"https://x.invalid/": f"{tmp_path}/m/"}))
    with pytest.raises(SourceError) as err:
        other.resolve(url, side, "inc")
    assert "refs/tags/extra points at an object it does not hold" in str(err.value)
    assert "repair or delete that ref in" in str(err.value)
    assert "rerun once" not in str(err.value)


def test_mirrors_longest_prefix_and_relative_paths(tmp_path: Path) -> None:
    f = tmp_path / "m" / "mirrors.toml"
    f.parent.mkdir()
    f.write_text(
        '[mirrors]\n"https://github.com/" = "https://git.internal/gh/"\n'
        '"https://github.com/NVIDIA/cutlass" = "repos/cutlass.git"\n'
    )
    m = Mirrors.load(f)
    assert (
        m.map("https://github.com/deepseek-ai/DeepEP")
        == "https://git.internal/gh/deepseek-ai/DeepEP"
    )
    assert m.map("https://github.com/NVIDIA/cutlass.git") == f"{tmp_path}/m/repos/cutlass.git.git"
    assert m.map("https://example.org/x") == "https://example.org/x"


def test_mirrors_file_rejects_unknown_tables(tmp_path: Path) -> None:
    f = tmp_path / "mirrors.toml"
    f.write_text('[mirror]\n"a" = "b"\n')
    with pytest.raises(ConfigError, match="mirrors.toml: mirror: unknown key"):
        Mirrors.load(f)


def test_relative_submodule_urls() -> None:
    assert (
        resolve_relative("../fmt.git", "https://github.com/deepseek-ai/DeepEP")
        == "https://github.com/deepseek-ai/fmt.git"
    )
    assert resolve_relative("https://x/y", "https://a/b") == "https://x/y"


def test_what_a_checkout_read_is_its_own_threads(tmp_path: Path, upstreams: Upstreams) -> None:
    """Issue 55 (6): vendors check out at once, each in a thread of its own: the bare
    clones one checkout read, which it fscks on a failure, are its own thread's; another
    thread's checkout starting does not empty them (one set, rebound by each checkout,
    was iterated while others added to it)."""
    import threading

    cache = GitCache(tmp_path / "cache", Mirrors.load(upstreams.mirrors), offline=True)
    cache.start_reading()
    cache.resolve(PLAIN, upstreams.plain[0], "plain")
    mine = set(cache.used)
    assert mine == {cache.clone_path(PLAIN)}
    seen: list[set[Path]] = []

    def other() -> None:
        cache.start_reading()
        seen.append(set(cache.used))

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert seen == [set()]  # its own, empty
    assert cache.used == mine  # this thread's, untouched
