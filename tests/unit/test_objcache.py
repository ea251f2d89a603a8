"""The shipped object cache: its entries are the same bytes wherever the tree lies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kiln.inside.kit import objcache
from kiln.toolchain import compilercache
from tests import require

WRAPPER = Path(objcache.__file__)


def _compile(tree: Path, include: Path, cache: Path) -> list[bytes]:
    env = {
        **os.environ,
        "KILN_OBJCACHE_DIR": str(cache),
        "KILN_OBJCACHE_ROOTS": f"TREE={tree}",
    }
    subprocess.run(
        [sys.executable, str(WRAPPER), "gcc", "-c", "src/a.c", "-o", "a.o", f"-I{include}"],
        cwd=tree,
        env=env,
        check=True,
    )
    return sorted(p.read_bytes() for p in (cache / "entries").iterdir())


def _tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "local.h").write_text("#define LOCAL 1\n")
    (root / "src" / "a.c").write_text(
        '#include "local.h"\n#include <outside.h>\nint f(void) { return LOCAL + OUTSIDE; }\n'
    )
    return root


def test_entries_do_not_depend_on_where_the_tree_sorts(tmp_path: Path) -> None:
    """An outside header ("m/") sorts after a tree in "a/" and before one in "z/": the
    dependency list, and so the entry's bytes, must not follow that order."""
    include = tmp_path / "m" / "include"
    include.mkdir(parents=True)
    (include / "outside.h").write_text("#define OUTSIDE 2\n")
    before = _compile(_tree(tmp_path / "a" / "tree"), include, tmp_path / "cache-a")
    after = _compile(_tree(tmp_path / "z" / "tree"), include, tmp_path / "cache-z")
    assert before == after
    assert b"@TREE@/src/local.h" in before[0]


def test_entries_record_the_dependency_they_read(tmp_path: Path) -> None:
    """The check can fail: a different outside header gives a different entry."""
    include = tmp_path / "m" / "include"
    include.mkdir(parents=True)
    (include / "outside.h").write_text("#define OUTSIDE 2\n")
    first = _compile(_tree(tmp_path / "a" / "tree"), include, tmp_path / "cache-a")
    (include / "outside.h").write_text("#define OUTSIDE 3\n")
    second = _compile(_tree(tmp_path / "z" / "tree"), include, tmp_path / "cache-z")
    assert first != second


def _toolkit_and_venv(root: Path) -> tuple[Path, Path]:
    """A CUDA home laid out as kiln lays out its PyPI CUDA (links into a prefix inside a
    venv), and a build venv with its own include/, both under ``root``."""
    prefix = root / "toolchain" / "venv" / "site-packages" / "nvidia" / "cu13"
    (prefix / "include").mkdir(parents=True)
    (prefix / "include" / "cuda_like.h").write_text("#define CUDA_LIKE 3\n")
    home = root / "toolchain" / "cuda"
    home.mkdir()
    (home / "include").symlink_to(prefix / "include")
    venv = root / "env"
    (venv / "bin").mkdir(parents=True)
    (venv / "include").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to(sys.executable)
    return home, venv


def test_entries_do_not_carry_where_the_toolkit_or_the_venv_lie(tmp_path: Path) -> None:
    """The same compile with kiln's cache (toolchain and build venv) in two places gives
    the same entry: the toolkit's real prefix and the venv are named, not spelled out
    (they were, and a release's tarball depended on where .kiln-cache/ was)."""
    entries = []
    for place in ("a", "zz"):
        home, venv = _toolkit_and_venv(tmp_path / place / "cache")
        tree = tmp_path / place / "tree"
        (tree / "src").mkdir(parents=True)
        (tree / "src" / "b.c").write_text(
            "#include <cuda_like.h>\nint g(void) { return CUDA_LIKE; }\n"
        )
        env = {
            **os.environ,
            "KILN_OBJCACHE_DIR": str(tree / "cache"),
            "KILN_OBJCACHE_ROOTS": f"TREE={tree};CUDA={home}",
            "KILN_OBJCACHE_PYTHON": str(venv / "bin" / "python"),
        }
        argv = ["gcc", "-c", "src/b.c", "-o", "b.o", f"-I{home}/include", f"-I{venv}/include"]
        subprocess.run([sys.executable, str(WRAPPER), *argv], cwd=tree, env=env, check=True)
        entries.append(sorted(p.read_bytes() for p in (tree / "cache" / "entries").iterdir()))
    assert entries[0] == entries[1]
    text = entries[0][0].decode()
    assert "@CUDA@/include/cuda_like.h" in text and "@VENV@/include" in text
    assert str(tmp_path) not in text


