"""Fault 7, hostile inputs: shell metacharacters in a vendor TOML (URL, submodule path,
build environment, command arguments) stay data; URLs git would read as an option or
a command are refused; patches that write outside their tree and archives (in-place
tarballs, JIT caches) with escaping members are refused before anything is written."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from kiln.config.mirrors import Mirrors
from kiln.config.models import PatchEntry, Source
from kiln.config.workspace import Workspace
from kiln.errors import ArchiveError, ConfigError, PatchError, SourceError
from kiln.release import archive
from kiln.sources.checkout import GitCache, checkout
from kiln.sources.git import git_out
from kiln.sources.gitrepo import CommitSpec, make_repo
from kiln.sources.patches import apply_series
from tests.conftest import artifacts_files
from tests.faults.conftest import build_cli, error_lines, make_tiny, mirrors_file, tiny_workspace
from tests.upstreams import BASE_URL
from tests.workspace import write

MARK = "kiln-pwned"  # what every injection below would create


def _injections(marker: Path) -> list[str]:
    return [
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"&& touch {marker} #",
        f"| touch {marker}",
    ]


def _no_marker(*roots: Path) -> None:
    for root in roots:
        assert not [p for p in root.rglob(f"*{MARK}*")], f"an injection ran under {root}"


# ----------------------------------------------------------------------- vendor TOML


def test_build_env_and_arguments_are_data_not_shell(tmp_path: Path) -> None:
    """A whole build whose build.env and command arguments hold shell injections: they
    reach the build verbatim and nothing runs them."""
    marker = tmp_path / MARK
    up = tmp_path / "up"
    commit = make_tiny(up)
    mirrors = mirrors_file(up / "mirrors.toml", f"{up}/")
    evil = _injections(marker)
    # EVIL_NL: a newline, as a generated script's comment line would meet it.
    env = {"EVIL": " ".join(evil), "EVIL_NL": f"x\ntouch {marker}\n"}
    ws = tiny_workspace(tmp_path / "ws", commit, env=env)
    vendor = (ws / "vendors" / "tiny.toml").read_text()
    (ws / "vendors" / "tiny.toml").write_text(
        vendor.replace('"build.py"]', '"build.py", ' + ", ".join(f"'{e}'" for e in evil) + "]")
    )
    res = build_cli(ws, tmp_path, mirrors, "--offline")
    assert res.returncode == 0, res.stderr[-3000:]
    tree = next((tmp_path / "work").rglob("evil.txt")).parent
    assert (tree / "evil.txt").read_text() == " ".join(evil)
    assert (tree / "argv.txt").read_text().splitlines() == evil
    assert not marker.exists()
    # The release's build script states the recipe's environment in comments: run it (it
    # stops at its argument check) and nothing in those values may run.
    (script,) = (tmp_path / "artifacts").rglob("build-*.sh")
    assert "EVIL_NL=x\\ntouch" in script.read_text()
    again = subprocess.run(["bash", str(script), str(tmp_path / "nokiln"), str(tmp_path / "o")])
    assert again.returncode == 2
    assert not marker.exists()
    _no_marker(tmp_path)


@pytest.mark.parametrize("how", ["; touch {m}", "$(touch {m})", "`touch {m}`"])
def test_url_with_shell_syntax_is_passed_to_git_as_data(tmp_path: Path, how: str) -> None:
    marker = tmp_path / MARK
    url = f"{tmp_path}/up/x.git{how.format(m=marker)}"
    cache = GitCache(tmp_path / "cache", Mirrors(), offline=True)
    with pytest.raises(SourceError) as info:
        cache.resolve(url, "a" * 40, "evil")
    # one line, the URL verbatim: kiln checked the folder it names (there is none) before
    # any git command, which would have been given it as one argument
    assert "\n" not in str(info.value) and str(info.value).startswith(f"evil: {url}: ")
    # ... and through a mirrors file, whose targets are data too
    cache = GitCache(tmp_path / "cache", Mirrors({BASE_URL: url + "/"}), offline=True)
    with pytest.raises(SourceError):
        cache.resolve(f"{BASE_URL}y.git", "a" * 40, "evil")
    assert not marker.exists()


@pytest.mark.parametrize(
    "url,why",
    [
        ("--upload-pack=touch {m}", "starts with '-'"),
        ("ext::sh -c touch% {m}", "remote helper"),
        ("https://x.invalid/a.git\n[core]\n\tsshCommand = touch {m}", "control character"),
    ],
)
def test_url_git_would_run_is_refused(tmp_path: Path, url: str, why: str) -> None:
    marker = tmp_path / MARK
    url = url.format(m=marker)
    # In a vendor TOML: refused on load, naming the file and key.
    ws = write(
        tmp_path / "ws",
        {
            "v": {
                "source": {"url": url, "commit": "a" * 40},
                "build": {"kind": "wheel", "archs": [], "arch_control": "none"},
            }
        },
    )
    with pytest.raises(ConfigError, match=f"vendors/v.toml: source.url: .*{why}"):
        Workspace(ws)
    # Anywhere else (a mirrors file, an upstream's .gitmodules): refused before git runs.
    cache = GitCache(tmp_path / "cache", Mirrors({BASE_URL: url}), offline=False)
    with pytest.raises(SourceError, match="refusing it"):
        cache.resolve(f"{BASE_URL}z.git", "a" * 40, "evil")
    assert not marker.exists()


def test_hostile_gitmodules_of_an_upstream(tmp_path: Path) -> None:
    """An upstream whose submodule URL is a git option and one whose submodule path holds
    shell syntax: the first is refused, the second is only a (strange) folder name."""
    marker = tmp_path / MARK
    hdr = make_repo(tmp_path / "up/hdr.git", [CommitSpec("hdr", {"x.h": "x"})])
    evil_url = make_repo(
        tmp_path / "up/evilurl.git",
        [
            CommitSpec(
                "s", {"a": "a"}, submodules={"sub": (f"--upload-pack=touch {marker}", hdr[0])}
            )
        ],
    )
    odd_path = f"sub$(touch {MARK})`touch {MARK}`"
    evil_path = make_repo(
        tmp_path / "up/evilpath.git",
        [CommitSpec("s", {"a": "a"}, submodules={odd_path: ("https://x.invalid/hdr.git", hdr[0])})],
    )
    cache = GitCache(
        tmp_path / "cache", Mirrors({"https://x.invalid/": f"{tmp_path}/up/"}), offline=True
    )
    with pytest.raises(SourceError, match="submodule sub: URL .* starts with '-'.*refusing it"):
        checkout(
            cache,
            Source(url="https://x.invalid/evilurl.git", commit=evil_url[0]),
            tmp_path / "wt1",
            "evilurl",
        )
    co = checkout(
        cache,
        Source(url="https://x.invalid/evilpath.git", commit=evil_path[0]),
        tmp_path / "wt2",
        "evilpath",
    )
    assert [s.path for s in co.submodules] == [odd_path]
    assert (tmp_path / "wt2" / odd_path / "x.h").read_text() == "x"
    assert not marker.exists()
    assert not [p for p in tmp_path.rglob(MARK)]


@pytest.mark.parametrize(
    "key,value,expect",
    [
        ("build.import_check", f"os; open('{MARK}', 'w')", "is not a module name"),
        ("source.license", "../../../etc/passwd", "must be a path inside the tree"),
        ("build.outputs", ["../../*.so"], "must be a path inside the tree"),
        ("source.submodules", [{"path": "../outside"}], "must be a path inside the tree"),
    ],
)
def test_vendor_paths_and_code_are_refused(tmp_path: Path, key: str, value, expect: str) -> None:
    vendor: dict[str, dict[str, Any]] = {
        "source": {"url": f"{BASE_URL}t.git", "commit": "a" * 40},
        "build": {
            "kind": "inplace",
            "archs": [],
            "arch_control": "none",
            "command": ["true"],
            "outputs": ["x.so"],
        },
    }
    table, field = key.split(".")
    vendor[table][field] = value
    ws = write(tmp_path / "ws", {"v": vendor})
    with pytest.raises(ConfigError, match=f"vendors/v.toml: {key}.*{expect}"):
        Workspace(ws)
    assert not (tmp_path / MARK).exists()


def test_hostile_import_check_stops_the_cli_with_one_line(tmp_path: Path) -> None:
    up = tmp_path / "up"
    commit = make_tiny(up)
    ws = tiny_workspace(tmp_path / "ws", commit, import_check=f"os;open('{MARK}','w')")
    res = build_cli(ws, tmp_path, mirrors_file(up / "mirrors.toml", f"{up}/"), "--offline")
    assert res.returncode == 2, res.stderr
    assert len(error_lines(res.stderr)) == 1 and "is not a module name" in res.stderr
    assert artifacts_files(tmp_path / "artifacts") == []
    _no_marker(tmp_path)
    assert not (Path.cwd() / MARK).exists()


# ----------------------------------------------------------------------- patches

ORIGINAL = "one\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    repo = tmp_path / "tree"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f.txt").write_text("outside\n")
    make_repo(repo, [CommitSpec("base", {"src/a.txt": ORIGINAL})])
    os.symlink(tmp_path / "outside", repo / "link")  # an upstream may ship such a link
    return repo


def _new_file(path: str) -> str:
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+pwned\n"


PATCHES = {
    "dotdot": "--- a/../evil.txt\n+++ b/../evil.txt\n@@ -0,0 +1 @@\n+pwned\n",
    "deep-dotdot": _new_file("src/../../evil.txt"),
    "absolute": "--- /dev/null\n+++ b//tmp/kiln-pwned-abs.txt\n@@ -0,0 +1 @@\n+pwned\n",
    "through-link": (
        "diff --git a/link/f.txt b/link/f.txt\n--- a/link/f.txt\n+++ b/link/f.txt\n"
        "@@ -1 +1 @@\n-outside\n+pwned\n"
    ),
    "new-link-out": (
        "diff --git a/esc b/esc\nnew file mode 120000\n--- /dev/null\n+++ b/esc\n"
        "@@ -0,0 +1 @@\n+../outside\n\\ No newline at end of file\n"
    ),
    "new-link-abs": (
        "diff --git a/esc b/esc\nnew file mode 120000\n--- /dev/null\n+++ b/esc\n"
        "@@ -0,0 +1 @@\n+/etc\n\\ No newline at end of file\n"
    ),
}


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_patch_writing_outside_its_tree_is_refused(tmp_path: Path, tree: Path, name: str) -> None:
    good = "--- a/src/a.txt\n+++ b/src/a.txt\n@@ -1 +1 @@\n-one\n+two\n"
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "good.patch").write_text(good)
    (pdir / f"{name}.patch").write_text(PATCHES[name])
    entries = [
        PatchEntry(file="good.patch", target="t"),
        PatchEntry(file=f"{name}.patch", target="t"),
    ]
    with pytest.raises(PatchError) as info:
        apply_series(tree, entries, pdir, "t")
    msg = str(info.value)
    assert "\n" not in msg and f"patch {name}.patch" in msg
    assert "refusing it" in msg or "does not apply" in msg or "not a valid patch" in msg
    # nothing changed, inside or outside
    assert git_out("status", "--porcelain", cwd=tree) == "?? link"
    assert (tree / "src/a.txt").read_text() == ORIGINAL
    assert (tmp_path / "outside" / "f.txt").read_text() == "outside\n"
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/kiln-pwned-abs.txt").exists()
    assert not (tree / "esc").exists()


def test_escaping_patches_are_refused_by_kiln_itself(tmp_path: Path, tree: Path) -> None:
    """The refusal is kiln's (a clear reason), not only git's: these go red if the check
    in patches.py is dropped."""
    pdir = tmp_path / "patches"
    pdir.mkdir()
    for name, expect in [
        ("dotdot", "writes '../evil.txt', outside its tree"),
        ("through-link", "writes 'link/f.txt' through the symbolic link 'link'"),
        ("new-link-out", "makes 'esc' a link to '../outside', outside its tree"),
        ("new-link-abs", "makes 'esc' a link to '/etc', outside its tree"),
    ]:
        (pdir / f"{name}.patch").write_text(PATCHES[name])
        with pytest.raises(PatchError, match=f"patch {name}.patch {expect}; refusing it"):
            apply_series(tree, [PatchEntry(file=f"{name}.patch", target="t")], pdir, "t")


# ----------------------------------------------------------------------- archives


def _archive(path: Path, members: list[tuple[str, str, str]]) -> Path:
    """A .tar.zst of (name, kind, link-or-data) members, written as given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, extra in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind in ("sym", "hard"):
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = extra
                tar.addfile(info)
            else:
                data = extra.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


