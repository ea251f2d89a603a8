"""benchmarks/onboarding.py, run on a tiny corpus (CI cannot fetch the real one): one of
the import proof's fixture upstreams (tests/landing.py), ``kiln add`` then ``kiln build``
with no edit between, so the benchmark's argument parsing, its counting of compiles and
its cuobjdump report cannot rot unseen (issue 40)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import tomlkit

from kiln.sources.gitrepo import CommitSpec, make_repo
from tests import broken, landing
from tests.conftest import REPO, shared_cache
from tests.integration.test_import_proof import PROFILE_NO_TORCH
from tests.workspace import PROFILE


def test_the_onboarding_benchmark_takes_a_corpus_from_add_to_a_proven_wheel(
    tmp_path: Path, build_python: Path
) -> None:
    made = landing.make(tmp_path / "landing")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # an upper-case repository name (issue 54 (5)): its vendor and release are lowercased
    shutil.copytree(made.root / "good.git", corpus / "Landing-Good.git", symlinks=True)
    (corpus / "corpus.toml").write_text('[Landing-Good]\nshape = "setup.py, nvcc by $NVCC"\n')
    template = tmp_path / "kiln.toml"
    template.write_text(
        tomlkit.dumps({"release": {"name": "onboarding-{name}"}, "profile": PROFILE_NO_TORCH})
    )
    out = _bench(
        tmp_path,
        corpus,
        template,
        "--toolchain",
        "system",
        "--cuda-home",
        "/usr/local/cuda",
        "--python",
        str(build_python),
    )
    (row,) = json.loads((out / "results.json").read_text())
    assert row["result"] == "proven", row
    assert row["commit"] == made.commits["good"]
    assert row["compiles"] >= 3 and row["repeated"] == 0, row
    assert row["archs"] and all(v == ["sm_100a", "sm_103a"] for v in row["archs"].values()), row
    table = (out / "onboarding.md").read_text()
    assert "| Landing-Good | setup.py, nvcc by $NVCC | " in table
    assert (tmp_path / "root" / "Landing-Good" / "vendors" / "landing-good.toml").is_file()


def _bench(tmp_path: Path, corpus: Path, template: Path, *build: str, offline: bool = True) -> Path:
    """benchmarks/onboarding.py on ``corpus`` (offline unless told: the sources come from
    the corpus's mirrors either way), ``build`` passed to add and build; its --out
    folder."""
    out = tmp_path / "out"
    res = subprocess.run(
        [
            sys.executable,
            "benchmarks/onboarding.py",
            "--corpus",
            str(corpus),
            "--cache",
            str(shared_cache(tmp_path / "cache")),
            "--root",
            str(tmp_path / "root"),
            "--kiln-toml",
            str(template),
            "--out",
            str(out),
            "--",
            *(["--offline"] if offline else []),
            *build,
        ],
        cwd=REPO,
        text=True,
        capture_output=True,
        check=False,
        timeout=1500,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return out


def test_a_two_module_setup_py_with_its_own_arch_table_of_10_0a_onboards_with_both_archs(
    tmp_path: Path, build_python: Path
) -> None:
    """Issue 54 (3, 6): a torch setup.py with two extension modules whose gencode comes
    from TORCH_CUDA_ARCH_LIST through a table of its own that knows 9.0a and 10.0a
    (tests/broken.py's ARCH_TABLE_SETUP): from ``kiln add`` to a proven wheel with no edit
    and one build, each module holding sm_100a and sm_103a (its units compile for both;
    the table's missing 10.3a drops nothing)."""
    one = 'ext_modules=[CUDAExtension("broken._C", ["csrc/binding.cpp", "csrc/k.cu"],\n'
    assert one in broken.ARCH_TABLE_SETUP
    two = broken.ARCH_TABLE_SETUP.replace(
        one,
        'ext_modules=[CUDAExtension("broken._C2", ["csrc/binding2.cpp", "csrc/k2.cu"],\n'
        '                           extra_compile_args={"cxx": [], "nvcc": gencode}),\n'
        "             " + one.removeprefix("ext_modules=["),
    )
    corpus = tmp_path / "corpus"
    make_repo(
        corpus / "table.git",
        [
            CommitSpec(
                "an extension of two modules with its own arch table",
                {
                    "setup.py": two,
                    "broken/__init__.py": "from broken import _C, _C2\n",
                    "csrc/binding.cpp": broken.BINDING,
                    "csrc/binding2.cpp": broken.BINDING.replace('"_C"', '"_C2"').replace(
                        "PyInit__C(", "PyInit__C2("
                    ),
                    "csrc/k.cu": "__global__ void k(float* x) { x[0] += 1.0f; }\n",
                    "csrc/k2.cu": "__global__ void k2(float* x) { x[0] *= 2.0f; }\n",
                    "LICENSE": "MIT License\n\nCopyright (c) 2026 kiln test fixtures\n",
                },
            )
        ],
    )
    (corpus / "corpus.toml").write_text('[table]\nshape = "setup.py, its own arch table"\n')
    template = tmp_path / "kiln.toml"
    template.write_text(
        tomlkit.dumps({"release": {"name": "onboarding-{name}"}, "profile": PROFILE})
    )
    out = _bench(tmp_path, corpus, template, "--toolchain", "pypi", "--python", str(build_python))
    (row,) = json.loads((out / "results.json").read_text())
    assert row["result"] == "proven", row
    assert row["repeated"] == 0, row
    assert len(row["archs"]) == 2, row  # both modules
    assert all(v == ["sm_100a", "sm_103a"] for v in row["archs"].values()), row
    recipe = (tmp_path / "root" / "table" / "vendors" / "table.toml").read_text()
    assert "kiln stops at its first compile" not in recipe  # no refusal predicted


def test_a_unit_is_a_source_with_its_command(tmp_path: Path) -> None:
    """One source compiled into two modules with other flags (rusty1s/pytorch_spline_conv's
    cpu and cuda builds of csrc/basis.cpp) is two units; the same command twice is one
    unit compiled again (the count can fail)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import onboarding

    lines = [
        {"source": "csrc/basis.cpp", "args_sha": "a", "result": "compiled"},
        {"source": "csrc/basis.cpp", "args_sha": "b", "result": "compiled"},
        {"source": "", "result": "other"},  # a link
    ]
    (tmp_path / "x.jobs").write_text("".join(json.dumps(j) + "\n" for j in lines))
    assert onboarding.compile_counts(tmp_path) == (2, 0)
    lines.append({"source": "csrc/basis.cpp", "args_sha": "a", "result": "compiled"})
    (tmp_path / "x.jobs").write_text("".join(json.dumps(j) + "\n" for j in lines))
    assert onboarding.compile_counts(tmp_path) == (3, 1)


SKBUILD_FILES = {
    "pyproject.toml": (
        '[build-system]\nrequires = ["scikit-build-core>=0.10"]\n'
        'build-backend = "scikit_build_core.build"\n\n'
        '[project]\nname = "kiln-skb"\nversion = "0.1.0"\nlicense = { text = "MIT" }\n\n'
        '[tool.scikit-build]\nwheel.packages = ["kiln_skb"]\n'
    ),
    # a CUDA library with CMake's own arch default (the first CUDA compiler's), installed
    # into the package and loaded with ctypes (the corpus's CuVec and bitsandbytes' way)
    "CMakeLists.txt": (
        "cmake_minimum_required(VERSION 3.24)\n"
        "project(kiln_skb LANGUAGES CXX CUDA)\n"
        "add_library(kiln_skb_k SHARED csrc/k.cu)\n"
        "install(TARGETS kiln_skb_k LIBRARY DESTINATION kiln_skb)\n"
    ),
    "csrc/k.cu": (
        "__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n"
        'extern "C" int kiln_skb_one(void) { return 1; }\n'
    ),
    "kiln_skb/__init__.py": (
        "import ctypes\nimport pathlib\n\n"
        '_lib = ctypes.CDLL(str(pathlib.Path(__file__).with_name("libkiln_skb_k.so")))\n'
        "assert _lib.kiln_skb_one() == 1\n"
    ),
    "LICENSE": "MIT License\n\nCopyright (c) 2026 kiln test fixtures\n",
}


def test_a_scikit_build_core_project_onboards_with_both_archs(
    tmp_path: Path, build_python: Path
) -> None:
    """Issue 54 (1, 2): a scikit-build-core CMake project (a CUDA library the package
    loads with ctypes): ``kiln add`` pins its ``[build-system] requires`` from the index
    (scikit-build-core with its dependencies), and the build, told the profile's archs
    through CMake's own variables, proves sm_100a + sm_103a with no edit, one build."""
    corpus = tmp_path / "corpus"
    make_repo(corpus / "skb.git", [CommitSpec("a scikit-build-core project", SKBUILD_FILES)])
    (corpus / "corpus.toml").write_text('[skb]\nshape = "scikit-build-core CMake, ctypes"\n')
    template = tmp_path / "kiln.toml"
    template.write_text(
        tomlkit.dumps({"release": {"name": "onboarding-{name}"}, "profile": PROFILE_NO_TORCH})
    )
    build = ("--toolchain", "system", "--cuda-home", "/usr/local/cuda")
    out = _bench(tmp_path, corpus, template, *build, "--python", str(build_python), offline=False)
    (row,) = json.loads((out / "results.json").read_text())
    assert row["result"] == "proven", row
    assert row["repeated"] == 0 and row["compiles"] >= 1, row
    assert row["archs"] and all(v == ["sm_100a", "sm_103a"] for v in row["archs"].values()), row
    recipe = tomlkit.parse((tmp_path / "root" / "skb" / "vendors" / "skb.toml").read_text())
    tools = [str(t) for t in recipe["build"]["build_tools"]]
    assert any(t.startswith("scikit-build-core==") for t in tools), tools
