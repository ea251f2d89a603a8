"""Failed builds explain themselves on the first screen (issue 21): every row of kiln's
cause table (kiln/inside/causes/) produced for real through ``kiln build``, from
fixture upstreams that fail one way each (tests/broken.py), and the public DeepEP built
without its ``[[build.system]]`` entry where ``infiniband/mlx5dv.h`` is absent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from kiln.config.workspace import Workspace
from kiln.inside.causes.cause import Diagnosis
from kiln.plan import schedule
from tests import broken, fleet, landing, public, require
from tests.conftest import REPO, artifacts_files, build_args, run_kiln, shared_cache
from tests.upstreams import Upstreams
from tests.workspace import plain_vendor, write

# fault -> the lines the user must see for it: the unit, its first error, cause and fix.
SEEN: dict[str, list[str]] = {
    "missing-header": [
        "building missing-header failed with exit code 6, in csrc/topo.cu:",
        "    csrc/topo.h:2: fatal error: hwloc.h: No such file or directory",
        "  cause: the header hwloc.h is not installed where the build ran "
        "(included from csrc/topo.h:2)",
        "  fix: apt-get install libhwloc-dev (Debian/Ubuntu, or in the builder image); declare "
        "it in vendors/missing-header.toml so preflight checks it before the next build:\n"
        '      [[build.system]]\n      header = "hwloc.h"\n      package = "libhwloc-dev"\n',
    ],
    "missing-identifier": [
        "building missing-identifier failed with exit code 6, in csrc/comm.cu:",
        '    csrc/comm.cu:3: error: identifier "ncclKilnFutureProperties" is undefined',
        "  cause: NCCL's headers here do not declare ncclKilnFutureProperties, "
        "ncclKilnFutureQuery: nccl.h resolved to ",
        "/site-packages/nvidia/nccl/include/nccl.h (NCCL 2.30.7, from nvidia-nccl-cu13 "
        "2.30.7); this revision likely needs a newer NCCL",
        # issue 35: a newer NCCL beside torch 2.14.1 is ResolutionImpossible: not advised
        "  fix: torch 2.14.1 pins nvidia-nccl-cu13==2.30.7, so no newer nvidia-nccl-cu13 "
        "can be installed beside it (a newer pin in build_tools ends in ResolutionImpossible): "
        "build with a torch that pins a newer nvidia-nccl-cu13",
        # ... resolved before it is printed (dry), or with the command that would (offline)
        "(vendors/missing-identifier.toml source.commit); not resolved (--offline); to find "
        "one: pip install --dry-run 'torch>2.14.1' 'nvidia-nccl-cu13>2.30.7'",
    ],
    "cxx-standard": [
        "building cxx-standard failed with exit code 6, in csrc/ops.cpp:",
        # the header's real path (issue 35: what a user copies must exist)
        "/site-packages/torch/include/torch/csrc/api/include/torch/all.h:5: error: #error "
        "C++20 or later compatible compiler is required to use PyTorch.",
        "it needs C++20 or later (the upstream hard-codes an older -std)",
        '  fix: add build.cxx_append_flags = ["-std=c++20"] (C++ units)',
    ],
    "unknown-arch": [
        "building unknown-arch failed with exit code 6, in csrc/k.cu:",
        "    nvcc fatal: Unsupported gpu architecture 'compute_101a'",
        "  cause: this build's nvcc (CUDA 13.2) does not know sm_101a: sm_101a is known to "
        "CUDA 12.8 to 12.9 (CUDA 13.0 renamed it sm_110a)",
        "set the profile's cuda (and builder image) to a CUDA that has sm_101a, or drop "
        "sm_101a from the archs",
        # issue 41: the upstream's own flag, named as the edit --fix applies
        "  fix: the upstream hard-codes -gencode=arch=compute_101a,code=sm_101a: add "
        'build.nvcc_drop_flags = ["-gencode=arch=compute_101a,code=sm_101a"] to '
        "vendors/unknown-arch.toml",
    ],
    "arch-refused": [
        "building arch-refused failed with exit code 6, in csrc/hopper.cu:",
        "    csrc/hopper.cu: written for sm_90a only, none of the archs this build makes "
        "(sm_100a): kiln compiles no unit for an arch it was not written for; leave it out",
        '  cause: kiln\'s arch rewrite (arch_control = "rewrite") compiles a unit only for '
        "the archs its own flags cover, and csrc/hopper.cu's (sm_90a) cover none of sm_100a",
        "  fix: where csrc/hopper.cu's code is valid on sm_100a, drop its own arch flags so "
        "the rewrite gives it the build's archs: build.nvcc_drop_flags = "
        '["-gencode=arch=compute_90a,code=sm_90a"] in vendors/arch-refused.toml',
        "else leave csrc/hopper.cu out of this build with the upstream's own switch "
        '(arch_control = "toggles" with build.arch_toggles in vendors/arch-refused.toml) or a '
        "patch",
    ],
    "missing-library": [
        "building missing-library failed with exit code 6, in the link of build/lib.",
        "    cannot find -lkilnabsent: No such file or directory",
        "  cause: the linker found no -lkilnabsent: it looked in LIBRARY_PATH and -L ",
        "or add its folder to build.env LIBRARY_PATH in vendors/missing-library.toml (kiln "
        "links it from there and ships it in the wheel, which would not load without it); "
        "declare it in "
        "vendors/missing-library.toml so preflight checks it before the next build:\n"
        '      [[build.system]]\n      library = "kilnabsent"\n      package = "PACKAGE"\n',
    ],
    # issue 35: an arch the recipe asks for, dropped by the upstream's own table: stopped
    # at the first compile, with where the upstream chose its targets
    "arch-dropped": [
        "building arch-dropped failed with exit code 6, in csrc/k.cu:",
        "    csrc/k.cu: compiled for sm_100a only, not for sm_103a of the recipe's archs "
        "(sm_100a, sm_103a)",
        '  cause: kiln set TORCH_CUDA_ARCH_LIST=10.0a;10.3a (arch_control = "torch-arch-list") '
        "and the upstream asked nvcc for sm_100a only for csrc/k.cu: it maps the list through "
        "targets of its own and leaves 10.3a out (its arch table: setup.py:6)",
        "  fix: give the upstream's table (setup.py:6) an entry for 10.3a (a patch in "
        'patches/) (arch_control = "rewrite" would not do: sm_100a covers itself alone, so '
        "the rewrite stops the unit as arch-uncovered), or leave sm_103a out of build.archs",
    ],
    # issue 35: ptxas refuses an instruction: the unit, its arch, which archs have it, and
    # its PTX kept beside the logs (not in a folder deleted with the compile)
    "ptx-instruction": [
        "building ptx-instruction failed with exit code 6, in csrc/hopper.cu:",
        "error: Instruction 'wgmma.fence' not supported on .target 'sm_100a'",
        "  cause: csrc/hopper.cu was compiled for sm_100a, and its device code uses "
        "wgmma.fence, which exists on sm_90a only (Hopper's warpgroup MMA; SM100 has tcgen05 "
        "instead) (its PTX, kept: ",
        "/artifacts/logs/test-release/ptx-instruction-ptx/csrc_hopper.cu/hopper.ptx:",
        "  fix: compile csrc/hopper.cu only for archs that have wgmma.fence: the upstream's "
        "arch guard",
        # issue 41: no arch of the build has it: leaving sm_100a out is no fix
        "no arch this build makes (sm_100a) has wgmma.fence: leaving sm_100a out of "
        "build.archs does not help",
    ],
    # issue 35: the build reaches for the network; the switch that stops it, as compared
    "network-download": [
        "  cause: the upstream's build tried to download "
        "https://downloads.invalid/broken/broken-0.1.0-cp311-linux.whl (setup.py:10), and "
        "builds are offline",
        '  fix: vendors/network-download.toml sets BROKEN_FORCE_BUILD = "1", but setup.py:7 '
        'compares it with != "TRUE": set BROKEN_FORCE_BUILD = "TRUE" in [build.env] of '
        "vendors/network-download.toml",
    ],
    # issue 35: the upstream's own C++20 code under its -std=c++17 (nvcc's words)
    "cxx20-code": [
        "building cxx20-code failed with exit code 6, in csrc/ops.cu:",
        '    csrc/ops.cu:2: error: identifier "concept" is undefined',
        "  cause: the upstream's own code is C++20 (concept at csrc/ops.cu:2) and this unit "
        "was compiled with an older -std (the upstream hard-codes it)",
        '  fix: add build.nvcc_append_flags = ["-std=c++20"] to vendors/cxx20-code.toml '
        "(csrc/ops.cu is compiled by nvcc)",
    ],
    # issue 35: setup.py imports what the build venv lacks, at its line
    "setup-import": [
        "  cause: setup.py:4 imports pybind11, which the build venv does not have",
        '  fix: add "pybind11==VERSION" (its version pinned) to build.build_tools in '
        "vendors/setup-import.toml (installed for this vendor's build alone), e.g. "
        'build_tools = ["pybind11==VERSION"]; or to the profile\'s build_tools in kiln.toml',
    ],
}


def _kiln_build(
    ws: Path, tmp: Path, mirrors: Path, python: Path, *extra: str, env: dict | None = None
):
    return run_kiln(
        *build_args(ws, tmp, *extra, mirrors=mirrors, python=python, toolchain="pypi"), env=env
    )


def test_every_cause_row_fails_for_real_and_is_explained_on_the_first_screen(
    tmp_path: Path, upstreams: Upstreams, build_python: Path, pypi_cuda: Path
) -> None:
    """Six fixture upstreams, each failing one way, and one that builds, in one run: the
    failures do not stop each other or the good one; each is shown with its unit, first
    error, cause and fix; the good one is kept and the rerun reuses it."""
    fixtures = broken.make(tmp_path / "broken")
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(
        f'[mirrors]\n"{broken.BASE_URL}" = "{fixtures.root}/"\n'
        f'"https://fixtures.invalid/" = "{upstreams.root}/"\n'
    )
    vendors = {f: broken.vendor(f, c) for f, c in fixtures.commits.items()}
    vendors["plain"] = plain_vendor(upstreams.plain[0], archs=[])
    ws = write(tmp_path / "ws", vendors)
    shared_cache(tmp_path / "cache")  # the session's CUDA 13.2 and probed facts

    summary = tmp_path / "step-summary.md"
    actions = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    res = _kiln_build(ws, tmp_path, mirrors, build_python, env=actions)
    assert res.returncode == 6, res.stderr[-3000:]
    error = res.stderr[res.stderr.rindex("kiln: error: ") :]
    for fault, lines in SEEN.items():
        for line in lines:
            assert line in error, f"{fault}: {line!r} not on screen:\n{error}"
        record = json.loads(
            (tmp_path / f"artifacts/logs/test-release/{fault}.failure.json").read_text()
        )
        assert record["cause"]["row"] == broken.row(fault), record
        assert record["log"].endswith(f"{fault}-build.log") and Path(record["log"]).is_file()
        assert f"  full log: {record['log']}" in error  # whole, never cut
    # the summary table names each failure's first error, with its row
    start = res.stderr.index("kiln build summary")
    table = res.stderr[start : res.stderr.index("kiln: error:", start)]
    for fault in SEEN:
        assert f"[{broken.row(fault)}]" in table.replace("\n", "").replace("│", ""), table
    kept = tmp_path / "artifacts/logs/test-release/ptx-instruction-ptx/csrc_hopper.cu/hopper.ptx"
    assert "wgmma.fence" in kept.read_text()  # the PTX ptxas refused, kept for the user
    # no fix that cannot work: torch pins this NCCL (a newer one is ResolutionImpossible)
    assert '"nvidia-nccl-cu13>2.30.7"]' not in error  # never as a build_tools pin
    # never the build backend's traceback as the summary
    assert "Error compiling objects for extension" not in error
    assert "Traceback" not in error
    assert (
        "kept, verified, in the artifact cache: plain; the rerun after the fix rebuilds only"
        in (error)
    )
    assert artifacts_files(tmp_path / "artifacts") == []
    # GitHub Actions: an annotation on the first error's line, the explanation in the summary
    assert (
        "::error file=csrc/topo.h,line=2,title=kiln%3A building missing-header failed::"
        "csrc/topo.h:2: fatal error: hwloc.h: No such file or directory%0Acause: the header"
    ) in res.stdout, res.stdout
    assert (
        "::error file=csrc/comm.cu,line=3,title=kiln%3A building missing-identifier" in res.stdout
    )
    # each step's output folded under its name (the log whole, before the summary)
    folded = "::group::kiln: missing-header: build (missing-header-build.log)\n"
    assert folded in res.stderr[:start], res.stderr[:3000]
    group = res.stderr[res.stderr.index(folded) :]
    assert "hwloc.h: No such file or directory" in group[: group.index("::endgroup::\n")]
    markdown = summary.read_text()
    assert "| step | runner | cache | state | time | peak memory | result |" in markdown
    assert "  fix: apt-get install libhwloc-dev" in markdown

    again = _kiln_build(ws, tmp_path, mirrors, build_python, "plain")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "plain: cached (artifact cache" in again.stderr


def test_without_a_terminal_the_first_screen_is_the_diagnosis(
    tmp_path: Path, build_python: Path, pypi_cuda: Path
) -> None:
    """Issue 35: one vendor, no terminal (CI): setuptools' traceback stays in the log; the
    console has kiln's lines and the diagnosis. With -v the step's output streams too."""
    fixtures = broken.make(tmp_path / "broken")
    fault = "missing-header"
    ws = write(tmp_path / "ws", {fault: broken.vendor(fault, fixtures.commits[fault])})
    shared_cache(tmp_path / "cache")
    res = _kiln_build(ws, tmp_path, fixtures.mirrors, build_python)
    assert res.returncode == 6, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Error compiling objects" not in res.stderr
    assert "    csrc/topo.h:2: fatal error: hwloc.h: No such file or directory" in res.stderr
    log = tmp_path / "artifacts/logs/test-release/missing-header-build.log"
    assert "Traceback" in log.read_text()  # the raw output: in the log, whole
    verbose = _kiln_build(ws, tmp_path, fixtures.mirrors, build_python, "-v")
    assert verbose.returncode == 6 and "Traceback" in verbose.stderr


DEEP_H = """\
#pragma once
template <typename T> int leaf(T t) { return t.missing(); }
template <int N, typename T> struct Deep { static int f(T t) { return Deep<N - 1, T>::f(t); } };
template <typename T> struct Deep<0, T> { static int f(T t) { return leaf(t); } };
"""


@pytest.mark.parametrize("compiler", ["g++", "nvcc"])
def test_a_deep_template_error_shows_its_chain_to_the_upstreams_code(
    tmp_path: Path, compiler: str
) -> None:
    """Issue 35: an error twelve instantiations deep: its first error with the chain that
    leads to the upstream's own call (g++'s "required from", nvcc's "detected during"),
    cut to the screen, not the innermost line alone."""
    from kiln.inside import diagnose
    from kiln.orchestrate import failure

    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "deep.h").write_text(DEEP_H)
    unit = "csrc/ops.cu" if compiler == "nvcc" else "csrc/ops.cpp"
    (tmp_path / unit).write_text('#include "deep.h"\nint run() { return Deep<12, int>::f(1); }\n')
    tool = "/usr/local/cuda/bin/nvcc" if compiler == "nvcc" else "g++"
    res = subprocess.run(
        [tool, "-c", unit, "-o", "ops.o"], cwd=tmp_path, capture_output=True, text=True
    )
    assert res.returncode != 0
    d = diagnose.first_errors(res.stdout + res.stderr, tmp_path)
    first = d.errors[0]
    assert first.file == "csrc/deep.h" and first.line == 2
    # cut: the instantiation that failed, a count of those left out, the last ones
    assert len(first.chain) <= diagnose.CHAIN_SHOWN + 1
    assert "leaf(T)" in first.chain[0]
    if compiler == "nvcc":  # 14 instantiations (nvcc hides 4 itself): 10 counted, not shown
        assert first.chain[1] == "... (10 more instantiations)"
    assert first.chain[-1].endswith(f"at {unit}:2")  # the upstream's own call
    screen = failure.render(
        {"errors": Diagnosis(errors=d.errors).to_json()["errors"]},
        tmp_path / "x.log",
        "building x failed",
    )
    lines = screen.splitlines()
    assert lines[1].startswith("    csrc/deep.h:2: error: ")
    shown = lines[2 : 2 + len(first.chain)]
    assert all(ln.startswith("      ") for ln in shown) and shown[-1].endswith(f"at {unit}:2")


def test_an_undefined_symbol_names_its_library(tmp_path: Path) -> None:
    """The link row for a symbol no library on the link defines, read from g++'s own output
    (a real link of a program calling NCCL without -lnccl)."""
    from kiln.inside import diagnose

    src = tmp_path / "main.cpp"
    src.write_text(
        'extern "C" int ncclGetVersion(int*);\nint main() { int v; return ncclGetVersion(&v); }\n'
    )
    cmd = [
        "g++",
        "-shared",
        "-Wl,--no-undefined",
        "-fPIC",
        str(src),
        "-o",
        str(tmp_path / "m.so"),
        "-lm",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode != 0
    d = diagnose.diagnose(" ".join(cmd) + "\n" + res.stderr, tmp_path, {}, "v")
    assert d.unit == "the link of m.so"
    assert d.errors[0].message == "undefined reference to `ncclGetVersion'"
    assert d.cause is not None and d.cause.row == "undefined-symbol"
    assert "defined in libnccl (-lnccl); the link named -lm" in d.cause.cause


def test_an_undefined_symbols_printed_fix_links_and_loads_in_one_round(tmp_path: Path) -> None:
    """undefined-symbol's fix applied as printed (issue 41 (2)): an extension's link
    (``-Wl,--no-undefined``) calls kiln_scale, which libkilnops.so.1 defines, a library
    another distribution ships in site-packages (as nvidia-cublas ships libcublas.so.13),
    in a folder the link searches (-L) but does not name. The row finds the definer with
    nm and prints the link and the RUNPATH to where it lands, together: relinked as
    printed, the extension links and loads from site-packages (the link alone would
    not load: the loader searches no site-packages)."""
    from kiln.inside import diagnose
    from tests.landing import OPS_CPP, OPS_H

    site = tmp_path / "site-packages"
    libdir = site / "kilnops" / "lib"
    libdir.mkdir(parents=True)
    (tmp_path / "ops.h").write_text(OPS_H)
    (tmp_path / "ops.cpp").write_text(OPS_CPP)
    subprocess.run(
        [
            *("g++", "-shared", "-fPIC", f"-I{tmp_path}", str(tmp_path / "ops.cpp")),
            *("-o", str(libdir / "libkilnops.so.1"), "-Wl,-soname,libkilnops.so.1"),
        ],
        check=True,
    )
    (libdir / "libkilnops.so").symlink_to("libkilnops.so.1")
    tree = tmp_path / "tree"
    (tree / "csrc").mkdir(parents=True)
    (tree / "csrc" / "use.cpp").write_text(
        '#include "ops.h"\nextern "C" int kiln_use(int x) { return kiln_scale(x) + 1; }\n'
    )
    (tree / "csrc" / "ops.h").write_text(OPS_H)
    out = "build/lib.linux-x86_64-cpython-311/pkg/libkilnuse.so"
    (tree / out).parent.mkdir(parents=True)

    def link(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = ["g++", "-shared", "-fPIC", "-Wl,--no-undefined", "csrc/use.cpp", "-o", out]
        cmd += [f"-L{libdir}", *extra]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tree)
        res.args = " ".join(cmd)
        return res

    res = link()
    assert res.returncode != 0
    d = diagnose.diagnose(f"{res.args}\n{res.stderr}", tree, {}, "v")
    assert d.cause is not None and d.cause.row == "undefined-symbol", d
    assert f"defined in libkilnops.so ({libdir})" in d.cause.cause, d.cause.cause
    fix = d.cause.fix
    assert fix.startswith(
        "link it and let the loader find it where it lands, in one patch (patches/): add "
        "'kilnops' to the extension's libraries in setup.py (-lkilnops) and "
        "'-Wl,-rpath,$ORIGIN/../kilnops/lib' to its extra_link_args"
    ), fix
    name, link_arg = landing.printed_link(fix)

    def load(so: Path) -> subprocess.CompletedProcess[str]:
        """The extension where it lands (site-packages/pkg), loaded with every symbol bound."""
        landed = site / "pkg" / so.name
        landed.parent.mkdir(exist_ok=True)
        landed.write_bytes(so.read_bytes())
        code = f"import ctypes; print(ctypes.CDLL({str(landed)!r}).kiln_use(2))"
        env = {"LD_BIND_NOW": "1", "PATH": "/usr/bin:/bin"}
        return subprocess.run(
            [sys.executable, "-I", "-c", code], capture_output=True, text=True, env=env
        )

    assert link(f"-l{name}").returncode == 0  # the link alone links ...
    alone = load(tree / out)
    assert alone.returncode != 0 and "libkilnops.so.1: cannot open shared object" in alone.stderr
    fixed = link(f"-l{name}", link_arg)  # ... the printed fix links and loads
    assert fixed.returncode == 0, fixed.stderr
    loaded = load(tree / out)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "5", loaded.stderr


def test_a_compile_into_a_full_disk_is_named(tmp_path: Path) -> None:
    """The disk-full row, from nvcc's host compiler writing into a 64 KiB tmpfs (root)."""
    from kiln.inside import diagnose

    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)]).returncode:
        require.missing("ROOT", "cannot mount a tmpfs here (not root)")
    try:
        (full / "filler").write_bytes(b"\0" * 60 * 1024)
        src = tmp_path / "big.cpp"
        src.write_text("".join(f"int f{i}() {{ return {i}; }}\n" for i in range(4000)))
        res = subprocess.run(
            ["g++", "-c", str(src), "-o", str(full / "big.o")], capture_output=True, text=True
        )
        assert res.returncode != 0
        d = diagnose.diagnose(res.stderr, full, {}, "v")
        assert d.cause is not None and d.cause.row == "disk-full", (res.stderr, d)
        assert "MiB free" in d.cause.cause
        # the printed fix applied: the file system made larger (as a larger disk would
        # be), the same compile reruns and writes its object there
        assert d.cause.fix.startswith("free space there (or point --work/--cache at a larger")
        subprocess.run(["mount", "-o", "remount,size=4m", str(full)], check=True)
        again = subprocess.run(
            ["g++", "-c", str(src), "-o", str(full / "big.o")], capture_output=True, text=True
        )
        assert again.returncode == 0, again.stderr
    finally:
        subprocess.run(["umount", str(full)])