def test_nvcc_host_compiler_through_the_wrapper_does_not_wait_for_its_own_slot(
    tmp_path: Path,
) -> None:
    """nvcc -ccbin <kiln's gcc wrapper>: the host compile runs inside the nvcc compile that
    holds the only gate slot; waiting for a slot there would deadlock."""
    from kiln.inside.kit import compilegate

    gate = tmp_path / "gate"
    compilegate.write_budget(gate, mem_gib=1.0, cpus=1)
    gcc = tmp_path / "gcc"
    gcc.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{WRAPPER}" gcc "$@"\n')
    gcc.chmod(0o755)
    (tmp_path / "k.cu").write_text("__global__ void k(float* x) { x[0] = 1; }\n")
    env = {
        **os.environ,
        "KILN_GATE_DIR": str(gate),
        "KILN_GATE_MEM_GIB": "1",
        "KILN_OBJCACHE_DIR": str(tmp_path / "cache"),
        "KILN_OBJCACHE_ROOTS": f"TREE={tmp_path}",
        "KILN_JOB_STATS": str(tmp_path / "jobs"),
    }
    nvcc = "/usr/local/cuda/bin/nvcc"
    cmd = [sys.executable, str(WRAPPER), nvcc, "-c", "k.cu", "-o", "k.o", "-ccbin", str(gcc)]
    subprocess.run(cmd, cwd=tmp_path, env=env, check=True, timeout=120)
    lines = (tmp_path / "jobs").read_text().splitlines()
    assert len(lines) == 1 and '"compiler": "nvcc"' in lines[0]  # host steps: not counted


def test_a_compile_is_the_same_bytes_with_ccache_and_without(tmp_path: Path) -> None:
    """ccache's base_dir runs the compiler with paths relative to the working directory
    (debug info names the source as given); the wrapper writes them so itself, or a
    build with ccache would differ from one without (kiln verify compiles without)."""
    if shutil.which("ccache") is None:  # .ci/run installs it (KILN_REQUIRE_ALL)
        require.missing("CCACHE", "ccache is not installed (apt-get install ccache)")
    tree = tmp_path / "tree"
    (tree / "inc").mkdir(parents=True)
    (tree / "build").mkdir()
    (tree / "inc" / "h.h").write_text("#define H 3\n")
    (tree / "a.c").write_text('#include "h.h"\nint f(void) { return H + __LINE__; }\n')
    base = {**os.environ, "KILN_OBJCACHE_ROOTS": f"TREE={tree}"}
    ccache = {
        # the machine's ccache, as kiln picks it (kiln's own comes first on a venv's PATH)
        "KILN_CCACHE": compilercache.machine_binary("ccache", shutil.which("ccache")) or "",
        "CCACHE_DIR": str(tmp_path / "ccache"),
        "CCACHE_BASEDIR": str(tree),
        "CCACHE_NOHASHDIR": "1",
    }
    for name, extra in (("direct", {}), ("ccache", ccache)):
        subprocess.run(
            [
                sys.executable,
                str(WRAPPER),
                "gcc",
                "-g",
                "-O2",
                f"-I{tree}/inc",
                "-c",
                str(tree / "a.c"),
                "-o",
                f"{name}.o",
            ],
            cwd=tree / "build",
            env={**base, **extra},
            check=True,
        )
    cache = tmp_path / "ccache"
    skip = ("stats", "CACHEDIR.TAG", ".cleaned")
    stored = [
        f
        for f in cache.rglob("*")
        if f.is_file() and f.name not in skip and f.relative_to(cache).parts[0] != "tmp"
    ]
    assert stored  # ccache really stored a result (its layout differs between versions)
    assert (tree / "build" / "direct.o").read_bytes() == (tree / "build" / "ccache.o").read_bytes()


