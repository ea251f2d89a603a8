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


def _bench(tmp_path: Path, corpus: Path, template: Path, *build: str) -> Path:
    """benchmarks/onboarding.py on ``corpus`` offline, ``build`` passed to add and build;
    its --out folder."""
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
            "--offline",
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


def test_a_setup_py_with_its_own_arch_table_of_10_0a_onboards_with_both_archs(
    tmp_path: Path, build_python: Path
) -> None:
    """Issue 54 (3): a torch extension whose setup.py maps TORCH_CUDA_ARCH_LIST through a
    table of its own that knows 9.0a and 10.0a (tests/broken.py's ARCH_TABLE_SETUP): from
    ``kiln add`` to a proven wheel with no edit and one build, holding sm_100a and
    sm_103a (the unit compiles for both; the table's missing 10.3a drops nothing)."""
    corpus = tmp_path / "corpus"
    make_repo(
        corpus / "table.git",
        [
            CommitSpec(
                "an extension with its own arch table",
                {
                    "setup.py": broken.ARCH_TABLE_SETUP,
                    "broken/__init__.py": "",
                    "csrc/binding.cpp": broken.BINDING,
                    "csrc/k.cu": "__global__ void k(float* x) { x[0] += 1.0f; }\n",
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
    assert row["archs"] and all(v == ["sm_100a", "sm_103a"] for v in row["archs"].values()), row
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
