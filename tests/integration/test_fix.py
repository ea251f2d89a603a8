"""``kiln build --fix`` (issue 41): the fixes a failed build printed that are mechanical
are applied as the structured edits they are (shown as diffs) and the build runs again,
to a release: on real fixture upstreams, each failing one way, no edit by hand.

- cxx20-code (tests/broken.py): C++20 code under a hard-coded -std=c++17: the
  cxx-standard row's nvcc_append_flags;
- needs-gpu (tests/landing.py): an extension whose import needs a GPU: the needs-gpu row's
  build.import_proof.needs_gpu (the second build compiles nothing: the kept wheel);
- requires-dep (tests/landing.py): a wheel that requires what install.sh would not
  install: the requirements-unmet row's line in runtime-requirements.txt.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path

import tomlkit

from kiln.sources.gitrepo import CommitSpec, make_repo
from tests import broken, landing
from tests.conftest import build_args, run_kiln, shared_cache
from tests.integration.test_import_proof import PROFILE_NO_TORCH, _build
from tests.integration.test_inplace import make_wheel
from tests.workspace import write


def test_fix_applies_the_printed_edits_and_builds_again(tmp_path: Path, build_python: Path) -> None:
    cases = landing.make(tmp_path / "landing")
    faults = broken.make(tmp_path / "broken")
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(
        f'[mirrors]\n"{landing.BASE_URL}" = "{cases.root}/"\n'
        f'"{broken.BASE_URL}" = "{faults.root}/"\n'
    )
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse)
    ws = write(
        tmp_path / "ws",
        {
            "needs-gpu": landing.vendor("needs-gpu", cases.commits["needs-gpu"]),
            "requires-dep": landing.vendor("requires-dep", cases.commits["requires-dep"]),
        },
        profile=PROFILE_NO_TORCH,
    )
    offline_pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    res = _build(tmp_path, ws, mirrors, build_python, "--fix", env=offline_pip)
    err = res.stderr
    assert res.returncode == 0, err[-4000:]
    assert "kiln build --fix: 2 fixes applied; building again" in err, err[-4000:]
    assert '+needs_gpu = ["landing._gpu"]' in err or 'needs_gpu = ["landing._gpu"]' in err
    assert "+kiln_fixture_dep>=1.0" in err
    recipe = tomllib.loads((ws / "vendors" / "needs-gpu.toml").read_text())
    assert recipe["build"]["import_proof"]["needs_gpu"] == ["landing._gpu"]
    assert (ws / "runtime-requirements.txt").read_text() == "kiln_fixture_dep>=1.0\n"
    assert "release ready" in err


def test_fix_applies_a_standard_flag_and_a_download_switch_to_torch_extensions(
    tmp_path: Path, build_python: Path, pypi_cuda: Path
) -> None:
    """cxx20-code, network-download and unknown-arch (tests/broken.py, torch extensions):
    the cxx-standard row's nvcc_append_flags, the network-download row's switch, as the
    upstream's setup.py compares it, and the unknown-arch row's nvcc_drop_flags for the
    arch the upstream hard-codes (sm_101a, renamed by CUDA 13), applied; all build on the
    second run."""
    faults = broken.make(tmp_path / "broken")
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(f'[mirrors]\n"{broken.BASE_URL}" = "{faults.root}/"\n')
    names = ("cxx20-code", "network-download", "unknown-arch")
    ws = write(tmp_path / "ws", {n: broken.vendor(n, faults.commits[n]) for n in names})
    shared_cache(tmp_path / "cache")
    res = run_kiln(
        *build_args(ws, tmp_path, "--fix", mirrors=mirrors, python=build_python, toolchain="pypi")
    )
    err = res.stderr
    assert res.returncode == 0, err[-4000:]
    assert "kiln build --fix: 3 fixes applied; building again" in err, err[-4000:]
    cxx = tomllib.loads((ws / "vendors" / "cxx20-code.toml").read_text())["build"]
    assert cxx["nvcc_append_flags"] == ["-std=c++20"]
    net = tomllib.loads((ws / "vendors" / "network-download.toml").read_text())["build"]
    assert net["env"]["BROKEN_FORCE_BUILD"] != "1", net
    arch = tomllib.loads((ws / "vendors" / "unknown-arch.toml").read_text())["build"]
    assert arch["nvcc_drop_flags"] == ["-gencode=arch=compute_101a,code=sm_101a"]
    assert "release ready" in err


def test_an_arch_table_that_drops_an_arch_is_fixed_as_printed(
    tmp_path: Path, build_python: Path, pypi_cuda: Path
) -> None:
    """arch-dropped (tests/broken.py): setup.py maps TORCH_CUDA_ARCH_LIST through a table
    with no 10.3a. Its table's target is arch-specific (sm_100a), so the rewrite the row
    used to offer stopped the unit as arch-uncovered (a second failure): the fix now says
    so, and its patch (an entry for 10.3a), applied as printed, releases both archs. A
    table of generic targets (sm_100) is offered the rewrite, and applied, it releases."""
    faults = broken.make(tmp_path / "broken")
    generic = broken.ARCH_TABLE_SETUP.replace('"10.0a": "100a"', '"10.0a": "100"')
    (sha,) = make_repo(
        faults.root / "generic-table.git",
        [
            CommitSpec(
                "a table of generic targets",
                {
                    "setup.py": generic,
                    "broken/__init__.py": "",
                    "csrc/binding.cpp": broken.BINDING,
                    "csrc/k.cu": "__global__ void k() {}\n",
                    "LICENSE": "MIT License\n\nCopyright (c) 2026 kiln test fixtures\n",
                },
            )
        ],
    )
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(f'[mirrors]\n"{broken.BASE_URL}" = "{faults.root}/"\n')
    shared_cache(tmp_path / "cache")
    recipe = broken.vendor("arch-dropped", faults.commits["arch-dropped"])
    ws = write(tmp_path / "ws", {"arch-dropped": recipe})
    args = build_args(ws, tmp_path, mirrors=mirrors, python=build_python, toolchain="pypi")
    res = run_kiln(*args)
    assert res.returncode == 6, res.stderr[-3000:]
    (fix,) = [ln for ln in res.stderr.splitlines() if ln.startswith("  fix: ")]
    assert fix.startswith("  fix: give the upstream's table (setup.py:6) an entry for 10.3a")
    assert 'arch_control = "rewrite" would not do: sm_100a covers itself alone' in fix
    # the patch it asks for, as printed: an entry for 10.3a in the table at setup.py:6
    table = broken.ARCH_TABLE_SETUP.splitlines(keepends=True)
    assert "TARGETS = " in table[5]
    patched = [*table[:5], table[5].replace("}", ', "10.3a": "103a"}'), *table[6:]]
    patch = "".join(difflib.unified_diff(table, patched, "a/setup.py", "b/setup.py"))
    (ws / "patches" / "table-103a.patch").write_text(patch)
    (ws / "patches" / "series.toml").write_text(
        '[[patch]]\nfile = "table-103a.patch"\ntarget = "arch-dropped"\n'
    )
    res = run_kiln(*args)
    assert res.returncode == 0, res.stderr[-3000:]
    # generic targets: the rewrite is offered, and set as printed, it releases
    recipe = {**recipe, "source": {"url": f"{broken.BASE_URL}generic-table.git", "commit": sha}}
    ws = write(tmp_path / "ws-generic", {"generic-table": recipe})
    args = build_args(ws, tmp_path, mirrors=mirrors, python=build_python, toolchain="pypi")
    res = run_kiln(*args)
    assert res.returncode == 6, res.stderr[-3000:]
    (fix,) = [ln for ln in res.stderr.splitlines() if ln.startswith("  fix: ")]
    assert (
        'or let kiln set every unit\'s archs: arch_control = "rewrite" in '
        "vendors/generic-table.toml"
    ) in fix
    doc = tomllib.loads((ws / "vendors" / "generic-table.toml").read_text())
    doc["build"]["arch_control"] = "rewrite"
    (ws / "vendors" / "generic-table.toml").write_text(tomlkit.dumps(doc))
    res = run_kiln(*args)
    assert res.returncode == 0, res.stderr[-3000:]


def test_fix_pins_a_setup_import_in_the_vendors_build_tools_once_the_index_has_it(
    tmp_path: Path, build_python: Path
) -> None:
    """setup-import (tests/landing.py ``setup-helper``): not --offline, the fix's dry
    resolve finds kiln_setup_helper 1.0 on the index (a local wheelhouse, pip's own
    configuration), which makes the fix mechanical: ``--fix`` appends the pin to the
    vendor's build.build_tools and the build runs again, to a release."""
    cases, ws, wheelhouse = landing.setup_helper_workspace(tmp_path, PROFILE_NO_TORCH)
    index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse), "PIP_CONFIG_FILE": "/dev/null"}
    args = build_args(
        ws,
        tmp_path,
        *("--cuda-home", "/usr/local/cuda", "--no-compiler-cache", "--fix"),
        mirrors=cases.root / "mirrors.toml",
        offline=False,
        toolchain="system",
        python=build_python,
        cache=shared_cache(tmp_path / "cache"),
    )
    res = run_kiln(*args, env=index)
    err = res.stderr
    assert res.returncode == 0, err[-4000:]
    assert 'the profile\'s index has kiln_setup_helper 1.0: "kiln_setup_helper==1.0"' in err
    assert "kiln build --fix: 1 fix applied; building again" in err, err[-4000:]
    recipe = tomllib.loads((ws / "vendors" / "setup-helper.toml").read_text())
    assert recipe["build"]["build_tools"] == ["kiln_setup_helper==1.0"]
    assert "release ready" in err