ESCAPES = {
    "dotdot": [("jit-cache/../../kiln-pwned", "file", "x")],
    "absolute": [("/tmp/kiln-pwned-abs", "file", "x")],
    "symlink-abs": [("jit-cache/deep_gemm/k", "sym", "/etc")],
    "symlink-up": [("jit-cache/k", "sym", "../../outside")],
    "hardlink-out": [("jit-cache/k", "hard", "../outside/f.txt")],
    "hardlink-abs": [("jit-cache/k", "hard", "/etc/passwd")],
    # No member says ".." at its top, yet b resolves to the folder's parent.
    "symlink-chain": [
        ("jit-cache/a", "sym", "."),
        ("jit-cache/b", "sym", "a/../.."),
        ("jit-cache/b/kiln-pwned", "file", "x"),
    ],
    # Each link stays inside when it is made; d is made a link to the top after l
    # pointed through it, so l/x lands above the folder.
    "link-retargeted-later": [
        ("t/d", "dir", ""),
        ("t/l", "sym", "d/.."),
        ("t/d", "sym", ".."),
        ("t/l/kiln-pwned", "file", "x"),
    ],
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_archive_with_escaping_members_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f.txt").write_text("outside\n")
    bad = _archive(tmp_path / f"jit-cache-{name}.tar.zst", ESCAPES[name])
    dest = tmp_path / "dest" / "inner"
    with pytest.raises(ArchiveError, match="refusing to unpack") as info:
        archive.unpack(bad, dest)
    assert "\n" not in str(info.value) and bad.name in str(info.value)
    assert not dest.exists() or not any(dest.rglob("*"))  # checked before any write
    assert not (tmp_path / "dest" / MARK).exists() and not (tmp_path / MARK).exists()
    assert not Path("/tmp/kiln-pwned-abs").exists()
    assert (tmp_path / "outside" / "f.txt").read_text() == "outside\n"


def test_links_inside_the_folder_still_unpack(tmp_path: Path) -> None:
    """The control: links that stay inside are kept (the checks do not refuse all links)."""
    good = _archive(
        tmp_path / "good.tar.zst",
        [
            ("t/inc", "dir", ""),
            ("t/inc/a.h", "file", "a"),
            ("t/sub", "dir", ""),
            ("t/sub/a.h", "sym", "../inc/a.h"),
            ("t/same", "sym", "."),
            ("t/same/b.h", "file", "b"),
            ("t/hard.h", "hard", "t/inc/a.h"),
        ],
    )
    archive.unpack(good, tmp_path / "dest")
    assert (tmp_path / "dest/t/sub/a.h").read_text() == "a"
    assert (tmp_path / "dest/t/b.h").read_text() == "b"
    assert (tmp_path / "dest/t/hard.h").read_text() == "a"


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside"])
def test_packing_a_jit_cache_with_a_link_out_is_refused(tmp_path: Path, target: str) -> None:
    """``pack-jit-cache`` packs a GPU run's cache folder; a link in it that points out
    would make an archive every unpacker refuses (or, with a careless one, follows)."""
    cache = tmp_path / "cache" / "deep_gemm"
    cache.mkdir(parents=True)
    (cache / "kernel.cubin").write_bytes(b"\0cubin")
    os.symlink(target, cache / "evil")
    dest = tmp_path / "release" / "jit-cache" / "jit-cache-x.tar.zst"
    with pytest.raises(ArchiveError, match=f"links to '{target}'.*outside"):
        archive.pack([(cache, "jit-cache/deep_gemm")], dest, 0)
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []


def test_a_packed_tarball_is_readable_by_another_user(tmp_path: Path) -> None:
    """Issue 55 (2): the tarball was written 0600 (mkstemp's mode, renamed into place):
    another user who downloads the release got a PermissionError traceback. Now 0644,
    as a file written with the usual umask."""
    folder = tmp_path / "tree"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    dest = archive.pack([(folder, "tree")], tmp_path / "out" / "tree.tar.zst", 0)
    assert dest.stat().st_mode & 0o777 == 0o644
