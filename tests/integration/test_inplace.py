"""A DeepInfer-shaped upstream (tinyinfer: build.sh, a package with a `_C` of twelve
CUDA files, a patch) through the whole flow: built in place, packed as a tarball, a
release folder, install.sh into a fresh venv from local wheels, import from the
installed tree, and rebuild_c after a patch edit."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import zstandard

from kiln.config.workspace import Workspace
from kiln.errors import ArchiveError, BuildError, VerifyError
from kiln.orchestrate import stages
from kiln.orchestrate.kinds.inplace import arch_family, pack_tree
from kiln.orchestrate.options import Options
from kiln.release import archive, manifest
from kiln.verbs import demo_workspace as demo
from tests.conftest import REPO, run_kiln, shared_cache
from tests.upstreams import Upstreams
from tests.workspace import PROFILE, plain_vendor, write

DEMO = REPO / "examples" / "demo"
DEP = "kiln_fixture_dep"
NO_TORCH = {k: v for k, v in PROFILE.items() if k != "torch"}


def make_wheel(
    folder: Path, name: str = DEP, version: str = "1.0", extra: dict[str, bytes] | None = None
) -> Path:
    """A tiny pure-Python wheel for install.sh to install from a local folder (``extra``:
    more files in it, by path)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        **(extra or {}),
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kiln-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def tiny(
    tmp_path_factory: pytest.TempPathFactory,
    upstreams: Upstreams,
    build_python: Path,
    pypi_cuda: Path,
) -> dict:
    """A release of tinyinfer (in place) and plainext (a host-only wheel), built once.
    Neither uses torch: the profile has none, and the release's runtime requirement is a
    fixture wheel of a local wheelhouse, which the import proof's consumer environment
    finds as install.sh does, through pip's own PIP_FIND_LINKS."""
    root = tmp_path_factory.mktemp("tiny")
    demo_mirrors = demo.prepare(DEMO, root / "demo-upstreams")
    mirrors = root / "mirrors.toml"
    mirrors.write_text(
        demo_mirrors.read_text() + upstreams.mirrors.read_text().replace("[mirrors]\n", "")
    )
    wheelhouse = root / "wheelhouse"
    dep = make_wheel(wheelhouse)
    ws = write(
        root / "ws",
        {
            "tinyinfer": _vendor_toml("tinyinfer"),
            "plain": plain_vendor(upstreams.plain[0], archs=[]),
        },
        patches={
            "tinyinfer-prefix-cache.patch": (
                DEMO / "patches/tinyinfer-prefix-cache.patch"
            ).read_text()
        },
        series=[{"file": "tinyinfer-prefix-cache.patch", "target": "tinyinfer"}],
        profile=NO_TORCH,
    )
    series = ws / "patches/series.toml"
    series.write_text('tags = { tinyinfer = "prefixcache" }\n' + series.read_text())
    with open(ws / "kiln.toml", "a") as fh:  # the workspace names its JIT caches (the README)
        fh.write(
            '\n[[release.jit_caches]]\nname = "deep_gemm"\nvariable = "DG_JIT_CACHE_DIR"\n'
            '\n[[release.jit_caches]]\nname = "tilelang"\nvariable = "TILELANG_CACHE_DIR"\n'
        )
    digest = hashlib.sha256(dep.read_bytes()).hexdigest()
    (ws / "runtime-requirements.txt").write_text(f"{DEP}==1.0 --hash=sha256:{digest}\n")
    opts = Options(
        workspace=ws,
        artifacts=root / "artifacts",
        cache=shared_cache(root / "cache"),
        work=root / "work",
        mirrors=mirrors,
        offline=True,
        python=str(build_python),
        toolchain="pypi",
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PIP_FIND_LINKS", str(wheelhouse))
        env.setenv("PIP_NO_INDEX", "1")
        release = stages.build(opts)
    return {
        "root": root,
        "ws": ws,
        "release": release,
        "wheelhouse": wheelhouse,
        "opts": opts,
        "python": build_python,
        "cuda": {"CUDA_HOME": str(pypi_cuda)},  # rebuild with the CUDA the tree was built with
        "mirrors": mirrors,
    }


def _vendor_toml(name: str) -> dict:
    return tomllib.loads((DEMO / "vendors" / f"{name}.toml").read_text())


def tarball(release: Path) -> Path:
    (tb,) = release.glob("*.tar.zst")
    return tb


def test_release_layout_matches_the_model_card(tiny: dict) -> None:
    release = tiny["release"]
    names = sorted(p.name for p in release.iterdir())
    tb = tarball(release).name
    assert names == sorted(
        [
            "wheels",
            tb,
            "patches",
            "install.sh",
            "rebuild-tinyinfer-C.sh",
            "build-test-release.sh",
            "licenses",
            "manifest.json",
            "README.md",
            "requirements.txt",
            "provenance.intoto.json",
            "sbom.cdx.json",
        ]
    )
    assert tb.startswith("tinyinfer-3a0e763-prefixcache-sm100-cu132-cp311")
    assert sorted(p.name for p in (release / "licenses").iterdir()) == [
        "plain-LICENSE",
        "tinyinfer-LICENSE",
    ]
    assert [p.name for p in (release / "patches").iterdir()] == ["tinyinfer-prefix-cache.patch"]
    assert manifest.check(release / "manifest.json") == []
    data = json.loads((release / "manifest.json").read_text())
    out = data["vendors"]["tinyinfer"]["outputs"][0]
    assert out["kind"] == "tarball"
    assert out["shared_objects"][0]["sass"] == ["sm_100a", "sm_103a"]
    # the tree unpacked from the tarball as install.sh unpacks it, imported there
    proof = out["import_proof"]
    assert [(m["module"], m["kind"], m["status"]) for m in proof["modules"]] == [
        ("tinyinfer._C", "extension", "ok"),
        ("tinyinfer", "package", "ok"),
    ]
    readme = (release / "README.md").read_text()
    assert "3a0e7637e2fd8f17325b1fb722d55b6478835a70" in readme
    assert "/release/install.sh /opt/kiln/venv /opt/kiln" in readme and "hf download" in readme
    assert "DG_JIT_CACHE_DIR" in readme


def test_tarball_is_deterministic_and_clean(tiny: dict, tmp_path: Path) -> None:
    tb = tarball(tiny["release"])
    infos = archive.list_members(tb)
    names = [i.name for i in infos]
    data = json.loads((tiny["release"] / "manifest.json").read_text())
    epoch = data["vendors"]["tinyinfer"]["source"]["commit_time"]
    assert names == sorted(names)
    assert {i.mtime for i in infos} == {epoch}
    assert {(i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0, "", "")}
    assert {i.mode for i in infos} <= {0o644, 0o755, 0o777}
    assert not any("/.git" in n or "/build/" in n or "__pycache__" in n for n in names)
    assert "tinyinfer/.kiln/tree.json" in names
    assert any(n.startswith("tinyinfer/.kiln/objcache/objects/") for n in names)
    assert "tinyinfer/build.sh" in names and any(n.endswith(".so") for n in names)

    # The same tree packed again, from another folder: the same bytes.
    tree = tiny["opts"].work / "test-release" / "tinyinfer"
    copy = tmp_path / "elsewhere" / "tinyinfer"
    shutil.copytree(tree, copy, symlinks=True)

    vendor = Workspace(tiny["ws"]).vendors["tinyinfer"]
    again = pack_tree(copy, tmp_path / "out" / tb.name, vendor, epoch)
    assert (
        hashlib.sha256(again.read_bytes()).hexdigest()
        == hashlib.sha256(tb.read_bytes()).hexdigest()
    )


def test_arch_family() -> None:
    assert arch_family(["sm_100a", "sm_103a"]) == "sm100"
    assert arch_family(["sm_90a"]) == "sm90"
    assert arch_family(["sm_90a", "sm_100a"]) == "sm90-sm100"


def _bad_archive(path: Path, member: str, kind: str = "file", link: str = "") -> Path:
    raw = path.with_suffix("")
    with tarfile.open(raw, "w") as tar:
        info = tarfile.TarInfo(member)
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        else:
            info.size = 4
            import io

            tar.addfile(info, io.BytesIO(b"evil"))
    path.write_bytes(zstandard.ZstdCompressor().compress(raw.read_bytes()))
    return path


@pytest.mark.parametrize(
    "member,kind,link",
    [
        ("../evil.txt", "file", ""),
        ("/tmp/kiln-evil-absolute.txt", "file", ""),
        ("tree/x/../../../evil.txt", "file", ""),
        ("tree/passwd", "symlink", "/etc/passwd"),
        ("tree/up", "symlink", "../../outside"),
    ],
)
def test_unpack_refuses_escaping_members(tmp_path: Path, member: str, kind: str, link: str) -> None:
    bad = _bad_archive(tmp_path / "bad.tar.zst", member, kind, link)
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError, match="refusing to unpack"):
        archive.unpack(bad, dest)
    assert not dest.exists() or not any(dest.rglob("*"))
    assert not (tmp_path / "evil.txt").exists()
    assert not Path("/tmp/kiln-evil-absolute.txt").exists()


