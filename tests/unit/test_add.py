"""``kiln add URL[@REV]`` on fixture upstreams (real git, real setup.py texts, the tests'
build venv for the headers): a hard-coded -gencode list becomes arch_control "rewrite",
a BSD-2-Clause license is named as such, REV is a branch, a tag, a short SHA or HEAD,
submodules are pinned at their gitlinks, and bad input stops with one line and nothing
written. The public upstreams: tests/integration/test_add.py."""

from __future__ import annotations

import dataclasses
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from kiln.cli import main
from kiln.config.models import Profile, SystemRequirement
from kiln.config.workspace import Workspace
from kiln.errors import ConfigError, KilnError, SourceError
from kiln.sources.git import git
from kiln.sources.gitrepo import CommitSpec, make_repo
from kiln.verbs import add as kiln_add
from kiln.verbs.add import license_text, pysetup, recipe, revision, stdcheck
from kiln.verbs.add.scan import Backend, Findings
from tests import ownext, public
from tests import upstreams as fixture_upstreams
from tests.upstreams import BASE_URL
from tests.workspace import write

BSD2 = ownext.BSD_2_CLAUSE

# An nvcc extension whose setup.py hard-codes its -gencode list (no variable changes it),
# compiles with -lineinfo, and includes a header the build machine must provide.
GENCODE_SETUP = """\
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NVCC_FLAGS = ["-O2", "-lineinfo", "-gencode", "arch=compute_100a,code=sm_100a",
              "-gencode=arch=compute_103a,code=sm_103a"]


class NvccBuildExt(build_ext):
    def build_extension(self, ext):
        out = self.get_ext_fullpath(ext.name)
        nvcc = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        subprocess.check_call([nvcc, "-shared", "-Xcompiler", "-fPIC", *NVCC_FLAGS,
                               *ext.sources, "-o", out])


setup(name="gencodeext", version="0.1", ext_modules=[Extension("gencodeext._k", ["csrc/k.cu"])],
      cmdclass={"build_ext": NvccBuildExt})
"""

