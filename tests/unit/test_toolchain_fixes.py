"""What kiln does for a CPU-only host that compiles with torch's pip CUDA (issue 12):
headers and link names from NVIDIA's wheels, the libcuda stub, flags appended without a
patch, cudafe++'s module ID fixed, dependencies from the compile itself, and the gate's
order. Real gcc, nvcc and ELF files; no build of a whole upstream (that is .ci/run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.errors import VerifyError
from kiln.inside.kit import compilegate, cudashim, pipcuda
from kiln.verify.binaries import SharedObject, check_linkage, linkage

WRAPPER = Path(__file__).resolve().parents[2] / "kiln" / "inside" / "kit" / "objcache.py"
NVCC = "/usr/local/cuda/bin/nvcc"


def _fake_site(tmp_path: Path) -> Path:
    """site-packages/nvidia as torch's CUDA wheels lay it out: versioned libraries only."""
    site = tmp_path / "site"
    for pkg, libs in {
        "cu13": ["libnvrtc.so.13", "libcublas.so.13"],
        "nccl": ["libnccl.so.2"],
    }.items():
        (site / "nvidia" / pkg / "include").mkdir(parents=True)
        (site / "nvidia" / pkg / "lib").mkdir()
        for lib in libs:
            (site / "nvidia" / pkg / "lib" / lib).write_bytes(b"")
    (site / "nvidia" / "cu13" / "include" / "nvrtc.h").write_text("#define KILN_NVRTC 1\n")
    (site / "nvidia" / "nccl" / "lib" / "libplain.so").write_bytes(b"")  # has its link name
    (site / "nvidia" / "nccl" / "lib" / "libplain.so.1").write_bytes(b"")
    return site


def test_link_names_only_where_the_wheels_lack_them(tmp_path: Path) -> None:
    site = _fake_site(tmp_path)
    found = pipcuda.discover(str(site), str(tmp_path / "no-cuda"))
    links = found["links"]
    assert sorted(links) == ["libcublas.so", "libnccl.so", "libnvrtc.so"]
    assert links["libnvrtc.so"].endswith("nvidia/cu13/lib/libnvrtc.so.13")
    include_dirs = found["include_dirs"]
    assert [Path(d).parent.name for d in include_dirs] == ["cu13", "nccl"]


def test_environment_keeps_what_the_recipe_set_first(tmp_path: Path) -> None:
    found = pipcuda.discover(str(_fake_site(tmp_path)), str(tmp_path / "no-cuda"))
    env = pipcuda.environment(found, "/links", {"LIBRARY_PATH": "/mine", "CPLUS_INCLUDE_PATH": ""})
    libs = env["LIBRARY_PATH"].split(":")
    assert libs[0] == "/mine" and libs[1] == "/links" and libs[2].endswith("nvidia/cu13/lib")
    assert env["CPLUS_INCLUDE_PATH"].split(":")[0].endswith("nvidia/cu13/include")