def test_public_deepep_without_its_system_entry_shows_the_header_and_package(
    tmp_path: Path, public_python: Path
) -> None:
    """The public DeepEP from its bundle, its ``[[build.system]]`` entry removed, on a
    machine without ``infiniband/mlx5dv.h`` (bubblewrap hides /usr/include/infiniband
    from the whole build): the first screen names the header, the package and the
    entry to add."""
    bwrap = fleet.need("bwrap")
    mirrors = public.mirrors(tmp_path / "mirrors")
    ws = public.copy_workspace(tmp_path / "ws")
    doc = tomlkit.parse((ws / "vendors" / "deepep.toml").read_text())
    del doc["build"]["system"]
    (ws / "vendors" / "deepep.toml").write_text(tomlkit.dumps(doc))
    # The committed learned data, kept for the recipe without its entry (the same units):
    # the longest learned unit, internode.cu, which reaches the hidden header, goes first,
    # so the step stops within seconds (by the first build's estimate python_api.cpp went
    # first, a 2-3 minute compile the failure then threw away).
    relearned = json.loads((ws / "learned.json").read_text())
    edited = Workspace(ws, "sm100").vendors["deepep"]
    relearned["vendors"]["deepep"]["recipe"] = schedule.recipe_fingerprint(edited)
    (ws / "learned.json").write_text(json.dumps(relearned))
    hidden = [bwrap, "--dev-bind", "/", "/", "--tmpfs", "/usr/include/infiniband", "--"]
    res = subprocess.run(
        [
            *hidden,
            sys.executable,
            *("-m", "kiln"),
            *build_args(
                ws,
                tmp_path,
                *("--profile", "sm100", "deepep"),
                mirrors=mirrors,
                python=public_python,
                cache=shared_cache(tmp_path / "cache"),
            ),
            # One compile at a time: internode.cu first (above), so the step stops within
            # seconds; with two, ninja lets python_api.cpp (2-3 minutes here) finish
            # after the failure before it stops.
            *("--jobs", "1"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 6, res.stderr[-3000:]
    # one vendor: its build streams to the console; the last screen is the summary + error
    screen = res.stderr[res.stderr.rindex("kiln build summary") :]
    assert "fatal error: infiniband/mlx5dv.h: No such file or directory" in screen, screen
    assert "cause: the header infiniband/mlx5dv.h is not installed where the build ran" in screen
    assert "fix: apt-get install libibverbs-dev" in screen
    assert (
        '      [[build.system]]\n      header = "infiniband/mlx5dv.h"\n'
        '      package = "libibverbs-dev"'
    ) in screen
    assert "building deepep failed with exit code 6, in csrc/" in screen
    assert len(screen.splitlines()) <= 24, screen  # the first screen
    assert artifacts_files(tmp_path / "artifacts") == []
