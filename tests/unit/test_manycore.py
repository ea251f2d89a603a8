"""Defaults for many cores (issue 24): nvcc's threads per unit from its device targets,
what a unit reserves at the compile gate (its own or its family's learned memory, per
thread), and the kit's ``ninja`` that starts learned units longest first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.inside.kit import compilegate, ninjaorder, objcache, unitsize
from kiln.orchestrate.kit import install_kit
from kiln.plan import schedule
from kiln.plan.jobs import JobLine
from tests.unit.test_schedule import _vendor

GENCODE_90 = ["-gencode", "arch=compute_90a,code=sm_90a"]
GENCODE_100 = ["-gencode=arch=compute_100f,code=sm_100f"]


@pytest.mark.parametrize(
    ("args", "written", "threads"),
    [
        # two targets: two threads, as asked
        ([*GENCODE_90, *GENCODE_100, "--threads", "2"], None, 2),
        # one target: a second thread would idle (and reserve a CPU slot and memory)
        ([*GENCODE_90, "--threads", "2"], [*GENCODE_90, "--threads", "1"], 1),
        (["-arch=sm_90a", "--threads=4"], ["-arch=sm_90a", "--threads=1"], 1),
        # 0: nvcc's "as many as it likes" becomes the unit's targets
        ([*GENCODE_90, *GENCODE_100, "-t", "0"], [*GENCODE_90, *GENCODE_100, "-t", "2"], 2),
        # the same target twice is one
        (
            [*GENCODE_90, *GENCODE_90, "--threads", "2"],
            [*GENCODE_90, *GENCODE_90, "--threads", "1"],
            1,
        ),
        (
            ["-arch=compute_90", "-code=sm_90,sm_90a", "-t=8"],
            ["-arch=compute_90", "-code=sm_90,sm_90a", "-t=2"],
            2,
        ),
        # no --threads: nvcc's one
        ([*GENCODE_90, *GENCODE_100], None, 1),
        # nvcc picks the targets itself: left as asked
        (["-arch=all", "--threads", "3"], None, 3),
    ],
)
def test_nvcc_threads_per_unit_follow_its_device_targets(
    args: list[str], written: list[str] | None, threads: int
) -> None:
    out, got = objcache.unit_threads(["-c", "k.cu", "-o", "k.o", *args])
    assert got == threads
    assert out == ["-c", "k.cu", "-o", "k.o", *(written or args)]


FAKE_NVCC = """#!/bin/sh
# prints what the gate holds for this compile and the arguments it got
cat "$KILN_GATE_DIR"/holders/*.json > "$REPORT"
printf '%s\\n' "$@" >> "$REPORT.args"
"""


@pytest.mark.parametrize(
    ("gencodes", "threads"), [(GENCODE_90, 1), ([*GENCODE_90, *GENCODE_100], 2)]
)
def test_a_unit_reserves_its_threads_and_its_memory_at_the_gate(
    tmp_path: Path, gencodes: list[str], threads: int
) -> None:
    """Through the real wrapper: a one-target unit of a step with NVCC_THREADS=2 runs
    with --threads 1 and holds one CPU slot; a two-target unit two (before, every compile
    of the step held two). Its memory is its own figure, per compile, either way."""
    gate = tmp_path / "gate"
    compilegate.write_budget(gate, mem_gib=100.0, cpus=8)
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    (tmp_path / "k.cu").write_text("")
    hints = tmp_path / "hints.json"
    hints.write_text(json.dumps({"units": {"k.cu": {"cpu_s": 9.0, "mem_gib": 1.5}}}))
    env = {
        **os.environ,
        "KILN_DETERMINISTIC": "0",
        "KILN_GATE_DIR": str(gate),
        "KILN_GATE_HINTS": str(hints),
        "KILN_GATE_MEM_GIB": "4",
        "KILN_OBJCACHE_ROOTS": f"TREE={tmp_path}",
        "KILN_JOB_STATS": str(tmp_path / "jobs"),
        "REPORT": str(tmp_path / "report"),
    }
    argv = [str(nvcc), "-c", "k.cu", "-o", "k.o", *gencodes, "--threads", "2"]
    subprocess.run(
        [sys.executable, str(Path(objcache.__file__)), *argv], cwd=tmp_path, env=env, check=True
    )
    held = json.loads((tmp_path / "report").read_text())
    assert (held["cpus"], held["mem_gib"]) == (threads, 1.5)
    got = (tmp_path / "report.args").read_text().split()
    assert got[got.index("--threads") + 1] == str(threads)
    (line,) = (tmp_path / "jobs").read_text().splitlines()
    assert json.loads(line).get("threads", 1) == threads


def test_a_unit_without_figures_of_its_own_is_planned_from_its_family(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new file beside learned ones reserves what its family (its folder's units of
    its suffix) took, not the step's heaviest unit; elsewhere the recipe's guess, or its
    kind's largest where that is less; a kind nothing was learned of (C++ beside learned
    CUDA units) the recipe's guess."""
    peaks = schedule.PeakStore(tmp_path / "peaks.json")
    v = _vendor()
    unit: JobLine = {"result": "compiled", "rc": 0}
    stats: list[JobLine] = [
        {**unit, "source": "csrc/fmha/bwd.cu", "cpu_s": 170.0, "rss_kib": 9 << 20},
        {**unit, "source": "csrc/decode/a.cu", "cpu_s": 20.0, "rss_kib": 1 << 20},
        {**unit, "source": "csrc/decode/b.cu", "cpu_s": 40.0, "rss_kib": 2 << 20},
    ]
    peaks.remember(v, 9.0, schedule.learned_units(stats))
    hints = tmp_path / "hints.json"
    hints.write_text(json.dumps(schedule.gate_hints(v, peaks)))
    monkeypatch.setenv("KILN_GATE_HINTS", str(hints))
    monkeypatch.setenv("KILN_GATE_MEM_GIB", "9.5")  # the recipe's guess
    monkeypatch.delenv("KILN_JOB_STATS", raising=False)
    assert compilegate.mem_per_compile("csrc/decode/new.cu") == 2.5  # its family's largest
    assert compilegate.hinted_priority("csrc/decode/new.cu") == 30.0  # its family's mean
    assert compilegate.mem_per_compile("csrc/other/new.cu") == 9.5  # the guess: kind's is 11.25
    assert compilegate.mem_per_compile("csrc/fmha/bwd.cu") == 11.25  # its own
    assert compilegate.mem_per_compile("csrc/api/api.cpp") == 9.5  # a kind never seen
    monkeypatch.setenv("KILN_GATE_MEM_GIB", "12")
    assert compilegate.mem_per_compile("csrc/other/new.cu") == 11.25  # its kind's: less


def test_a_first_build_reserves_what_the_units_family_took_in_this_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing learned: a unit reserves the recipe's guess (or the heaviest of its kind
    finished in this build where that is less) until a compile of its family finishes,
    then that family's heaviest, times the margin; failed compiles, cache hits, compiles
    killed for memory, other kinds and compiles sent to build servers teach nothing, and
    learned data still comes first."""
    stats = tmp_path / "step.jobs"
    monkeypatch.setenv("KILN_JOB_STATS", str(stats))
    monkeypatch.setenv("KILN_GATE_MEM_GIB", "9.5")
    monkeypatch.delenv("KILN_GATE_HINTS", raising=False)
    assert compilegate.mem_per_compile("csrc/decode/inst/b.cu") == 9.5  # no file yet
    unit = {"result": "compiled", "rc": 0}
    lines = [
        {**unit, "source": "csrc/decode/inst/fp16.cu", "rc": 1, "rss_kib": 1 << 20},
        {**unit, "source": "csrc/decode/inst/fp32.cu", "result": "oom-killed", "rss_kib": 1},
        {**unit, "source": "csrc/decode/inst/bf16.cu", "result": "cache-hit", "rss_kib": 1},
        {**unit, "source": "csrc/decode/inst/v32.cu", "rss_kib": 3 << 20, "where": "remote"},
        {**unit, "source": "csrc/api.cpp", "rss_kib": 2 << 20},
        {"result": "other", "rc": 0, "source": "", "rss_kib": 5 << 20},
    ]
    stats.write_text("".join(json.dumps(r) + "\n" for r in lines) + "not json\n")
    assert compilegate.mem_per_compile("csrc/decode/inst/b.cu") == 9.5  # no .cu of its own
    assert compilegate.mem_per_compile("csrc/other.cpp") == 2.5  # a .cpp finished

    def finished(source: str, gib: int) -> None:
        stats.write_text(
            stats.read_text() + json.dumps({**unit, "source": source, "rss_kib": gib << 20}) + "\n"
        )

    finished("csrc/fmha/bwd.cu", 8)
    # its kind's heaviest (10) is more than the guess: one outlier is not every unit
    assert compilegate.mem_per_compile("csrc/decode/inst/b.cu") == 9.5
    finished("csrc/decode/inst/a.cu", 2)
    assert compilegate.mem_per_compile("csrc/decode/inst/b.cu") == 2.0 * 1.25  # its family
    assert compilegate.mem_per_compile("csrc/decode/other.cu") == 9.5  # another family
    assert compilegate.IN_BUILD_MARGIN == schedule.LEARNED_MARGIN
    hints = tmp_path / "hints.json"
    hints.write_text(json.dumps({"units": {"csrc/decode/inst/b.cu": {"mem_gib": 4.0}}}))
    monkeypatch.setenv("KILN_GATE_HINTS", str(hints))
    assert compilegate.mem_per_compile("csrc/decode/inst/b.cu") == 4.0  # learned first


BUILD_NINJA = """ninja_required_version = 1.3
rule compile
  command = echo $in >> order.log && touch $out

build obj/a.o: compile src/a.c
build obj/big.o: compile src/big.c
  pool = console
build obj/b.o: compile $
    src/b.c
# a comment inside the run
build obj/c.o: compile src/c.c
build all: phony obj/a.o obj/big.o obj/b.o obj/c.o
late = 1
build obj/d.o: compile src/d.c
build obj/e.o: compile src/e.c
default all obj/d.o obj/e.o
"""


def _hints(tmp_path: Path, cpu: dict[str, float]) -> Path:
    path = tmp_path / "hints.json"
    units = {f"src/{k}": {"cpu_s": s, "mem_gib": 1.0} for k, s in cpu.items()}
    path.write_text(json.dumps({"units": units, "default_cpu_s": 0.0}))
    return path


def test_the_build_file_puts_learned_units_longest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_OBJCACHE_ROOTS", f"TREE={tmp_path}")
    monkeypatch.setenv("KILN_GATE_HINTS", str(_hints(tmp_path, {"big.c": 90, "c.c": 5, "e.c": 3})))
    out = ninjaorder.reorder(BUILD_NINJA, str(tmp_path), str(tmp_path), compilegate.hinted_priority)
    lines = [ln for ln in out.splitlines() if ln.startswith("build ")]
    assert lines == [
        "build obj/big.o: compile src/big.c",  # with its binding (next line)
        "build obj/c.o: compile src/c.c",
        "build obj/a.o: compile src/a.c",
        "build obj/b.o: compile $",  # its continued line travels with it
        "build all: phony obj/a.o obj/big.o obj/b.o obj/c.o",  # not a unit: stays
        "build obj/e.o: compile src/e.c",  # after `late = 1`: a run of its own
        "build obj/d.o: compile src/d.c",
    ]
    assert "build obj/big.o: compile src/big.c\n  pool = console\n" in out
    assert "build obj/b.o: compile $\n    src/b.c\n" in out
    assert out.count("\n") == BUILD_NINJA.count("\n")
    assert sorted(out.splitlines()) == sorted(BUILD_NINJA.splitlines())


@pytest.mark.skipif(shutil.which("ninja") is None, reason="no ninja on PATH")
@pytest.mark.parametrize("case", ["learned", "estimated", "neither"])
def test_kilns_ninja_starts_the_longest_unit_first(tmp_path: Path, case: str) -> None:
    """The kit's ``order/ninja`` before the real one, ``-j1``: with learned figures the
    longest learned unit runs first; with none, the unit reading the most upstream code
    (``unitsize.py``: here big.c, through an include folder the build file names); with
    neither figures nor code to tell units apart (the check can fail), the file's order."""
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "obj").mkdir()
    (tree / "include").mkdir()
    for name in "abcde":
        (tree / "src" / f"{name if name != 'b' else 'big'}.c").write_text("")
    (tree / "src" / "b.c").write_text("")
    if case == "estimated":
        (tree / "include" / "heavy.h").write_text("// template code\n" * 4000)
        (tree / "src" / "big.c").write_text("#include <heavy.h>\n")
        (tree / "src" / "c.c").write_text("int c(void) { return 3; }\n" * 10)
    (tree / "build.ninja").write_text(f"cflags = -I{tree}/include\n" + BUILD_NINJA)
    kit = install_kit(tree)
    env = {
        **os.environ,
        "PATH": f"{kit / 'order'}:{os.environ['PATH']}",
        "KILN_OBJCACHE_PYTHON": sys.executable,
        "KILN_OBJCACHE_ROOTS": f"TREE={tree}",
    }
    if case == "learned":
        env["KILN_GATE_HINTS"] = str(_hints(tmp_path, {"big.c": 90.0, "a.c": 1.0}))
    subprocess.run(["ninja", "-j1", "all"], cwd=tree, env=env, check=True, capture_output=True)
    order = (tree / "order.log").read_text().split()
    assert order[0] == ("src/a.c" if case == "neither" else "src/big.c")
    if case == "estimated":
        assert order[1] == "src/c.c"  # its own code, weighed more than a header's
    # The gate gets the same estimates (compiles reach it in no set order): a first
    # build's units rank by them, a learned build's are left to what it learned.
    kept = tree / compilegate.ESTIMATES
    assert kept.is_file() == (case != "learned")
    if case == "estimated":
        os.environ["KILN_OBJCACHE_ROOTS"] = f"TREE={tree}"
        try:
            ranks = [compilegate.unit_estimate(f"src/{u}.c") for u in ("big", "c", "a")]
            learned = {compilegate.hinted_priority(f"src/{u}.c") for u in ("big", "c", "a")}
        finally:
            del os.environ["KILN_OBJCACHE_ROOTS"]
        assert ranks[0] > ranks[1] > ranks[2] >= 0.0
        assert learned == {0.0}  # the estimate orders a step's own units, not the priority


def test_the_estimate_counts_the_upstreams_code_once_and_nothing_outside_it(
    tmp_path: Path,
) -> None:
    tree, outside = tmp_path / "tree", tmp_path / "torch"
    for folder in (tree / "inc" / "sub", outside):
        folder.mkdir(parents=True)
    (outside / "huge.h").write_text("x" * 100_000)
    (tree / "inc" / "a.h").write_text('#include "sub/b.h"\n#include <huge.h>\n')
    (tree / "inc" / "sub" / "b.h").write_text('#include "../a.h"\nint b;\n')  # a cycle
    (tree / "u.cu").write_text('#  include <a.h>\n#include "missing.h"\n')
    a, b, u = (len((tree / p).read_bytes()) for p in ("inc/a.h", "inc/sub/b.h", "u.cu"))
    build = f"cflags = -I{tree}/inc -isystem {outside}\ncuda_cflags = -I {tree}/inc\n"
    dirs = unitsize.include_dirs(build, str(tree))
    assert dirs == [f"{tree}/inc"]  # once; the folder outside the tree not read
    closure = unitsize.Closure(dirs)
    assert closure.size(str(tree / "u.cu")) == u + a + b
    assert closure.estimate(str(tree / "u.cu")) == u * unitsize.OWN_WEIGHT + a + b
    # With the outside folder allowed (the check can fail), huge.h would count.
    wide = unitsize.Closure([f"{tree}/inc", str(outside)])
    assert wide.size(str(tree / "u.cu")) == u + a + b + 100_000


def test_a_kernel_header_few_units_read_counts_as_their_own_code(tmp_path: Path) -> None:
    """FlashMLA's sm90 dense-decode units (issue 53): 0.2 kB files instantiating a 58 kB
    kernel header only they read, beside a library every unit reads. Counted once, that
    header ranked them below units with larger files of their own; counted as their own
    code they rank first. A header most units read, or a submodule's that few read, is
    counted once (the check can fail: without the rule the order is the other way)."""
    tree = tmp_path / "tree"
    lib = tree / "third-party" / "lib"
    for folder in (tree / "csrc" / "dense", lib):
        folder.mkdir(parents=True)
    (tree / ".gitmodules").write_text('[submodule "lib"]\n\tpath = third-party/lib\n')
    (lib / "big.h").write_text("l" * 1_000_000)  # the library every unit reads
    (lib / "rare.h").write_text("r" * 200_000)  # a library header one unit reads
    (tree / "csrc" / "common.h").write_text("#include <big.h>\n" + "c" * 30_000)
    (tree / "csrc" / "dense" / "kernel.cuh").write_text('#include "../common.h"\n' + "k" * 58_000)
    dense = tree / "csrc" / "dense" / "fp16.cu"
    dense.write_text('#include "kernel.cuh"\ntemplate void run<half>();\n')
    others = []
    for i in range(7):
        unit = tree / "csrc" / f"u{i}.cu"
        unit.write_text('#include "common.h"\n' + "u" * 4_000)
        others.append(str(unit))
    (tree / "csrc" / "u0.cu").write_text('#include "common.h"\n#include <rare.h>\n' + "u" * 4_000)
    assert unitsize.libraries(str(tree)) == [str(lib)]
    closure = unitsize.Closure([str(tree / "csrc"), str(lib)], unitsize.libraries(str(tree)))
    ranks = closure.estimates([str(dense), *others])
    assert max(ranks, key=lambda u: ranks[u]) == str(dense)
    assert (
        ranks[others[0]] - ranks[others[1]]
        == len((tree / "csrc/u0.cu").read_bytes()) * 10
        - (len((tree / "csrc/u1.cu").read_bytes()) * 10)
        + 200_000
    )  # the submodule's header counted once
    alone = {u: closure.estimate(u) for u in [str(dense), *others]}
    assert max(alone, key=lambda u: alone[u]) != str(dense)


def test_torchs_own_headers_count_where_a_unit_includes_them(tmp_path: Path) -> None:
    """FlashMLA's csrc/api/api.cpp reads 0.5 MB of its own code and 14 MB of torch's: it
    took 29 CPU-s, third of 24 units, and ranked last without torch's headers counted."""
    tree, torch_inc = tmp_path / "tree", tmp_path / "site" / "torch" / "include"
    other = tmp_path / "cuda" / "include"
    for folder in (tree, torch_inc / "torch", other):
        folder.mkdir(parents=True)
    (torch_inc / "torch" / "extension.h").write_text("t" * 50_000)
    (other / "cuda_runtime.h").write_text("c" * 70_000)
    (tree / "api.cpp").write_text("#include <torch/extension.h>\n#include <cuda_runtime.h>\n")
    (tree / "k.cu").write_text("#include <cuda_runtime.h>\n" + "k" * 2_000)
    build = f"cflags = -I{torch_inc} -I{other}\n"
    dirs = unitsize.include_dirs(build, str(tree))
    assert dirs == [str(torch_inc)]  # torch's counted, CUDA's (every unit's alike) not
    closure = unitsize.Closure(dirs)
    assert closure.estimate(str(tree / "api.cpp")) > closure.estimate(str(tree / "k.cu"))
    assert unitsize.Closure([]).estimate(str(tree / "api.cpp")) < unitsize.Closure([]).estimate(
        str(tree / "k.cu")
    )  # without torch's headers the order is the other way


def test_the_gate_counts_what_running_compiles_hold_now_and_the_machines_room() -> None:
    """Issue 53 (1): a holder counts for the larger of its reservation and what its
    processes hold now; a waiter also needs the machine's room beside what the holders
    may still grow to; an ``alone`` waiter (killed for memory once) holds back those
    behind it until it can run by itself."""
    budget = {"mem_gib": 10.0, "cpus": 8}
    waiter: compilegate.GateEntry = {"id": "w", "mem_gib": 5.0, "priority": 1.0, "since": 1}
    grown: compilegate.GateEntry = {"id": "h", "mem_gib": 2.0, "live_gib": 6.0}
    assert compilegate.admitted(budget, [grown], [waiter], "w") == (None, 0)  # 6 + 5 > 10
    small: compilegate.GateEntry = {**grown, "live_gib": 1.0}
    assert compilegate.admitted(budget, [small], [waiter], "w") == ("local", 0)  # 2 + 5
    # the machine's room: 6 GiB now, the holder may grow by 3 more, 0.5 kept free
    growing: compilegate.GateEntry = {"id": "h", "mem_gib": 4.0, "live_gib": 1.0}
    three: compilegate.GateEntry = {**waiter, "mem_gib": 3.0}
    two: compilegate.GateEntry = {**waiter, "mem_gib": 2.0}
    assert compilegate.admitted(budget, [growing], [three], "w", room=6.0) == (None, 0)
    assert compilegate.admitted(budget, [growing], [two], "w", room=6.0) == ("local", 0)
    assert compilegate.admitted(budget, [growing], [three], "w", room=None) == ("local", 0)
    # with nothing running, one compile always runs (however little room)
    assert compilegate.admitted(budget, [], [three], "w", room=0.1) == ("local", 0)
    alone: compilegate.GateEntry = {
        "id": "a",
        "mem_gib": 10.0,
        "priority": compilegate.ALONE,
        "since": 2,
        "alone": True,
    }
    assert compilegate.admitted(budget, [small], [alone, two], "a") == (None, 0)
    assert compilegate.admitted(budget, [small], [alone, two], "w") == (None, 1)  # held back
    assert compilegate.admitted(budget, [], [alone, two], "a") == ("local", 0)


def test_a_holder_reports_its_process_tree_to_the_gate(tmp_path: Path) -> None:
    """What a running compile reports (its process tree, sampled) is what the next
    waiter's scan reads of it; gone with the slot."""
    gate = tmp_path / "gate"
    compilegate.write_budget(gate, mem_gib=8.0, cpus=2)
    with compilegate.slot(gate, 1.0, 1, room=lambda: None) as held:
        assert held.where == "local" and held.live is not None
        held.report(3 << 20)
        (holder,) = compilegate.holders(gate)  # what the import proof asks: compiling?
        assert (holder["mem_gib"], holder["live_gib"]) == (1.0, 3.0)
        assert compilegate.held_gib(holder) == 3.0
        held.report((3 << 20) + 1024)  # moved by less than 64 MiB: not written again
        assert compilegate._read_live(held.live) == 3.0
    assert list((gate / "holders").iterdir()) == [] and compilegate.holders(gate) == []
    assert compilegate.holders(tmp_path / "no-gate") == []


def test_the_tree_sampler_sums_a_compiles_processes(tmp_path: Path) -> None:
    """nvcc with --threads 2 runs two cicc at once: the sampled peak is their sum, not
    the larger of the two (what ru_maxrss says)."""
    from kiln.inside.kit import treemem

    child = "import time; b = bytearray({} << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(2)"
    script = " & ".join(f"{sys.executable} -c {child.format(n)!r}" for n in (300, 200))
    proc = subprocess.Popen(["sh", "-c", f"{script} & wait"])
    seen: list[int] = []
    with treemem.TreeSampler(proc.pid, seen.append, interval=0.2) as sampler:
        proc.wait()
    assert sampler.peak_kib > 480 << 10, sampler.peak_kib  # both at once
    assert seen and max(seen) == sampler.peak_kib