@pytest.mark.skipif(not shutil.which("cmake"), reason="cmake is not installed")
def test_cmake_finds_cublas_from_the_pip_cuda(tmp_path: Path) -> None:
    """Issue 54 (2): a CMake project linking ``CUDA::cublas`` on a CUDA without cuBLAS in
    the toolkit's place (the PyPI CUDA; here /usr/local/cuda, nvcc only). FindCUDAToolkit
    finds libraries with ``find_library``, which reads CMAKE_LIBRARY_PATH, not
    LIBRARY_PATH: with kiln's environment it configures; with LIBRARY_PATH alone it stops
    ("the target was not found": the check can fail)."""
    site = tmp_path / "site"
    lib, inc = site / "nvidia" / "cu13" / "lib", site / "nvidia" / "cu13" / "include"
    lib.mkdir(parents=True)
    inc.mkdir()
    (tmp_path / "blas.c").write_text("int cublasCreate_v2(void** h) { return 0; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcublas.so.13", "-o",
         lib / "libcublas.so.13", tmp_path / "blas.c"],
        check=True,
    )  # fmt: skip
    (inc / "cublas_v2.h").write_text('extern "C" int cublasCreate_v2(void** h);\n')
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(k LANGUAGES CXX)\n"
        "find_package(CUDAToolkit REQUIRED)\nadd_library(k SHARED k.cpp)\n"
        "target_link_libraries(k CUDA::cublas)\n"
    )
    (project / "k.cpp").write_text(
        '#include <cublas_v2.h>\nextern "C" int make() { void* h; return cublasCreate_v2(&h); }\n'
    )
    found = pipcuda.discover(str(site), "/usr/local/cuda")
    links = tmp_path / "tree" / pipcuda.LINKS_DIR
    pipcuda.materialize(found, str(links))
    env = {**os.environ, "CUDACXX": NVCC, **pipcuda.environment(found, str(links), {})}

    def configure(env: dict[str, str], folder: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["cmake", "-S", str(project), "-B", str(tmp_path / folder)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip

    bare = {k: v for k, v in env.items() if not k.startswith("CMAKE_")}
    refused = configure(bare, "b1")
    assert refused.returncode != 0 and "CUDA::cublas" in refused.stderr, refused.stderr[-2000:]
    # CMake's own words on the screen, by file:line (the backend said only "CMake
    # configuration failed")
    from kiln.inside import diagnose

    said = diagnose.first_errors(
        refused.stdout + refused.stderr + "\n*** CMake configuration failed\n", project
    )
    first = said.errors[0]
    assert (first.file, first.line, first.tool) == ("CMakeLists.txt", 5, "cmake"), said.errors
    assert first.message.startswith('CMake Error (target_link_libraries): Target "k" links to:')
    assert "CUDA::cublas but the target was not found." in first.message
    made = configure(env, "b2")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    built = subprocess.run(
        ["cmake", "--build", str(tmp_path / "b2")], env=env, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout[-2000:]
    needed, _ = linkage(next((tmp_path / "b2").glob("libk.so")))
    assert "libcublas.so.13" in needed


def test_cccl_comes_first_for_cxx_and_never_for_c(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    (home / "include" / "cccl").mkdir(parents=True)
    found = pipcuda.discover(str(_fake_site(tmp_path)), str(home))
    env = pipcuda.environment(found, "/links", {})
    assert env["CPLUS_INCLUDE_PATH"].split(":")[0] == str(home / "include" / "cccl")
    assert str(home / "include" / "cccl") not in env["C_INCLUDE_PATH"]


def _link_against_stub(tmp_path: Path, cuda_h: str | None) -> list[str]:
    """Link `-lcuda -lnvrtc` (gcc's default --as-needed) on a host with neither a driver
    nor toolkit stubs; return NEEDED of the result (and check it has no RUNPATH)."""
    site = tmp_path / "site"
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (site / "nvidia" / "cu13" / "include").mkdir()
    if cuda_h is not None:
        (site / "nvidia" / "cu13" / "include" / "cuda.h").write_text(cuda_h)
    (tmp_path / "nvrtc.c").write_text("int nvrtcVersion(int* a, int* b) { return 0; }\n")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvrtc.so.13",
            "-o",
            lib / "libnvrtc.so.13",
            tmp_path / "nvrtc.c",
        ],
        check=True,
    )
    found = pipcuda.discover(str(site), str(tmp_path / "no-cuda"))
    assert found["cuda_link"] == "kiln-stub"  # no driver, no toolkit stubs on this host
    links = tmp_path / "tree" / pipcuda.LINKS_DIR
    pipcuda.materialize(found, str(links))
    env = {**os.environ, **pipcuda.environment(found, str(links), {})}
    (tmp_path / "ext.c").write_text(
        "int cuInit(unsigned); int nvrtcVersion(int*, int*);\n"
        "int f(void) { int a, b; return cuInit(0) + nvrtcVersion(&a, &b); }\n"
    )
    out = tmp_path / "ext.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", out, tmp_path / "ext.c", "-lcuda", "-lnvrtc"],
        check=True,
        env=env,
    )
    needed, runpath = linkage(out)
    assert not runpath
    check_linkage("ext", [SharedObject("ext.so", [], [], needed, runpath)])  # passes
    return needed