def _tree_state(tree: Path) -> dict[str, str]:
    return {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.name != "rebuild.log"
    }


@pytest.fixture
def installed(tiny: dict, tmp_path: Path) -> Path:
    archive.unpack(tarball(tiny["release"]), tmp_path / "installed")
    return tmp_path / "installed" / "tinyinfer"


def _call(tree: Path, python: Path, fn: str) -> str:
    res = subprocess.run(
        [str(python), "-c", f"import tinyinfer; print(tinyinfer.{fn}())"],
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return res.stdout.strip()


def test_rebuild_c_after_a_patch_edit_recompiles_only_what_changed(
    tiny: dict, installed: Path, tmp_path: Path
) -> None:
    assert _call(installed, tiny["python"], "prefix_cache_block_size") == "64"
    edited = tmp_path / "tinyinfer-prefix-cache.patch"
    edited.write_text(
        (tiny["ws"] / "patches/tinyinfer-prefix-cache.patch")
        .read_text()
        .replace("prefix_cache_block_tokens = 64", "prefix_cache_block_tokens = 128")
    )
    res = run_kiln(
        "rebuild-c",
        installed,
        edited,
        "--workspace",
        tiny["ws"],
        "--python",
        tiny["python"],
        env={"KILN_OBJCACHE_VERBOSE": "1", **tiny["cuda"]},
    )
    assert res.returncode == 0, res.stderr
    assert "rebuilt tinyinfer/_C" in res.stdout and "sm_100a, sm_103a" in res.stdout
    assert _call(installed, tiny["python"], "prefix_cache_block_size") == "128"
    log = (installed / ".kiln/rebuild.log").read_text()
    misses = [ln.split()[-1] for ln in log.splitlines() if ln.startswith("objcache: miss")]
    hits = [ln for ln in log.splitlines() if ln.startswith("objcache: hit")]
    assert [Path(m).name for m in misses] == ["module.cpp"], log[-2000:]
    assert len(hits) == 12
    # and the edit loop goes on: the 128 version is now the one reverted next time
    assert "= 128" in (installed / ".kiln/applied/tinyinfer-prefix-cache.patch").read_text()
    again = edited.read_text().replace("= 128", "= 256")
    edited.write_text(again)
    res = run_kiln(
        "rebuild-c",
        installed,
        edited,
        "--workspace",
        tiny["ws"],
        "--python",
        tiny["python"],
        env=tiny["cuda"],
    )
    assert res.returncode == 0, res.stderr
    assert _call(installed, tiny["python"], "prefix_cache_block_size") == "256"


def test_rebuild_c_uses_the_compiler_cache_across_installed_trees(
    tiny: dict, tmp_path: Path
) -> None:
    """The same edit rebuilt in a second, freshly unpacked tree: the tree's own object
    cache has never seen it, ccache (shared, like build_all's) has."""
    edited = tmp_path / "tinyinfer-prefix-cache.patch"
    edited.write_text(
        (tiny["ws"] / "patches/tinyinfer-prefix-cache.patch")
        .read_text()
        .replace("prefix_cache_block_tokens = 64", "prefix_cache_block_tokens = 96")
    )
    said = []
    for name in ("first", "second"):
        archive.unpack(tarball(tiny["release"]), tmp_path / name)
        tree = tmp_path / name / "tinyinfer"
        res = run_kiln(
            "rebuild-c",
            tree,
            edited,
            "--workspace",
            tiny["ws"],
            "--python",
            tiny["python"],
            "--compiler-cache",
            tmp_path / "ccache",
            env=tiny["cuda"],
        )
        assert res.returncode == 0, res.stderr
        assert _call(tree, tiny["python"], "prefix_cache_block_size") == "96"
        said.append(next(ln for ln in res.stderr.splitlines() if "rebuild-c: ccache" in ln))
    assert said == [
        "kiln: rebuild-c: ccache 0 hits, 1 misses",
        "kiln: rebuild-c: ccache 1 hits, 0 misses",
    ]


def test_rebuild_c_with_a_patch_that_does_not_apply_leaves_the_tree(
    tiny: dict, installed: Path, tmp_path: Path
) -> None:
    before = _tree_state(installed)
    bad = tmp_path / "tinyinfer-prefix-cache.patch"
    bad.write_text(
        (tiny["ws"] / "patches/tinyinfer-prefix-cache.patch")
        .read_text()
        .replace(" static PyObject* engine_name", " static PyObject* engine_nom")
    )
    res = run_kiln(
        "rebuild-c",
        installed,
        bad,
        "--workspace",
        tiny["ws"],
        "--python",
        tiny["python"],
        env=tiny["cuda"],
    )
    assert res.returncode == 11
    assert "tinyinfer-prefix-cache.patch fails on csrc/module.cpp" in res.stderr
    assert "the tree was left unchanged" in res.stderr
    assert _tree_state(installed) == before


def test_rebuild_c_refuses_a_tree_not_built_by_kiln(tiny: dict, tmp_path: Path) -> None:
    res = run_kiln("rebuild-c", tmp_path, "--workspace", tiny["ws"])
    assert res.returncode == 11
    assert "is not a tree built by kiln (no .kiln/tree.json)" in res.stderr


def test_shipped_rebuild_script_runs_without_kiln(
    tiny: dict, installed: Path, tmp_path: Path
) -> None:
    """rebuild-tinyinfer-C.sh uses only the tree's .kiln/ kit and the Python given."""
    script = tiny["release"] / "rebuild-tinyinfer-C.sh"
    edited = tmp_path / "tinyinfer-prefix-cache.patch"
    edited.write_text(
        (tiny["release"] / "patches/tinyinfer-prefix-cache.patch")
        .read_text()
        .replace("= 64", "= 96")
    )
    res = subprocess.run(
        ["bash", str(script), str(installed), str(edited)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": str(tiny["python"]), "PYTHONPATH": "", **tiny["cuda"]},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert _call(installed, tiny["python"], "prefix_cache_block_size") == "96"


def test_install_sh_is_clean_shell(tiny: dict) -> None:
    for script in ("install.sh", "rebuild-tinyinfer-C.sh", "build-test-release.sh"):
        path = tiny["release"] / script
        subprocess.run(["bash", "-n", str(path)], check=True)
        shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
        res = subprocess.run([shellcheck, str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def test_build_script_states_the_recipe_and_refuses_a_folder_that_is_not_kiln(
    tiny: dict, tmp_path: Path
) -> None:
    """build-<release>.sh carries the recipe in words (what a reader audits) and runs kiln;
    pointed at something that is not a kiln checkout it says so (it is run for real, on the
    demo release, by tests/integration/test_demo.py's verify fixture)."""
    script = tiny["release"] / "build-test-release.sh"
    text = script.read_text()
    data = json.loads((tiny["release"] / "manifest.json").read_text())
    for name, v in data["vendors"].items():
        assert f"#   {name}: {v['source']['url']} @ {v['source']['commit']}" in text
        for q in v["patches"]:
            assert f"patch {q['file']} (sha256 {q['sha256']})" in text
    assert "TINYINFER_ACCELERATOR=nvidia" in text
    res = subprocess.run(
        ["bash", str(script), str(tmp_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"build: {tmp_path} is not a kiln checkout (no kiln/__init__.py): clone kiln there"
    )
    assert not (tmp_path / "out").exists()


def test_install_sh_installs_for_real(tiny: dict, tmp_path: Path) -> None:
    venv, target = tmp_path / "venv", tmp_path / "workspace"
    release = tmp_path / "release"
    shutil.copytree(tiny["release"], release)
    # an earlier release's wheel left behind: install.sh installs the manifest's only
    (release / "wheels/plainext-0.1.0-py3-none-any.whl").write_bytes(b"not a wheel")
    res = subprocess.run(
        [
            "bash",
            str(release / "install.sh"),
            str(venv),
            str(target),
            "--find-links",
            str(tiny["wheelhouse"]),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHON": "python3.11", "PIP_NO_INDEX": "1"},
    )
    assert res.returncode == 0, res.stderr + res.stdout
    assert "--require-hashes" in (tiny["release"] / "install.sh").read_text()
    check = (
        "import tinyinfer, plainext, kiln_fixture_dep;"
        "print(tinyinfer.kernel_count(), tinyinfer.prefix_cache_block_size(),"
        " plainext.GREETING, kiln_fixture_dep.VALUE, tinyinfer.__file__)"
    )
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", check], capture_output=True, text=True, check=True, cwd="/"
    ).stdout.split()
    assert out[:2] == ["12", "64"] and out[-2] == "42"
    assert out[-1].startswith(str(target / "tinyinfer"))
    assert (target / "tinyinfer/.kiln/python").read_text().strip() == str(venv / "bin/python")


def other_python() -> str:
    """A runnable Python that is not 3.11 (pyenv's shims need the real binary)."""
    candidates = sorted(Path.home().glob(".pyenv/versions/3.1[02]*/bin/python3.1[02]"))
    candidates += [Path(p) for p in (shutil.which("python3.12"), shutil.which("python3.10")) if p]
    for c in candidates:
        if subprocess.run([str(c), "-c", "pass"], capture_output=True).returncode == 0:
            return str(c)
    pytest.skip("no Python other than 3.11 on this machine")


def test_install_sh_names_a_missing_wheel_before_it_starts(tiny: dict, tmp_path: Path) -> None:
    release = tmp_path / "release"
    shutil.copytree(tiny["release"], release)
    (wheel,) = (release / "wheels").glob("plainext-*.whl")
    wheel.unlink()
    res = subprocess.run(
        ["bash", str(release / "install.sh"), str(tmp_path / "v"), str(tmp_path / "t")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"install.sh: wheels/{wheel.name} is missing: the manifest lists it "
        "(copy the whole release)"
    )
    assert not (tmp_path / "v").exists()


def test_install_sh_refuses_the_wrong_python(tiny: dict, tmp_path: Path) -> None:
    wrong = other_python()
    res = subprocess.run(
        ["bash", str(tiny["release"] / "install.sh"), str(tmp_path / "v"), str(tmp_path / "t")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHON": wrong},
    )
    assert res.returncode == 1
    assert f"{wrong} is Python 3.1" in res.stderr
    assert "this release is built for Python 3.11" in res.stderr
    assert not (tmp_path / "v").exists()


def test_pack_jit_cache_into_the_release(tiny: dict, tmp_path: Path) -> None:
    release = tmp_path / "release"
    shutil.copytree(tiny["release"], release)
    caches = tmp_path / "run"
    (caches / "deep_gemm/cache").mkdir(parents=True)
    (caches / "deep_gemm/cache/kernel.gemm.abc").write_bytes(b"cubin")
    (caches / "tilelang/x").mkdir(parents=True)
    (caches / "tilelang/x/k.so").write_bytes(b"so")
    res = run_kiln("pack-jit-cache", caches, "--name", "1xgpu-smoke", "--release", release)
    assert res.returncode == 0, res.stderr
    packed = release / "jit-cache/jit-cache-1xgpu-smoke.tar.zst"
    names = [i.name for i in archive.list_members(packed)]
    assert "jit-cache/deep_gemm/cache/kernel.gemm.abc" in names
    assert "jit-cache/tilelang/x/k.so" in names
    assert manifest.check(release / "manifest.json") == []
    assert "jit-cache-1xgpu-smoke.tar.zst" in (release / "README.md").read_text()
    first = packed.read_bytes()
    res = run_kiln("pack-jit-cache", caches, "--name", "1xgpu-smoke", "--release", release)
    assert res.returncode == 0 and packed.read_bytes() == first
    res = run_kiln("pack-jit-cache", tmp_path / "nothing", "--name", "x", "--release", release)
    assert res.returncode == 2 and "holds none of deep_gemm/, tilelang/" in res.stderr


def _readme_jit_unpack(readme: str, workspace: Path) -> str:
    """The release README's JIT-cache unpack command, for this test's Python and folder."""
    (line,) = [x for x in readme.splitlines() if x.startswith("zstd -dc jit-cache/")]
    for root in ("/workspace", "/opt/kiln"):  # the workspace's install_root, or kiln's default
        line = line.replace(f"{root}/venv/bin/python", sys.executable)
        line = line.replace(root, str(workspace))
    return line.replace("LABEL", "g")


def test_readme_jit_cache_command_unpacks_and_refuses_links_out(tiny: dict, tmp_path: Path) -> None:
    """The README tells users how to unpack a JIT cache without kiln: that command must
    give the folders DG_JIT_CACHE_DIR/TILELANG_CACHE_DIR name, and must not follow an
    archive's link out of the folder (plain ``tar -x`` would)."""
    release = tmp_path / "release"
    shutil.copytree(tiny["release"], release)
    caches = tmp_path / "run"
    (caches / "deep_gemm/cache").mkdir(parents=True)
    (caches / "deep_gemm/cache/kernel.gemm.abc").write_bytes(b"cubin")
    assert run_kiln("pack-jit-cache", caches, "--name", "g", "--release", release).returncode == 0
    command = _readme_jit_unpack((release / "README.md").read_text(), tmp_path / "ws")
    (tmp_path / "ws").mkdir()
    res = subprocess.run(["bash", "-c", command], cwd=release, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ws/jit-cache/deep_gemm/cache/kernel.gemm.abc").read_bytes() == b"cubin"

    # An archive whose link points at a folder outside (an absolute path), and a member
    # written through that link.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        link = tarfile.TarInfo("jit-cache/deep_gemm/k")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path / "outside")
        tar.addfile(link)
        evil = tarfile.TarInfo("jit-cache/deep_gemm/k/pwned")
        evil.size = 1
        tar.addfile(evil, io.BytesIO(b"x"))
    (tmp_path / "outside").mkdir()
    (release / "jit-cache/jit-cache-g.tar.zst").write_bytes(
        zstandard.ZstdCompressor().compress(buf.getvalue())
    )
    (tmp_path / "ws2").mkdir()
    command = _readme_jit_unpack((release / "README.md").read_text(), tmp_path / "ws2")
    res = subprocess.run(["bash", "-c", command], cwd=release, capture_output=True, text=True)
    assert res.returncode != 0 and "AbsoluteLinkError" in res.stderr, res.stderr
    assert not (tmp_path / "outside/pwned").exists()


def test_upstream_without_a_license_fails(tmp_path: Path, upstreams: Upstreams, options) -> None:
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["source"]["license"] = "COPYING"
    ws = write(tmp_path / "ws", {"plain": vendor})
    with pytest.raises(VerifyError, match="plain: no license file at COPYING in its source"):
        stages.build(options(ws))


def test_submodule_without_a_license_fails_naming_it_before_the_compile(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    vendor = plain_vendor(upstreams.plain[2])
    vendor["source"]["submodules"] = [{"path": "third_party/hdr", "license": "NOTICE"}]
    ws = write(tmp_path / "ws", {"plain": vendor})
    with pytest.raises(VerifyError) as info:
        stages.build(options(ws))
    msg = str(info.value)
    assert msg.startswith(
        "plain: submodule third_party/hdr has no license file (looked for NOTICE)"
    )
    assert "plain-build.log" not in msg
    assert not (tmp_path / "artifacts/logs/test-release/plain-build.log").exists()


def test_submodule_license_that_does_not_match_its_id_fails(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    vendor = plain_vendor(upstreams.plain[2])
    vendor["source"]["submodules"] = [{"path": "third_party/hdr", "license_id": "BSD-3-Clause"}]
    ws = write(tmp_path / "ws", {"plain": vendor})
    with pytest.raises(VerifyError, match="submodule third_party/hdr: LICENSE does not read like"):
        stages.build(options(ws))


def test_license_that_does_not_match_its_id_fails(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["source"]["license_id"] = "Apache-2.0"
    ws = write(tmp_path / "ws", {"plain": vendor})
    with pytest.raises(VerifyError, match="does not read like Apache-2.0"):
        stages.build(options(ws))


def test_failing_build_script_reports_log_tail_and_path(
    tmp_path: Path, options, tiny: dict
) -> None:
    vendor = _vendor_toml("tinyinfer")
    vendor["build"]["env"]["TINYINFER_ACCELERATOR"] = "ascend"
    ws = write(tmp_path / "ws", {"tinyinfer": vendor})
    with pytest.raises(BuildError) as info:
        stages.build(options(ws, mirrors=tiny["mirrors"]))
    msg = str(info.value)
    assert "building tinyinfer failed" in msg
    assert "./build.sh failed with exit code 2" in msg
    assert "only TINYINFER_ACCELERATOR=nvidia is supported" in msg
    assert "full log: " in msg and "tinyinfer-build.log" in msg
    assert not (tmp_path / "artifacts/test-release").exists()