KERNEL = """\
#include <cuda_runtime.h>
#include <hdr/scale.cuh>
#include "common.cuh"
__global__ void k(float* x) { x[0] = hdr::scale(x[0], 2.0f); }
"""
COMMON = "#pragma once\n#include <numa.h>\n"


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> fixture_upstreams.Upstreams:
    """The tests' fixture upstreams plus ``gencode.git`` (tag v0.1 on its first commit)."""
    ups = fixture_upstreams.make(tmp_path_factory.mktemp("add-upstreams"))
    shas = make_repo(
        ups.root / "gencode.git",
        [
            CommitSpec(
                "gencode: sm_100a and sm_103a, hard-coded",
                {
                    "setup.py": GENCODE_SETUP,
                    "csrc/k.cu": KERNEL,
                    "csrc/common.cuh": COMMON,
                    "LICENSE": BSD2,
                },
                submodules={"third_party/hdr": (f"{BASE_URL}hdr.git", ups.hdr[0])},
            ),
            CommitSpec("gencode: readme", {"README.md": "# gencode ext\n"}),
        ],
    )
    git("tag", "v0.1", shas[0], cwd=ups.root / "gencode.git")
    git("branch", "old", shas[0], cwd=ups.root / "gencode.git")
    return ups


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace with a profile and no vendors yet (a team's first `kiln add`)."""
    ws = write(tmp_path / "ws", {})
    return ws


def _add(ws: Path, ups, build_python: Path, url: str, rev: str | None, tmp: Path, **kw):
    return kiln_add.add_recipe(
        ws, url, rev, kw.pop("name", None), tmp / "cache", ups.mirrors, True,
        kw.pop("force", False), python=str(build_python), **kw,
    )  # fmt: skip


def test_a_hard_coded_gencode_list_becomes_rewrite(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    added = _add(workspace, fixtures, build_python, f"{BASE_URL}gencode.git", "v0.1", tmp_path)
    assert added.path == workspace / "vendors" / "gencode.toml"
    # add's unit check: k.cu reaches <numa.h> through common.cuh; where the machine lacks
    # it, the unit is said unchecked (the draft is written), else it compiled
    [compiled] = added.compiled
    absent = not Path("/usr/include/numa.h").is_file()
    assert compiled.missing == ("numa.h" if absent else None), compiled
    assert compiled.said().startswith(
        "csrc/k.cu not checked by compiling: numa.h" if absent else "checked: csrc/k.cu compiles"
    )
    data = tomllib.loads(added.path.read_text())
    shas = git("rev-parse", "v0.1", cwd=fixtures.root / "gencode.git").output.strip()
    assert data["source"]["commit"] == shas
    assert data["build"]["arch_control"] == "rewrite"
    assert data["build"]["archs"] == ["sm_100a", "sm_103a"]
    assert data["build"]["nvcc_drop_flags"] == ["-lineinfo"]
    # numa.h: none of the tree, CUDA, torch or the build venv has it (the causes table).
    assert data["build"]["system"] == [{"header": "numa.h", "package": "libnuma-dev"}]
    # The submodule pinned at the tree's gitlink. Its LICENSE holds only "MIT License"
    # and a copyright line, none of MIT's clauses: no id is guessed from a title.
    assert data["source"]["submodules"] == [{"path": "third_party/hdr", "commit": fixtures.hdr[0]}]
    # Every choice is commented: the evidence names the file and line.
    text = added.path.read_text()
    assert "setup.py:7: `NVCC_FLAGS = " in text and "rewrites every compile" in text
    assert Workspace(workspace).vendors["gencode"].build.arch_control == "rewrite"


def test_a_draft_whose_first_unit_cannot_compile_is_not_written(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path, capsys
) -> None:
    """Issue 40 (3): before it writes, add compiles the draft's first .cu with its archs
    and flags. Hopper's wgmma in a unit drafted for sm_100a and sm_103a: refused, the
    cause named, nothing written; --no-check writes it. A unit that compiles is said
    checked, for each arch."""
    kernel = '__global__ void k() { asm volatile("wgmma.fence.sync.aligned;"); }\n'
    make_repo(
        fixtures.root / "wgmma.git",
        [CommitSpec("wgmma", {"setup.py": GENCODE_SETUP, "csrc/k.cu": kernel, "LICENSE": BSD2})],
    )
    url = f"{BASE_URL}wgmma.git"
    before = sorted((workspace / "vendors").iterdir())
    with pytest.raises(ConfigError) as refused:
        _add(workspace, fixtures, build_python, url, None, tmp_path)
    said = str(refused.value)
    assert said.startswith(
        "vendors/wgmma.toml (not written): the draft's first CUDA unit csrc/k.cu does not "
        "compile with its archs and flags (error: Instruction 'wgmma.fence' not supported on "
        ".target 'sm_100a'); csrc/k.cu was compiled for sm_100a, and its device code uses "
        "wgmma.fence, which exists on sm_90a only"
    ), said
    # the PTX it points at is kept, in the cache
    kept = said.split("(its PTX, kept: ")[1].split(":")[0]
    assert Path(kept).is_file() and Path(kept).is_relative_to(tmp_path / "cache"), kept
    assert "no arch this build makes (sm_100a, sm_103a) has wgmma.fence" in said
    assert said.endswith("; --no-check writes it unchecked")
    _one_line_and_nothing_written(refused.value, workspace, before)
    argv = (
        ["add", f"{url}", "--workspace", str(workspace), "--cache", str(tmp_path / "cache"),
         "--mirrors", str(fixtures.mirrors), "--offline", "--python", str(build_python),
         "--no-dry-run"]
    )  # fmt: skip
    assert main(argv) != 0 and not (workspace / "vendors" / "wgmma.toml").exists()
    capsys.readouterr()
    assert main([*argv, "--no-check"]) == 0
    assert capsys.readouterr().out.strip() == str(workspace / "vendors" / "wgmma.toml")
    # the same tree with a kernel every arch has: compiled for both, then written
    make_repo(
        fixtures.root / "fine.git",
        [
            CommitSpec(
                "fine",
                {
                    "setup.py": GENCODE_SETUP,
                    "csrc/k.cu": "__global__ void k(float* x) { x[0] = 2.0f; }\n",
                    "LICENSE": BSD2,
                },
            )
        ],
    )
    added = _add(workspace, fixtures, build_python, f"{BASE_URL}fine.git", None, tmp_path)
    [compiled] = added.compiled
    assert (compiled.unit, compiled.kind, compiled.missing) == ("csrc/k.cu", "CUDA", None)
    assert compiled.said().startswith(
        "checked: csrc/k.cu compiles for sm_100a, sm_103a with the drafted flags ("
    )


def test_the_unit_check_compiles_with_torchs_own_standard_where_setup_py_passes_none(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    """torch's BuildExtension adds -std=c++20 (its headers' standard) where setup.py
    passes no -std: the check does too (with the compiler's default C++17, causal-conv1d's
    draft was refused though its build passes). A unit whose code is C++20."""
    unit = "#include <Python.h>\ntemplate <typename T> concept Any = true;\nint f(Any auto x);\n"
    compiled = _one_unit_checked(
        workspace, fixtures, build_python, tmp_path, "plus20", "CppExtension", "csrc/k.cpp", unit
    )
    assert (compiled.unit, compiled.kind, compiled.missing) == ("csrc/k.cpp", "C++", None)
    assert "-std=c++20" in compiled.command


def _one_unit_checked(
    workspace: Path,
    fixtures,
    build_python: Path,
    tmp_path: Path,
    name: str,
    extension: str,
    path: str,
    unit: str,
):
    """``kiln add`` of a torch extension of one unit (``extension``: CppExtension or
    CUDAExtension); the unit its check compiled."""
    setup = (
        "from setuptools import setup\n"
        f"from torch.utils.cpp_extension import BuildExtension, {extension}\n"
        f'setup(name="{name}", version="0.1", cmdclass={{"build_ext": BuildExtension}},\n'
        f'      ext_modules=[{extension}("{name}._C", ["{path}"])])\n'
    )
    make_repo(
        fixtures.root / f"{name}.git",
        [CommitSpec(name, {"setup.py": setup, path: unit, "LICENSE": BSD2})],
    )
    added = _add(workspace, fixtures, build_python, f"{BASE_URL}{name}.git", None, tmp_path)
    [compiled] = added.compiled
    return compiled


CU_ONLY_SETUP = """\
import pybind11
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(name="cuonly", version="0.1", cmdclass={"build_ext": BuildExtension},
      ext_modules=[CUDAExtension("cuonly._C", ["csrc/k.cu"],
                                 extra_compile_args={"nvcc": ["-std=c++17", "-O3"]})])
"""


def test_a_cuda_only_tree_with_torch_headers_gets_nvccs_standard_flag(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    """Issue 35: its only units are .cu files including torch's headers under a hard-coded
    -std=c++17: the C++ compiler's flag would change nothing (the first build failed and
    asked for what the recipe had), nvcc's is what the draft needs."""
    make_repo(
        fixtures.root / "cuonly.git",
        [
            CommitSpec(
                "cuonly",
                {
                    "setup.py": CU_ONLY_SETUP,
                    "csrc/k.cu": "#include <torch/extension.h>\n__global__ void k() {}\n",
                    "LICENSE": BSD2,
                },
            )
        ],
    )
    # check=False: the unit check would compile torch's headers with nvcc for both archs
    # (over 120 s under CI's load); test_the_unit_check_compiles_with_torchs_own_standard...
    # and the DeepGEMM command test compile torch extensions' units with their drafts
    added = _add(
        workspace, fixtures, build_python, f"{BASE_URL}cuonly.git", None, tmp_path, check=False
    )
    build = tomllib.loads(added.path.read_text())["build"]
    assert build.get("nvcc_append_flags") == ["-std=c++20"]
    assert "cxx_append_flags" not in build or build["cxx_append_flags"] == []
    text = added.path.read_text().replace("\n# ", " ")  # the comments, unwrapped
    assert "nvcc_append_flags for 1 CUDA unit(s) (csrc/k.cu)" in text
    # issue 35 (8): the drafted flag tried in add's own check, as the unit will meet it
    [tried] = added.checked
    assert (tried.key, tried.unit, tried.flags) == (
        "nvcc_append_flags",
        "csrc/k.cu",
        ["-std=c++17", "-std=c++20"],
    )
    assert tried.said().startswith(
        "checked nvcc_append_flags: nvcc -E -std=c++17 -std=c++20 of torch/extension.h passes"
    )
    assert added.compiled == []  # not compiled (check=False)
    # ... and a flag that would not do is refused before anything is written
    env = kiln_add._environment(
        Workspace(workspace).profile, tmp_path / "cache", str(build_python), None
    )
    with pytest.raises(ConfigError) as refused:
        stdcheck.check("cuonly", {"nvcc_append_flags": ["-std=c++17"]}, added.findings, env)
    assert str(refused.value).startswith(
        "vendors/cuonly.toml (not written): the drafted nvcc_append_flags = ['-std=c++17'] "
        "does not get csrc/k.cu's torch headers through the CUDA compiler ("
    ), refused.value
    assert "C++20 or later" in str(refused.value)
    # where the compiler is not there, add only reads: the flag stays, said not checked
    no_cuda = dataclasses.replace(env, cuda_home=tmp_path / "no-cuda")
    assert (
        stdcheck.check("cuonly", {"nvcc_append_flags": ["-std=c++20"]}, added.findings, no_cuda)
        == []
    )
    # issue 35 (9): setup.py imports what the build venv lacks: flagged, build_tools proposed
    assert "setup.py:1: `import pybind11`: setup.py imports pybind11, which the build venv " in text
    assert 'set by hand: build_tools = ["pybind11==VERSION"] in this table' in text
    assert (
        "imports os," not in text
        and "imports setuptools" not in text
        and "imports torch" not in text
    )


def test_an_upstream_arch_table_without_a_profile_arch_is_named_in_the_draft(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    """Issue 35 (11), 54 (3): setup.py maps TORCH_CUDA_ARCH_LIST through its own table,
    which has no 10.3a: its targets cover sm_100a, and add compiles the unit for sm_103a
    alone; it builds, so the draft has both archs, sm_103a from the table's sm_100a
    (build.arch_also), and predicts no refusal."""
    from tests.broken import ARCH_TABLE_SETUP, BINDING

    make_repo(
        fixtures.root / "table.git",
        [
            CommitSpec(
                "table",
                {
                    "setup.py": ARCH_TABLE_SETUP,
                    "csrc/binding.cpp": BINDING,
                    "csrc/k.cu": "__global__ void k() {}\n",
                    "LICENSE": BSD2,
                },
            )
        ],
    )
    added = _add(workspace, fixtures, build_python, f"{BASE_URL}table.git", None, tmp_path)
    text = added.path.read_text().replace("\n# ", " ")
    assert "setup.py:6: `TARGETS = " in text
    assert "those its table's targets cover: sm_100a of the profile's archs" in text
    assert "sm_103a too: of the family of the hard-coded sm_100a, and add compiled" in text
    assert "will drop" not in text and "kiln stops" not in text
    build = tomllib.loads(added.path.read_text())["build"]
    assert build["archs"] == ["sm_100a", "sm_103a"] and build["arch_control"] == "rewrite"
    assert build["arch_also"] == {"sm_100a": ["sm_103a"]}


def test_a_bsd_2_clause_license_is_named_as_such(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    added = _add(workspace, fixtures, build_python, f"{BASE_URL}gencode.git", "v0.1", tmp_path)
    assert added.findings.license is not None and added.findings.license.spdx == "BSD-2-Clause"
    text = added.path.read_text()
    # any SPDX id is a recipe's license_id (checked against packaging's SPDX list)
    assert tomllib.loads(text)["source"]["license_id"] == "BSD-2-Clause"
    assert Workspace(workspace).vendors["gencode"].source.license_id == "BSD-2-Clause"


def test_license_clauses_tell_bsd_2_from_bsd_3_and_mit(tmp_path: Path) -> None:
    bsd3 = BSD2.replace(
        "THIS SOFTWARE",
        "3. Neither the name of the copyright holder nor the names of its\n   contributors "
        "may be used to endorse or promote products.\n\nTHIS SOFTWARE",
    )
    mit = "MIT License\n\n" + textwrap.fill(
        "Permission is hereby granted, free of charge, to any person obtaining a copy. "
        "The above copyright notice and this permission notice shall be included in all "
        "copies or substantial portions of the Software."
    )
    tagged = "Copyright NVIDIA\nSPDX-License-Identifier: bsd-3-clause\n\nsome text\n"
    for name, text, want in [
        ("bsd2", BSD2, "BSD-2-Clause"),
        ("bsd3", bsd3, "BSD-3-Clause"),
        ("mit", mit, "MIT"),
        ("tagged", tagged, "BSD-3-Clause"),
        ("none", "All rights reserved.\n", None),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "COPYING").write_text(text)
        assert license_text.find(tmp_path / name) == "COPYING"
        assert license_text.identify(tmp_path / name, "COPYING").spdx == want, name


@pytest.mark.parametrize(
    "rev, how",
    [("v0.1", "tag v0.1"), ("old", "branch old"), (None, "HEAD -> main"), ("main", "branch main")],
)
def test_rev_is_a_branch_a_tag_a_sha_or_head(
    fixtures, tmp_path: Path, rev: str | None, how: str
) -> None:
    from kiln.config.mirrors import Mirrors
    from kiln.sources.checkout import GitCache

    repo = fixtures.root / "gencode.git"
    cache = GitCache(tmp_path / "cache", Mirrors.load(fixtures.mirrors), offline=True)
    want = git("rev-parse", rev or "main", cwd=repo).output.strip()
    assert revision.resolve(cache, f"{BASE_URL}gencode.git", rev, "t") == (want, how)
    # A short SHA, once the clone is cached, resolves without fetching.
    assert revision.resolve(cache, f"{BASE_URL}gencode.git", want[:9], "t") == (want, "commit")


def test_url_and_rev_are_split_at_the_last_at() -> None:
    assert revision.split("https://h/o/r@v1.2") == ("https://h/o/r", "v1.2")
    assert revision.split("git@github.com:o/r.git") == ("git@github.com:o/r.git", None)
    assert revision.split("git@github.com:o/r.git@abc1234") == ("git@github.com:o/r.git", "abc1234")
    assert revision.split("https://u@h/o/r@feature/x") == ("https://u@h/o/r", "feature/x")
    with pytest.raises(SourceError, match="empty REV"):
        revision.split("https://h/o/r@")


def _one_line_and_nothing_written(exc: KilnError, ws: Path, before: list[Path]) -> None:
    assert "\n" not in str(exc)
    assert sorted((ws / "vendors").iterdir()) == before


def test_bad_input_stops_with_one_line(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    before = sorted((workspace / "vendors").iterdir())
    with pytest.raises(SourceError, match="does not exist: fix the mirrors file") as unknown:
        _add(workspace, fixtures, build_python, f"{BASE_URL}nothing.git", None, tmp_path)
    _one_line_and_nothing_written(unknown.value, workspace, before)
    with pytest.raises(SourceError, match="'no-such' is not a branch, tag or commit") as rev:
        _add(workspace, fixtures, build_python, f"{BASE_URL}gencode.git", "no-such", tmp_path)
    _one_line_and_nothing_written(rev.value, workspace, before)
    with pytest.raises(SourceError, match="is not a branch, tag or commit") as sha:
        _add(workspace, fixtures, build_python, f"{BASE_URL}gencode.git", "deadbeef", tmp_path)
    _one_line_and_nothing_written(sha.value, workspace, before)
    with pytest.raises(ConfigError, match="not a vendor name") as name:
        _add(workspace, fixtures, build_python, f"{BASE_URL}plain.git", "main", tmp_path, name="A")
    _one_line_and_nothing_written(name.value, workspace, before)


def test_an_existing_recipe_is_kept_without_force(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    target = workspace / "vendors" / "plain.toml"
    target.write_text("# mine\n")
    with pytest.raises(ConfigError, match="already exists; pass --force") as exc:
        _add(workspace, fixtures, build_python, f"{BASE_URL}plain.git", "main", tmp_path)
    assert "\n" not in str(exc.value) and target.read_text() == "# mine\n"
    _add(workspace, fixtures, build_python, f"{BASE_URL}plain.git", "main", tmp_path, force=True)
    data = tomllib.loads(target.read_text())
    # plain computes its -gencode flags from archs.txt: rewritten to the profile's archs.
    assert data["build"]["arch_control"] == "rewrite"
    assert (
        data["build"]["archs"] == ["sm_100a", "sm_103a"] and "nvcc_drop_flags" not in data["build"]
    )


def test_the_command_writes_the_recipe_and_prints_its_path(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path, capsys
) -> None:
    """From git bundles, as `kiln build --bundles` reads them (the workspace's
    bundles.toml names one for each URL, the submodule's too)."""
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    for repo in ("gencode", "hdr"):
        git("bundle", "create", "-q", bundles / f"{repo}.bundle", "--all",
            cwd=fixtures.root / f"{repo}.git")  # fmt: skip
    (workspace / "bundles.toml").write_text(
        f'[bundles]\n"{BASE_URL}gencode.git" = "gencode.bundle"\n'
        f'"{BASE_URL}hdr.git" = "hdr.bundle"\n'
    )
    argv = (
        ["add", f"{BASE_URL}gencode.git@v0.1", "--workspace", str(workspace), "--name", "gx",
         "--cache", str(tmp_path / "cache"), "--bundles", str(bundles),
         "--python", str(build_python), "--no-dry-run"]
    )  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == str(workspace / "vendors" / "gx.toml")
    assert Workspace(workspace).vendors["gx"].source.url == f"{BASE_URL}gencode.git"


# --------------------------------------------------------------------------- setup.py rules


def _setup(tmp_path: Path, text: str) -> pysetup.SetupPy:
    (tmp_path / "setup.py").write_text(textwrap.dedent(text))
    return pysetup.read(tmp_path, "setup.py")


def test_a_rocm_only_branch_is_neither_read_nor_cited(tmp_path: Path) -> None:
    """Issue 35 (10): the draft cites only lines on the path a CUDA build runs; a HIP
    branch's flags, variables and downloads are not the recipe's (one draft cited one).
    Issue 40: also under a flag of the upstream's own naming (causal-conv1d's
    ``HIP_BUILD = bool(torch.version.hip)``: its draft cited the ROCm branch's -std)."""
    s = _setup(
        tmp_path,
        """\
        import os, torch, urllib.request
        from torch.utils.cpp_extension import IS_HIP_EXTENSION
        if IS_HIP_EXTENSION:
            flags = ["-std=c++17", "--offload-arch=gfx942"]
            os.environ.get("ROCM_ARCH")
            urllib.request.urlretrieve("https://example.invalid/rocm.whl", "r.whl")
        else:
            flags = ["-std=c++20", "-gencode=arch=compute_90a,code=sm_90a"]
        if torch.version.hip is None:
            os.getenv("CUDA_ONLY_X")
        if not IS_HIP_EXTENSION:
            os.getenv("CUDA_ONLY_Y")
        else:
            os.getenv("ROCM_Y")
        extra = "-std=c++14" if torch.version.hip else "-O3"
        HIP_BUILD = bool(torch.version.hip)
        if HIP_BUILD:
            rocm = {"cxx": ["-O3", "-std=c++17"]}
            os.getenv("HIP_ARCHITECTURES", "native")
        """,
    )
    assert [r.name for r in s.env_reads] == ["CUDA_ONLY_X", "CUDA_ONLY_Y"]
    assert [n for n, _ in s.std_flags] == [20]
    assert [f.archs for f in s.arch_flags] == [("sm_90a",)]
    assert s.network == [] and s.download_guards == []
    # every line cited is on the CUDA path
    assert {seen.line for _, seen in s.std_flags} == {8}


def test_a_toggle_is_the_variable_of_the_if_around_an_arch_flag(tmp_path: Path) -> None:
    s = _setup(
        tmp_path,
        """\
        import os
        def flag(name):
            return os.getenv(name, "0") in ("1", "true")
        NO_OLD = flag("X_DISABLE_OLD")
        WANT_NEW = int(os.environ.get("X_NEW", "1"))
        flags = []
        if not NO_OLD:
            flags += ["-gencode", "arch=compute_90a,code=sm_90a"]
        if WANT_NEW:
            flags += ["-gencode=arch=compute_100f,code=sm_100f"]
        else:
            flags += ["-gencode=arch=compute_100a,code=sm_100a"]
        """,
    )
    assert [(f.archs, f.toggle) for f in s.arch_flags] == [
        (("sm_90a",), ("X_DISABLE_OLD", "1")),
        (("sm_100f",), ("X_NEW", "0")),
        (("sm_100a",), ("X_NEW", "1")),
    ]


def test_an_asserted_value_and_a_download_guard_are_pinned(tmp_path: Path) -> None:
    s = _setup(
        tmp_path,
        """\
        import os, urllib.request
        FORCE = int(os.getenv("Y_FORCE", "0")) == 1
        LOCAL = int(os.getenv("Y_LOCAL", "1")) == 1
        VERSION = "1.0" + ("+local" if LOCAL else "")
        if os.environ.get("ARCHS", "") != "9.0":
            assert int(os.getenv("Y_SAFE", 1)) == 1
        assert os.getenv("Y_PRESENT") is not None
        def run():
            if FORCE or LOCAL:
                return build()
            urllib.request.urlopen("https://example.invalid/wheel")
        """,
    )
    assert [(p.name, p.value) for p in s.asserted] == [("Y_SAFE", "1")]
    assert "when os.environ.get('ARCHS', '') != '9.0'" in s.asserted[0].why
    # Y_LOCAL also skips the download but changes the version too: Y_FORCE is chosen.
    assert [(p.name, p.value) for p in s.download_guards] == [("Y_FORCE", "1")]
    assert "Y_LOCAL would too" in s.download_guards[0].why


def test_a_download_guard_compared_with_a_string_is_drafted_with_that_string(
    tmp_path: Path,
) -> None:
    """Issue 35: ``getenv("..._FORCE_BUILD", "FALSE") == "TRUE"`` is skipped by "TRUE":
    drafting "1" let the build go on to download a prebuilt wheel."""
    s = _setup(
        tmp_path,
        """\
        import os, urllib.request
        if os.getenv("Z_FORCE_BUILD", "FALSE") == "TRUE":
            build()
        else:
            urllib.request.urlretrieve("https://example.invalid/wheel", "w.whl")
        FETCH = os.environ.get("Z_SKIP_DOWNLOAD", "no") != "yes"
        if FETCH:
            urllib.request.urlopen("https://example.invalid/other")
        """,
    )
    assert [(p.name, p.value) for p in s.download_guards] == [
        ("Z_FORCE_BUILD", "TRUE"),
        ("Z_SKIP_DOWNLOAD", "yes"),
    ]


def test_an_unguarded_download_is_only_reported(tmp_path: Path) -> None:
    s = _setup(tmp_path, 'import subprocess\nsubprocess.run(["git", "clone", "x"])\n')
    assert s.download_guards == [] and [x.line for x in s.network] == [2]


def test_default_names_are_the_repository_lowercased() -> None:
    assert kiln_add.default_name("https://github.com/Org/DeepThing.git") == "deepthing"
    assert kiln_add.default_name("git@host:org/My.Lib") == "my-lib"
    with pytest.raises(ConfigError, match="pass --name"):
        kiln_add.default_name("https://host/org/...")


def test_the_public_comparison_sees_every_decisive_key() -> None:
    """tests/integration/test_add.py compares `kiln add`'s recipes with the hand-written
    ones through ``public.decisive``: a change to any key it names must show."""
    hand = public.recipe(public.WORKSPACE / "vendors" / "flashmla.toml")
    base = public.decisive(hand)
    changes: dict[str, dict[str, Any]] = {
        "source": {
            "url": "https://example.invalid/x",
            "commit": "0" * 40,
            "license": "COPYING",
            "license_id": "Apache-2.0",
            "submodules": [],
        },
        "build": {
            "kind": "inplace",
            "arch_control": "rewrite",
            "archs": ["sm_100f"],
            "arch_toggles": {},
            "env": {"X": "1"},
            "system": [SystemRequirement(header="numa.h", package="libnuma-dev")],
            "cxx_append_flags": ["-std=c++20"],
            "nvcc_append_flags": ["-G"],
            "nvcc_drop_flags": [],
            "nvcc_threads": 3,
            "max_jobs": 2,
            "command": ["make"],
            "outputs": ["x.so"],
        },
    }
    assert len(changes["source"]) + len(changes["build"]) == len(base)
    for table, fields in changes.items():
        for key, value in fields.items():
            part = getattr(hand, table).model_copy(update={key: value})
            changed = public.decisive(hand.model_copy(update={table: part}))
            assert changed != base, f"{table}.{key}"


def test_a_build_script_alone_is_built_in_place_and_nothing_at_all_is_refused(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    shas = make_repo(
        fixtures.root / "script.git",
        [
            CommitSpec("docs only", {"README.md": "# script\n", "LICENSE": BSD2}),
            CommitSpec("a build script", {"build.sh": "nvcc -shared k.cu -o k.so\n", "k.cu": ""}),
        ],
    )
    with pytest.raises(ConfigError, match="cannot tell how it is built") as exc:
        _add(workspace, fixtures, build_python, f"{BASE_URL}script.git", shas[0], tmp_path)
    assert "\n" not in str(exc.value) and not (workspace / "vendors" / "script.toml").exists()
    added = _add(workspace, fixtures, build_python, f"{BASE_URL}script.git", shas[1], tmp_path)
    build = Workspace(workspace).vendors["script"].build
    assert (build.kind, build.command, build.outputs) == (
        "inplace",
        ["bash", "build.sh"],
        ["**/*.so"],
    )
    # CUDA sources outside torch's extension build: the wrapper rewrites their archs.
    assert (build.arch_control, build.archs) == ("rewrite", ["sm_100a", "sm_103a"])
    assert "check outputs" in added.path.read_text()


def test_computed_arch_flags_read_as_one_sentence(tmp_path: Path) -> None:
    """Issue 35 (10): a draft once read "computes its arch flags None of the profile's
    archs ... fits": the computed case says what kiln does in one sentence."""
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    s = _setup(
        tmp_path,
        """\
        archs = ["90a", "100a"]
        flags = ["-gencode=arch=compute_%s,code=sm_%s" % (a, a) for a in archs]
        """,
    )
    f = Findings("u", "c", Backend("setuptools", "setup.py"), setup=[s], sources=[("k.cu", None)])
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    profile = Profile(cuda="13.2", python="3.12", archs=["sm_100a", "sm_103a"])
    recipe._archs(table, f, {None: profile}, decided)
    text = tomlkit.dumps(table).replace("\n# ", " ")
    assert decided["arch_control"] == "rewrite" and decided["archs"] == ["sm_100a", "sm_103a"]
    assert (
        "setup.py computes its arch flags (no arch is spelt in its text): kiln's compiler "
        "wrapper rewrites every compile's arch flags to the recipe's archs, all of the "
        "profile's archs (sm_100a, sm_103a); check that the code compiles for each."
    ) in text, text
    assert "None of" not in text


def test_what_setuptools_bundles_is_no_missing_import(tmp_path: Path) -> None:
    """setuptools >= 71 puts its bundled copies on sys.path once imported: a setup.py that
    imports ``packaging`` builds in a venv without the distribution (issue 40: add asked
    for a build_tools line the build never needed). What nobody provides is still named."""
    from kiln.verbs.add import pysetup, scan

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text(
        "import setuptools\nfrom packaging.version import Version\nimport more_itertools\n"
        "import pybind11\n"
    )
    site = tmp_path / "site-packages"
    for rel in ("setuptools/_vendor/packaging", "setuptools/_vendor/more_itertools"):
        (site / rel).mkdir(parents=True)
    (site / "setuptools-80.9.0.dist-info").mkdir()
    found = scan.missing_imports(tree, [pysetup.read(tree, "setup.py")], site)
    assert [name for name, _ in found] == ["pybind11"]
    (site / "setuptools" / "_vendor" / "packaging").rmdir()  # an older setuptools: named
    found = scan.missing_imports(tree, [pysetup.read(tree, "setup.py")], site)
    assert [name for name, _ in found] == ["packaging", "pybind11"]


ARCH_TABLE_FORMS = {
    "a dict": 'TARGETS = {"9.0a": "90a", "10.0a": "100a"}\n',
    "an if/elif chain": (
        "flags = []\n"
        "for arch in os.environ['TORCH_CUDA_ARCH_LIST'].split(';'):\n"
        '    if arch == "9.0a":\n'
        '        flags.append("-gencode=arch=compute_90a,code=sm_90a")\n'
        '    elif arch in ("10.0a", "10.0"):\n'
        '        flags.append("-gencode=arch=compute_100a,code=sm_100a")\n'
    ),
    "a loop over capabilities": (
        'for cap in ["9.0a", "10.0a"]:\n    flags.append("-gencode=arch=compute_%s" % cap)\n'
    ),
    "a list": 'SUPPORTED = ["9.0a", "10.0a"]\n',
}


@pytest.mark.parametrize("form", ARCH_TABLE_FORMS)
def test_arch_tables_are_read_in_every_form_setup_py_writes_them(form: str, tmp_path: Path) -> None:
    """Issue 40: an arch table written as an if/elif chain went unseen (and the draft said
    no arch was spelt in setup.py's text); a dict, a chain, a loop and a list all read."""
    from kiln.verbs.add import pysetup

    (tmp_path / "setup.py").write_text("import os\n" + ARCH_TABLE_FORMS[form])
    (tables,) = [t for t in pysetup.read(tmp_path, "setup.py").arch_tables]
    keys, seen = tables
    assert set(keys) >= {"9.0a", "10.0a"} and "10.3a" not in keys, keys
    assert seen.line >= 2


def test_adds_checks_use_the_profiles_cuda_not_the_machines(tmp_path: Path) -> None:
    """Issue 40: add checked -std with this machine's nvcc (13.0 here) for a profile of
    CUDA 13.2; it takes the profile's own toolkit (from PyPI, as a --toolchain pypi build),
    and this machine's where its nvcc is the profile's CUDA."""
    from kiln.config.models import Profile
    from kiln.inside.facts import nvcc_version
    from kiln.verbs.add import profile_cuda_home
    from tests.conftest import shared_cache
    from tests.workspace import PROFILE

    cache = shared_cache(tmp_path / "cache")
    home = profile_cuda_home(Profile.model_validate(PROFILE), cache, None)
    assert nvcc_version(home).startswith("13.2."), home
    system = Profile.model_validate({**PROFILE, "cuda": "13.0"})
    assert profile_cuda_home(system, cache, None) == Path("/usr/local/cuda")
    assert profile_cuda_home(system, cache, "/opt/x") == Path("/opt/x")  # named: as named


def test_what_the_wheel_requires_is_listed_for_install_sh_with_the_profiles_torch_kept(
    tmp_path: Path,
) -> None:
    """Issue 40: setup.py said install_requires=["packaging", "ninja"] in its first lines,
    and the build was refused after 17 minutes of compiling. add reads it and lists what
    runtime-requirements.txt lacks (torch is left to the profile, which install.sh keeps
    where the file names none)."""
    from kiln.release.files import requirements
    from kiln.verbs.add import pysetup, runtime_requirements, scan

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text(
        "from setuptools import setup\n"
        'setup(name="x", install_requires=["torch>=2", "packaging", "ninja>=1.11",\n'
        "      \"tomli; python_version < '3.0'\"])\n"
    )
    (tree / "pyproject.toml").write_text('[project]\ndependencies = ["einops==0.8.1"]\n')
    requires = scan.runtime_requires(tree, [pysetup.read(tree, "setup.py")])
    assert [r for r, _ in requires] == [
        "torch>=2",
        "packaging",
        "ninja>=1.11",
        "tomli; python_version < '3.0'",
        "einops==0.8.1",
    ]
    assert (
        requires[0][1]
        == 'setup.py:2: `setup(name="x", install_requires=["torch>=2", "packaging", "ninja>=1.11",`'
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "runtime-requirements.txt").write_text("einops==0.8.1\n")
    assert runtime_requirements(ws, "x", requires) == ["packaging", "ninja>=1.11"]
    text = (ws / "runtime-requirements.txt").read_text()
    assert text.startswith("einops==0.8.1\n# kiln add x: what its wheel requires (setup.py:2: ")
    assert text.endswith("\npackaging\nninja>=1.11\n")
    assert runtime_requirements(ws, "x", requires) == []  # once
    # install.sh keeps the profile's torch beside them
    assert requirements(ws, "2.14.1+cu130").endswith("torch==2.14.1\n")


GUARDED_KERNEL = """\
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 1030
#error "k: written for sm_100a alone"
#endif
__global__ void k(float* x) { x[0] = 1.0f; }
"""


@pytest.mark.parametrize("case", ["compiles", "guarded", "unchecked"])
def test_a_hard_coded_a_archs_family_is_drafted_where_the_compiler_builds_it(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path, case: str
) -> None:
    """Issue 54 (3): a .cu-only upstream hard-coding sm_90a and sm_100a. add compiles its
    first CUDA unit for sm_103a (sm_100a's family) alone: where it compiles, sm_103a is
    in archs (add kept sm_100a alone before, by a rule, and the wheel lacked sm_103a);
    where an arch guard in the code refuses it, it is left out with the compiler's
    file:line; with --no-check the draft says why it is not drafted and what would build it."""
    kernel = (
        GUARDED_KERNEL if case == "guarded" else "__global__ void k(float* x) { x[0] = 1.0f; }\n"
    )
    make_repo(
        fixtures.root / f"hb-{case}.git",
        [
            CommitSpec(
                "hb",
                {
                    "setup.py": GENCODE_SETUP.replace(
                        '"-gencode=arch=compute_103a,code=sm_103a"',
                        '"-gencode=arch=compute_90a,code=sm_90a"',
                    ),
                    "csrc/k.cu": kernel,
                    "LICENSE": BSD2,
                },
            )
        ],
    )
    added = _add(
        workspace, fixtures, build_python, f"{BASE_URL}hb-{case}.git", None, tmp_path,
        check=case != "unchecked",
    )  # fmt: skip
    data = tomllib.loads(added.path.read_text())
    text = added.path.read_text().replace("\n# ", " ")
    if case == "compiles":
        assert data["build"]["archs"] == ["sm_100a", "sm_103a"]
        assert (
            "sm_103a too: of the family of the hard-coded sm_100a, and add compiled csrc/k.cu"
            in text
        )
    elif case == "guarded":
        assert data["build"]["archs"] == ["sm_100a"]
        assert "Not sm_103a: the compiler refuses csrc/k.cu for it at add (csrc/k.cu:2:" in text
        assert "written for sm_100a alone" in text
    else:
        assert data["build"]["archs"] == ["sm_100a"]
        assert (
            "Not sm_103a: of the family of the hard-coded sm_100a, but an 'a' target's code" in text
        )
        assert "a patch asking for the family target (sm_100f) builds sm_103a too" in text


def test_a_gpu_probe_with_its_own_switch_drafts_the_switch(tmp_path: Path) -> None:
    """rusty1s/pytorch_spline_conv's shape: CUDA code only where torch.cuda.is_available()
    or FORCE_CUDA=1. No GPU answers where kiln builds: the draft sets FORCE_CUDA = "1".
    Without a switch of its own (pytorch/extension-cpp's), the comment says a patch is
    the fix and nothing is set."""
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    probe = """\
        import os
        import torch
        WITH_CUDA = torch.cuda.is_available()
        {switch}
        """
    s = _setup(tmp_path, probe.format(switch="WITH_CUDA = os.getenv('FORCE_CUDA', '0') == '1'"))
    assert s.gpu_probe is not None and s.gpu_probe.line == 3
    f = Findings("u", "c", Backend("setuptools", "setup.py"), setup=[s], sources=[("k.cu", None)])
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    decided["arch_toggles"] = {}
    recipe._env(table, f, decided)
    assert decided["env"] == {"FORCE_CUDA": "1"}
    said = " ".join(tomlkit.dumps(table).replace("#", " ").split())
    assert "forces the CUDA build" in said
    s = _setup(tmp_path, probe.format(switch="DEBUG = os.getenv('DEBUG', '0') == '1'"))
    f = Findings("u", "c", Backend("setuptools", "setup.py"), setup=[s], sources=[("k.cu", None)])
    table, decided = tomlkit.table(), recipe.DecidedBuild()
    decided["arch_toggles"] = {}
    recipe._env(table, f, decided)
    assert decided["env"] == {}
    said = " ".join(tomlkit.dumps(table).replace("#", " ").split())
    assert "no variable of its own forces it" in said and "a patch" in said
    assert _setup(tmp_path, "import os\n").gpu_probe is None


def test_a_gpu_probe_whose_else_builds_the_same_cuda_decides_nothing(tmp_path: Path) -> None:
    """rahul-goel/fused-ssim's shape: ``if torch.cuda.is_available(): cuda()``, other
    backends in ``elif``s, and ``else: cuda()``: with no GPU the CUDA code is built all the
    same, so the draft does not say it builds none (it did); an ``else`` that builds
    something else keeps the probe."""
    chain = """\
        import torch
        def cuda(): return 1
        def mps(): return 2
        if torch.cuda.is_available():
            x = cuda()
        elif torch.backends.mps.is_available():
            x = mps()
        else:
            x = {other}()
        """
    assert _setup(tmp_path, chain.format(other="cuda")).gpu_probe is None
    kept = _setup(tmp_path, chain.format(other="mps")).gpu_probe
    assert kept is not None and kept.line == 4


def test_a_torch_extension_named_through_the_module_is_one(tmp_path: Path) -> None:
    """``from torch.utils import cpp_extension`` then ``cpp_extension.CUDAExtension(...)``
    (IST-DASLab/marlin's setup.py): a torch extension, so add's check compiles its units
    with torch's own -std=c++20 (as a stranger's build would have it), not the compiler's
    default C++17, which torch's headers refuse (the draft was refused at add)."""
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\n"
        "from torch.utils import cpp_extension\n"
        "setup(name='m', ext_modules=[cpp_extension.CUDAExtension('m_cuda', ['m.cpp', 'k.cu'])],\n"
        "      cmdclass={'build_ext': cpp_extension.BuildExtension})\n"
    )
    found = pysetup.read(tmp_path, "setup.py")
    assert found.torch_extension is not None and found.torch_extension.line == 3
    assert found.build_extension is not None


def test_the_unit_check_gives_a_torch_extensions_cuda_unit_torchs_own_nvcc_flags(
    workspace: Path, fixtures, build_python: Path, tmp_path: Path
) -> None:
    """torch's BuildExtension gives every CUDA unit its COMMON_NVCC_FLAGS
    (``-D__CUDA_NO_HALF_OPERATORS__``, ...): the check does too, read from the build
    venv's torch (without them rusty1s/pytorch_cluster's fps_cuda.cu failed at add with
    "more than one operator ">" matches", though its build passes). The unit here fails
    to compile without them."""
    unit = (
        "#ifndef __CUDA_NO_HALF_OPERATORS__\n#error compiled unlike torch compiles it\n#endif\n"
        "__global__ void k(float* x) { x[0] = 1.0f; }\n"
    )
    compiled = _one_unit_checked(
        workspace, fixtures, build_python, tmp_path, "halfops", "CUDAExtension", "csrc/k.cu", unit
    )
    assert (compiled.unit, compiled.kind, compiled.missing) == ("csrc/k.cu", "CUDA", None)
    assert "-D__CUDA_NO_HALF_OPERATORS__" in compiled.command


def test_install_requires_bound_to_a_name_first_is_read(tmp_path: Path) -> None:
    """rusty1s/pytorch_cluster: ``install_requires = ['scipy']`` at the top, then
    ``setup(install_requires=install_requires)``: read as the literal it is (the build
    was refused for scipy, which add had not listed); a name bound twice is not guessed."""
    from kiln.verbs.add import scan

    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\n"
        "install_requires = [\n    'scipy',\n]\n"
        "setup(name='c', install_requires=install_requires)\n"
    )
    requires = scan.runtime_requires(tmp_path, [pysetup.read(tmp_path, "setup.py")])
    assert requires == [("scipy", "setup.py:2: `install_requires = [`")]
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\nreqs = ['a']\nreqs = ['b']\nsetup(install_requires=reqs)\n"
    )
    assert scan.runtime_requires(tmp_path, [pysetup.read(tmp_path, "setup.py")]) == []