CUDA_H = "typedef int CUresult;\n#define cuInit cuInit_v9\nCUresult cuInit(unsigned int f);\n"


def test_stub_links_and_records_only_the_drivers_name(tmp_path: Path) -> None:
    """The stub lets `-lcuda -lnvrtc` link on a host without a driver; the result needs
    libcuda.so.1 (the driver, by name) and libnvrtc.so.13, nothing of kiln's folder. The
    stub holds cuda.h's functions under their macro names (cuInit -> cuInit_v9 here)."""
    cuda_h = CUDA_H.replace("cuInit_v9", "cuInit")
    needed = _link_against_stub(tmp_path, cuda_h)
    assert "libcuda.so.1" in needed and "libnvrtc.so.13" in needed
    assert "int cuInit_v9(void) { return 34; }" in pipcuda.stub_source(str(_h(tmp_path, CUDA_H)))


def _h(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "h" / "cuda.h"
    path.parent.mkdir()
    path.write_text(text)
    return path


def test_an_empty_stub_would_drop_the_driver_under_as_needed(tmp_path: Path) -> None:
    """Why the stub carries cuda.h's functions (this check can fail): an empty one is
    dropped by --as-needed, and the extension would miss libcuda.so.1 at run time."""
    needed = _link_against_stub(tmp_path, None)
    assert "libcuda.so.1" not in needed


def test_a_runtime_path_into_kiln_folders_fails_verify(tmp_path: Path) -> None:
    """The check can fail: a shared object that records kiln's links folder as RUNPATH."""
    links = tmp_path / "tree" / ".kiln" / "host" / "links"
    links.mkdir(parents=True)
    (tmp_path / "ext.c").write_text("int f(void) { return 0; }\n")
    out = tmp_path / "bad.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", out, tmp_path / "ext.c", f"-Wl,-rpath,{links}"],
        check=True,
    )
    needed, runpath = linkage(out)
    with pytest.raises(VerifyError, match="link-time stand-in"):
        check_linkage("bad", [SharedObject("bad.so", [], [], needed, runpath)])


MODULE_ID_FIXTURE = """\
#include <cuda/std/tuple>
template <typename T> __global__ void k(T* p) {
  auto t = cuda::std::make_tuple(1, 2); cuda::std::ignore = t; p[0] = T(1); }
template __global__ void k<float>(float*);
"""


def _wrapped_nvcc(tree: Path, out: str, env: dict[str, str]) -> bytes:
    subprocess.run(
        [
            sys.executable,
            str(WRAPPER),
            NVCC,
            "-c",
            "u.cu",
            "-o",
            out,
            "-gencode",
            "arch=compute_100a,code=sm_100a",
        ],
        cwd=tree,
        env=env,
        check=True,
        timeout=300,
    )
    return (tree / out).read_bytes()