def test_nvccs_host_compiles_get_the_wrappers_flags_without_the_object_cache(
    tmp_path: Path,
) -> None:
    """Inside a compile (KILN_WRAPPED=1, nvcc's own host-compiler calls, several per CUDA
    unit) the kit's wrapper runs compileflags.py alone: the same arguments objcache.py's
    nested path gives, at a fraction of its start-up (it is not even read: broken here)."""
    from kiln.orchestrate.kit import install_kit

    tree = tmp_path / "tree"
    (tree / "csrc").mkdir(parents=True)
    (tree / "csrc" / "a.cpp").write_text("int a;\n")
    kit = install_kit(tree)
    echo = tmp_path / "echo-args"
    echo.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    env = {
        **os.environ,
        "KILN_WRAPPED": "1",
        "KILN_OBJCACHE_PYTHON": sys.executable,
        "KILN_OBJCACHE_ROOTS": f"TREE={tree};CUDA=/usr/local/cuda",
        "KILN_CXX_APPEND": "-std=c++20",
        "KILN_REAL_CXX": str(echo),
    }
    args = ["-c", str(tree / "csrc" / "a.cpp"), "-o", "a.o", f"-I{tree}/csrc"]
    whole = subprocess.run(
        [sys.executable, str(kit / "objcache.py"), str(echo), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "-Icsrc" in whole.split() and "-std=c++20" in whole.split()
    (kit / "objcache.py").write_text("raise SystemExit('objcache.py was run')\n")
    fast = subprocess.run(
        [str(kit / "bin" / "g++"), *args], cwd=tree, env=env, capture_output=True, text=True
    )
    assert fast.returncode == 0, fast.stderr
    assert fast.stdout == whole


def test_a_compile_whose_output_another_compile_removed_is_one_line_with_its_cause(
    tmp_path: Path,
) -> None:
    """Two compiles of one build writing one object at once (a parallel build_ext whose
    two extensions share a source): here the second compile's doing, removing the object,
    is a real gcc run followed by that removal, so the race is the same every time. The
    wrapper said it with a traceback of its own (``sha256_file`` on a missing file); now
    one line, read back by the diagnosis as the object-written-twice row."""
    from kiln.inside import diagnose

    tree = tmp_path / "tree"
    (tree / "csrc").mkdir(parents=True)
    (tree / "csrc" / "ops.c").write_text("int ops(void) { return 1; }\n")
    racer = tmp_path / "gcc-then-the-other-compile"
    racer.write_text('#!/bin/sh\ngcc "$@" && rm -f build/ops.o\n')
    racer.chmod(0o755)
    (tree / "build").mkdir()
    env = {
        **os.environ,
        "KILN_OBJCACHE_DIR": str(tmp_path / "cache"),
        "KILN_OBJCACHE_ROOTS": f"TREE={tree}",
    }
    res = subprocess.run(
        [sys.executable, str(WRAPPER), str(racer), "-c", "csrc/ops.c", "-o", "build/ops.o"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1
    assert "Traceback" not in res.stderr, res.stderr
    assert res.stderr == (
        "kiln compiler wrapper: error: build/ops.o: the compile of csrc/ops.c succeeded and its "
        "output is gone: another compile of this build wrote the same object file at once\n"
    )
    d = diagnose.diagnose(res.stderr + "error: command 'gcc' failed\n", tree, {}, "v")
    assert d.cause is not None and d.cause.row == "object-written-twice", d
    assert "give each target its own copy or object path for csrc/ops.c" in d.cause.fix
    # the control: the same compile left alone is cached and succeeds
    ok = subprocess.run(
        [sys.executable, str(WRAPPER), "gcc", "-c", "csrc/ops.c", "-o", "build/ops.o"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and (tree / "build" / "ops.o").is_file(), ok.stderr