def test_cudafe_module_id_is_fixed_through_kilns_cuda_home(tmp_path: Path) -> None:
    """A file that only instantiates a template and uses cuda::std::ignore: cudafe++
    ends its module ID with its pid, so plain nvcc differs on every compile (seen first,
    which is what makes this test able to fail); through kiln's wrapper it does not."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "u.cu").write_text(MODULE_ID_FIXTURE)
    plain = []
    for i in (1, 2):
        keep = tmp_path / f"keep{i}"
        keep.mkdir()
        subprocess.run(
            [
                NVCC,
                "-c",
                "u.cu",
                "-o",
                f"p{i}.o",
                "-gencode",
                "arch=compute_100a,code=sm_100a",
                "-Xcudafe",
                "--orig_src_path_name=u.cu",
                "--keep",
                f"--keep-dir={keep}",
            ],
            cwd=tree,
            check=True,
            timeout=300,
        )
        plain.append((tree / f"p{i}.o").read_bytes())
    assert plain[0] != plain[1]
    env = {
        **os.environ,
        "KILN_OBJCACHE_ROOTS": f"TREE={tree};CUDA=/usr/local/cuda",
        "KILN_OBJCACHE_PYTHON": sys.executable,
    }
    a, b = (_wrapped_nvcc(tree, f"w{i}.o", env) for i in (1, 2))
    assert a == b
    assert (tree / ".kiln" / "host" / "cuda" / "bin" / "cudafe++").is_file()


def test_module_id_depends_on_the_source_path_and_the_compile() -> None:
    one = cudashim.module_id("csrc/a.cu", "seed")
    assert one == cudashim.module_id("csrc/a.cu", "seed")
    assert one != cudashim.module_id("csrc/b.cu", "seed")
    assert one != cudashim.module_id("csrc/a.cu", "other flags")
    assert one.startswith("_") and "_4_a_cu_" in one and one.endswith("_0")


def test_cudafe_args_drop_generation_only_with_an_id() -> None:
    args = ["--gen_module_id_file", "--module_id_file_name", "/t/x.module_id", "in.ii"]
    assert cudashim.cudafe_args(args, None) == (args, None)
    kept, target = cudashim.cudafe_args(args, "_id")
    assert (
        kept == ["--module_id_file_name", "/t/x.module_id", "in.ii"] and target == "/t/x.module_id"
    )


def _compile_cxx(
    tree: Path, env: dict[str, str], std_check: bool = True
) -> subprocess.CompletedProcess:
    (tree / "m.cpp").write_text(
        ("#if __cplusplus < 202002L\n#error C++20 or later\n#endif\n" if std_check else "")
        + '#include "h.h"\nint f() { return H; }\n'
    )
    (tree / "h.h").write_text("#define H 1\n")
    return subprocess.run(
        [sys.executable, str(WRAPPER), "gcc", "-std=c++17", "-c", "m.cpp", "-o", "m.o"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_cxx_append_flags_win_over_a_hard_coded_standard(tmp_path: Path) -> None:
    """DeepGEMM's setup.py passes -std=c++17 (to gcc: setuptools compiles .cpp with CC);
    torch 2.14's ATen needs C++20. Without the recipe's flag the compile fails."""
    base = {**os.environ, "KILN_OBJCACHE_ROOTS": f"TREE={tmp_path}"}
    assert _compile_cxx(tmp_path, base).returncode != 0
    res = _compile_cxx(tmp_path, {**base, "KILN_CXX_APPEND": "-std=c++20"})
    assert res.returncode == 0, res.stderr


def test_dependencies_come_from_the_compile_not_a_second_preprocessor_run(
    tmp_path: Path,
) -> None:
    """A compile without a depfile gets -MD -MF from the wrapper: the entry lists the
    header, and the compiler ran once (one compiler process in the job stats, no -M run:
    a -M run would go through no record, so count the processes with a stand-in cc)."""
    calls = tmp_path / "calls"
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec gcc "$@"\n')
    cc.chmod(0o755)
    env = {
        **os.environ,
        "KILN_OBJCACHE_ROOTS": f"TREE={tmp_path}",
        "KILN_OBJCACHE_DIR": str(tmp_path / "objcache"),
    }
    (tmp_path / "h.h").write_text("#define H 1\n")
    (tmp_path / "m.c").write_text('#include "h.h"\nint f(void) { return H; }\n')
    subprocess.run(
        [sys.executable, str(WRAPPER), str(cc), "-c", "m.c", "-o", "m.o"],
        cwd=tmp_path,
        env=env,
        check=True,
    )
    runs = [ln for ln in calls.read_text().splitlines() if "--version" not in ln]
    assert len(runs) == 1 and "-MD" in runs[0] and " -M " not in f" {runs[0]} "
    (entry,) = (tmp_path / "objcache" / "entries").iterdir()
    assert "@TREE@/h.h" in [d for d, _ in json.loads(entry.read_text())["deps"]]
    assert not (tmp_path / "m.o.kiln.d").exists()  # kiln's own depfile is removed


def test_gate_starts_the_longest_first_and_backfills_what_fits() -> None:
    budget = {"mem_gib": 10.0, "cpus": 2}
    waiters: list[compilegate.GateEntry] = [
        {"id": "short", "priority": 5.0, "since": 1, "mem_gib": 1.0, "cpus": 1},
        {"id": "long", "priority": 170.0, "since": 2, "mem_gib": 9.0, "cpus": 1},
        {"id": "mid", "priority": 60.0, "since": 3, "mem_gib": 2.0, "cpus": 1},
    ]
    assert compilegate.admitted(budget, [], waiters, "long") == ("local", 0)
    # With 'long' running, 'mid' (2 GiB) does not fit beside it; 'short' (1 GiB) does.
    running: list[compilegate.GateEntry] = [{"mem_gib": 9.0, "cpus": 1}]
    rest = [w for w in waiters if w["id"] != "long"]
    assert compilegate.admitted(budget, running, rest, "mid") == (None, 0)
    assert compilegate.admitted(budget, running, rest, "short") == ("local", 1)
    # No CPU slot left: nobody goes, whatever the priority.
    full: list[compilegate.GateEntry] = [{"mem_gib": 1.0, "cpus": 1}, {"mem_gib": 1.0, "cpus": 1}]
    assert compilegate.admitted(budget, full, waiters, "long") == (None, 0)


def test_gate_order_is_only_arrival_without_priorities() -> None:
    """The check above can fail: without learned priorities the first to come goes."""
    budget = {"mem_gib": 10.0, "cpus": 1}
    waiters: list[compilegate.GateEntry] = [
        {"id": "a", "priority": 0.0, "since": 1, "mem_gib": 1.0, "cpus": 1},
        {"id": "b", "priority": 0.0, "since": 2, "mem_gib": 1.0, "cpus": 1},
    ]
    assert compilegate.admitted(budget, [], waiters, "a") == ("local", 0)
    assert compilegate.admitted(budget, [], waiters, "b") == (None, 1)


def test_gate_compares_estimates_within_a_step_never_across_steps() -> None:
    """The public three's cold build: DeepGEMM's one unit (no estimate: setuptools
    compiles it) came first and waited behind every estimated FlashMLA unit, then ran
    alone at the end. Its step's place is its arrival; within FlashMLA, the estimates."""
    budget = {"mem_gib": 40.0, "cpus": 1}
    waiters: list[compilegate.GateEntry] = [
        {"id": "fmla-small", "tree": "/w/flashmla", "estimate": 5e5, "since": 3, "mem_gib": 1},
        {"id": "deepgemm", "tree": "/w/deepgemm", "estimate": 0.0, "since": 1, "mem_gib": 1},
        {"id": "fmla-big", "tree": "/w/flashmla", "estimate": 9e6, "since": 4, "mem_gib": 1},
    ]
    order = [w["id"] for w in compilegate.queue_order(waiters)]
    assert order == ["deepgemm", "fmla-big", "fmla-small"]
    assert compilegate.admitted(budget, [], waiters, "deepgemm") == ("local", 0)
    # a learned priority still outranks arrival (longest first)
    waiters[2]["priority"] = 120.0
    assert compilegate.queue_order(waiters)[0]["id"] == "fmla-big"
    # the check can fail: one tree for all of them, the estimates alone order them
    same: list[compilegate.GateEntry] = [{**w, "tree": "/w/one", "priority": 0.0} for w in waiters]
    assert [w["id"] for w in compilegate.queue_order(same)] == [
        "fmla-big",
        "fmla-small",
        "deepgemm",
    ]
