"""The import proof's parts on real shared objects (gcc, g++, nm, c++filt, a real Python
importing them with LD_BIND_NOW): which modules it imports, who provides each DT_NEEDED
entry, what a failed import says, and the cause table's import rows. Each check is fed
the bad input it exists for and goes red."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from kiln.config.models import ImportProofSettings
from kiln.inside import import_child as inside_proof
from kiln.inside.causes import table
from kiln.inside.causes.cause import LoadFailure
from kiln.verify import imports, loadfacts
from tests import landing
from tests.landing import MODULE_CPP, OPS_CPP, OPS_H

PY_INCLUDE = sysconfig.get_paths()["include"]
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")

# the landing fixture's module: calls kiln_scale (declared in ops.h) at import
EXTRA_CPP = OPS_CPP


def _so(tmp: Path, out: str, sources: list[Path], *flags: str, cxx: bool = True) -> Path:
    target = tmp / out
    target.parent.mkdir(parents=True, exist_ok=True)
    cc = "g++" if cxx else "gcc"
    cmd = [cc, "-shared", "-fPIC", f"-I{PY_INCLUDE}", f"-I{tmp}", *map(str, sources), "-o"]
    subprocess.run([*cmd, str(target), *flags], check=True, capture_output=True)
    return target


def _tree(tmp: Path) -> Path:
    tree = tmp / "tree"
    (tree / "csrc").mkdir(parents=True)
    (tree / "csrc" / "module.cpp").write_text(MODULE_CPP)
    (tree / "csrc" / "ops.h").write_text(OPS_H)
    (tree / "csrc" / "extra.cpp").write_text(EXTRA_CPP)
    return tree


def _import(path: Path, module: str) -> subprocess.CompletedProcess[str]:
    """What the proof does: a Python of its own, -I, LD_BIND_NOW=1."""
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(path)!r}); import {module}",
        ],
        capture_output=True,
        text=True,
        env={"LD_BIND_NOW": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )


# --------------------------------------------------------------------------- modules


def test_extension_modules_are_the_shared_objects_that_export_pyinit(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    good = _so(tmp_path, f"pkg/_C{SUFFIX}", [tree / "csrc/module.cpp", tree / "csrc/extra.cpp"])
    helper = _so(tmp_path, "pkg/libhelper.so", [tree / "csrc/extra.cpp"])
    graft = _so(
        tmp_path, f"pkg.libs/_C{SUFFIX}", [tree / "csrc/module.cpp", tree / "csrc/extra.cpp"]
    )
    assert imports.exports_pyinit(good, "_C")
    assert not imports.exports_pyinit(helper, "libhelper")  # a library, not a module
    assert imports.extension_name(f"pkg/_C{SUFFIX}") == ("pkg._C", "_C")
    assert imports.extension_name(f"pkg.libs/_C{SUFFIX}") is None  # not importable there
    planned = imports.plan_modules(
        {f"pkg/_C{SUFFIX}": good, "pkg/libhelper.so": helper, f"pkg.libs/_C{SUFFIX}": graft},
        {f"pkg/_C{SUFFIX}": ["libc10.so", "libc.so.6"]},
        ["pkg"],
        [],
        ImportProofSettings(),
        driver=False,
    )
    assert [(m.name, m.kind, m.preload) for m in planned] == [
        ("pkg._C", "extension", ("torch",)),  # links torch's library: torch first
        ("pkg", "package", ()),  # what a user types: nothing first
    ]


def test_the_recipe_skips_a_module_with_its_reason_and_a_gpu_module_without_a_driver() -> None:
    settings = ImportProofSettings(
        modules=["pkg.ops"], needs_gpu=["pkg.autotune"], skip={"pkg.contrib": "optional"}
    )
    planned = imports.plan_modules({}, {}, ["pkg", "pkg.contrib"], [], settings, driver=False)
    skips = {m.name: m.skip for m in planned}
    assert skips == {
        "pkg": None,
        "pkg.contrib": "optional",
        "pkg.ops": None,
        "pkg.autotune": "needs a GPU (build.import_proof.needs_gpu); this machine has no driver",
    }
    with_gpu = imports.plan_modules({}, {}, [], [], settings, driver=True)
    assert {m.name: m.skip for m in with_gpu}["pkg.autotune"] is None  # imported where a GPU is


def test_top_level_names_come_from_top_level_txt_else_the_tree() -> None:
    members = ["pkg/__init__.py", "pkg/_C.so", "tool.py", "pkg-1.0.dist-info/METADATA"]
    assert imports.top_level(members) == ["pkg", "tool"]
    assert imports.top_level(members, "pkg\n") == ["pkg"]


# --------------------------------------------------------------------------- closure


def test_every_needed_entry_has_a_provider_or_the_closure_names_it() -> None:
    env = {"libc10.so": [("/env/torch/lib/libc10.so", "torch")]}
    system = imports.system_libraries("manylinux_2_34_x86_64")
    assert {"libc.so.6", "libstdc++.so.6", "libm.so.6"} <= system
    needed = {
        "pkg/_C.so": [
            "libc10.so",
            "libc.so.6",
            "libcuda.so.1",
            "libhelper.so",
            "ld-linux-x86-64.so.2",
        ]
    }
    ok = imports.closure(needed, ["libhelper.so"], env, {"torch": "2.14.1"}, system, {})
    assert ok.missing == []
    assert ok.provided == {
        "ld-linux-x86-64.so.2": "the system (C and C++ runtime)",
        "libc.so.6": "the system (C and C++ runtime)",
        "libc10.so": "torch 2.14.1",
        "libcuda.so.1": "the GPU driver",
        "libhelper.so": "the output itself",
    }
    bad = imports.closure({"pkg/_C.so": ["libibverbs.so.1"]}, [], env, {}, system, {})
    assert bad.missing == [("pkg/_C.so", "libibverbs.so.1")]
    declared = imports.closure(
        {"pkg/_C.so": ["libibverbs.so.1"]}, [], env, {}, system, {"libibverbs.so.1": "libibverbs1"}
    )
    assert declared.provided == {"libibverbs.so.1": "the system package libibverbs1 (declared)"}


# --------------------------------------------------------------------------- requirements


LOCKED_OTHER = (
    "# Resolved by `kiln lock`\n"
    "filelock==4.3.1 --hash=sha256:" + "a" * 64 + "\n"
    "torch==2.13.0 --hash=sha256:" + "b" * 64 + "\n"
)


def test_a_runtime_lock_pinning_another_torch_is_named_with_the_pin_to_change() -> None:
    problem = imports.pinned_torch_problem(
        LOCKED_OTHER, "runtime-requirements.lock", "2.14.1+cu130"
    )
    assert problem is not None
    assert problem.startswith("runtime-requirements.lock pins torch==2.13.0, but the wheels ")
    assert "pin torch==2.14.1 in runtime-requirements.txt and run `kiln lock`" in problem
    same = LOCKED_OTHER.replace("2.13.0", "2.14.1")
    assert imports.pinned_torch_problem(same, "runtime-requirements.lock", "2.14.1+cu130") is None
    assert imports.pinned_torch_problem("torch>=2.10\n", "x", "2.14.1+cu130") is None
    assert imports.pinned_torch_problem(LOCKED_OTHER, "x", None) is None  # no torch built
    # local version labels by PEP 440's rules (the release's own workspace pins one)
    cu132 = "2.13.0+cu132"
    assert imports.pinned_torch_problem(f"torch=={cu132}\n", "x", cu132) is None
    assert imports.pinned_torch_problem("torch==2.13.0\n", "x", cu132) is None
    assert imports.pinned_torch_problem("torch==2.13.0+cu130\n", "x", cu132) is not None
    assert imports.pinned_torch_problem("torch==2.14.1+cu130\n", "x", "2.14.1") is None


def test_what_a_requirements_text_pins_and_whether_it_is_a_whole_lock() -> None:
    assert imports.pinned_versions(LOCKED_OTHER) == (
        {"filelock": "4.3.1", "torch": "2.13.0"},
        True,
    )
    pins, whole = imports.pinned_versions("# kiln\ntorch==2.14.1\nnumpy>=2\n-e ./x\n")
    assert pins == {"torch": "2.14.1"} and not whole  # nothing pinned by hash: not a lock
    assert imports.pinned_versions("Foo_Bar===1.0 --hash=sha256:x\n") == ({"foo-bar": "1.0"}, True)
    assert imports.pinned_versions("") == ({}, False)


def test_requirements_the_environment_does_not_meet_are_named_with_what_it_has() -> None:
    requires = ["torch==2.14.1", "numpy>=2", "einops; extra == 'dev'"]
    assert imports.requirement_problems(requires, {"torch": "2.13.0"}) == [
        "torch==2.14.1 (the environment has torch 2.13.0)",
        "numpy>=2 (not installed)",
    ]
    assert imports.requirement_problems(requires, {"torch": "2.14.1+cu130", "numpy": "2.1"}) == []


# --------------------------------------------------------------------------- failures


def test_a_module_calling_a_function_no_source_defines_fails_with_the_source_left_out(
    tmp_path: Path,
) -> None:
    """The issue's case: declared in a header, called, defined in a source the build's list
    left out. Built as a shared object it links (an undefined symbol is allowed there);
    imported with LD_BIND_NOW it fails, and the cause names the source."""
    tree = _tree(tmp_path)
    so = _so(tmp_path, f"pkg/_C{SUFFIX}", [tree / "csrc/module.cpp"])
    res = _import(tmp_path, "pkg._C")
    assert res.returncode != 0
    read = imports.read_failure("pkg._C", res.stderr, False)
    assert read.symbol == "_Z10kiln_scalei"
    assert read.symbol_file and read.symbol_file.endswith(f"pkg/_C{SUFFIX}")
    facts = loadfacts.gather(
        "mylib",
        read,
        f"pkg/_C{SUFFIX}",
        [],
        {},
        {},
        {f"pkg/_C{SUFFIX}": so},
        tree,
        {"csrc/module.cpp"},
        None,
    )
    assert facts.demangled == "kiln_scale(int)"
    assert facts.declared_at == ("csrc/ops.h:2",)
    assert facts.defined_uncompiled == ("csrc/extra.cpp:2",)
    cause = table.explain_load(facts)
    assert cause.row == "declared-never-compiled"
    assert "defined at csrc/extra.cpp:2, which the build never compiled" in cause.cause
    assert cause.fix.startswith("add csrc/extra.cpp to the extension's sources in setup.py")
    # compiled after all (it is in the build's units): then nothing defines it at all
    compiled = loadfacts.gather(
        "mylib", read, None, [], {}, {}, {}, tree, {"csrc/module.cpp", "csrc/extra.cpp"}, None
    )
    assert compiled.defined_uncompiled == ()
    assert "is defined by no source the build compiled" in table.explain_load(compiled).cause


def test_a_symbol_defined_in_a_library_the_extension_does_not_link(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _so(tmp_path, f"pkg/_C{SUFFIX}", [tree / "csrc/module.cpp"])
    lib = _so(
        tmp_path, "env/libkilnops.so.1", [tree / "csrc/extra.cpp"], "-Wl,-soname,libkilnops.so.1"
    )
    read = imports.read_failure("pkg._C", _import(tmp_path, "pkg._C").stderr, False)
    env = {"libkilnops.so.1": [(str(lib), "kilnops")]}
    facts = loadfacts.gather(
        "mylib",
        read,
        f"pkg/_C{SUFFIX}",
        ["libc.so.6"],
        env,
        {"kilnops": "1.0"},
        {},
        None,
        set(),
        None,
    )
    assert facts.definers == ("libkilnops.so.1 (kilnops 1.0)",) and not facts.linked
    cause = table.explain_load(facts)
    assert cause.row == "library-left-off-link"
    assert "add 'kilnops' to the extension's libraries in setup.py (-lkilnops" in cause.fix
    linked = loadfacts.gather(
        "mylib", read, None, ["libkilnops.so.1"], env, {}, {}, None, set(), None
    )
    assert linked.linked and table.explain_load(linked).row != "library-left-off-link"


def test_a_left_off_link_to_a_site_packages_library_is_fixed_with_its_load_in_one_round(
    tmp_path: Path,
) -> None:
    """Issue 41 (2): a symbol defined by a library another distribution ships in
    site-packages (cuBLAS's libcublas.so.13 in nvidia-cublas, here libkilnops.so.1 in
    kilnops). Linking it alone, the old printed fix, fails the next import (the loader
    cannot open it: it searches no site-packages); the printed fix links it with a
    RUNPATH to its folder, and applied as printed, the module imports."""
    tree = _tree(tmp_path)
    site = tmp_path / "env" / "lib" / "python3" / "site-packages"
    libdir = site / "kilnops" / "lib"
    lib = _so(libdir, "libkilnops.so.1", [tree / "csrc/extra.cpp"], "-Wl,-soname,libkilnops.so.1")
    (libdir / "libkilnops.so").symlink_to("libkilnops.so.1")  # what the link's -l finds
    rel = f"pkg/_C{SUFFIX}"
    _so(site, rel, [tree / "csrc/module.cpp"])
    read = imports.read_failure("pkg._C", _import(site, "pkg._C").stderr, False)
    env = {"libkilnops.so.1": [(str(lib), "kilnops")]}
    facts = loadfacts.gather(
        "mylib", read, rel, ["libc.so.6"], env, {"kilnops": "1.0"}, {}, None, set(), None
    )
    assert facts.definer_runpath == "$ORIGIN/../kilnops/lib"
    cause = table.explain_load(facts)
    assert cause.row == "library-left-off-link"
    assert cause.fix.startswith(
        "link it and let the loader find it where it lands, in one patch (patches/): add "
        "'kilnops' to the extension's libraries in setup.py (-lkilnops, NEEDED "
        "libkilnops.so.1) and '-Wl,-rpath,$ORIGIN/../kilnops/lib' to its extra_link_args"
    ), cause.fix
    # the link alone: the second failure the old fix led to
    _so(site, rel, [tree / "csrc/module.cpp"], f"-L{libdir}", "-lkilnops")
    alone = _import(site, "pkg._C")
    assert alone.returncode != 0 and "libkilnops.so.1: cannot open shared object" in alone.stderr
    # the printed fix, applied as printed: the libraries and the extra_link_args it names
    name, link_arg = landing.printed_link(cause.fix)
    _so(site, rel, [tree / "csrc/module.cpp"], f"-L{libdir}", f"-l{name}", link_arg)
    fixed = _import(site, "pkg._C")
    assert fixed.returncode == 0, fixed.stderr
    # torch's own libraries get no RUNPATH advice (importing torch first loads them)
    torch_env = {"libkilnops.so.1": [(str(lib), "torch")]}
    torch_facts = loadfacts.gather(
        "mylib", read, rel, [], torch_env, {"torch": "2.14.1"}, {}, None, set(), None
    )
    assert torch_facts.definer_runpath is None
    assert table.explain_load(torch_facts).fix.startswith("link it: add 'kilnops'")


def test_a_linked_library_the_loader_cannot_find_gets_its_runpath_applied_as_printed(
    tmp_path: Path,
) -> None:
    """library-not-found (issue 41 (2)): the extension links libkilnops.so.1 (NEEDED), which
    the environment has in site-packages (distribution kilnops), with no RUNPATH to it: the
    loader cannot open it. The printed fix names the RUNPATH from where the extension lands
    to the library's folder; relinked with it as printed, the module imports."""
    tree = _tree(tmp_path)
    site = tmp_path / "env" / "lib" / "python3" / "site-packages"
    libdir = site / "kilnops" / "lib"
    lib = _so(libdir, "libkilnops.so.1", [tree / "csrc/extra.cpp"], "-Wl,-soname,libkilnops.so.1")
    (libdir / "libkilnops.so").symlink_to("libkilnops.so.1")
    rel = f"pkg/_C{SUFFIX}"
    _so(site, rel, [tree / "csrc/module.cpp"], f"-L{libdir}", "-lkilnops")
    res = _import(site, "pkg._C")
    assert res.returncode != 0 and "libkilnops.so.1: cannot open shared object" in res.stderr
    read = imports.read_failure("pkg._C", res.stderr, False)
    assert read.library == "libkilnops.so.1"
    env = {"libkilnops.so.1": [(str(lib), "kilnops")]}
    facts = loadfacts.gather(
        "mylib", read, rel, ["libkilnops.so.1"], env, {"kilnops": "1.0"}, {}, None, set(), None
    )
    cause = table.explain_load(facts)
    assert cause.row == "library-not-found"
    assert "which the consumer environment has (kilnops 1.0)" in cause.cause
    assert cause.fix.startswith(
        "add '-Wl,-rpath,$ORIGIN/../kilnops/lib' to the extension's extra_link_args in setup.py"
    ), cause.fix
    link_arg = cause.fix.split("add '", 1)[1].split("'", 1)[0]
    _so(site, rel, [tree / "csrc/module.cpp"], f"-L{libdir}", "-lkilnops", link_arg)
    fixed = _import(site, "pkg._C")
    assert fixed.returncode == 0, fixed.stderr
    # where the extension's landing place is unknown, the fix stays the general form
    unknown = loadfacts.gather(
        "mylib", read, None, ["libkilnops.so.1"], env, {"kilnops": "1.0"}, {}, None, set(), None
    )
    assert table.explain_load(unknown).fix.startswith("give the extension a RUNPATH to it")


def test_the_same_name_with_another_signature_is_another_torch(tmp_path: Path) -> None:
    """The extension wants ``c10::kiln_check(int)``; the environment's library defines
    ``c10::kiln_check(long)``: built against another version than it lands with."""
    src = tmp_path / "c10.cpp"
    src.write_text("namespace c10 { int kiln_check(long x) { return (int)x; } }\n")
    lib = _so(tmp_path, "env/libc10.so", [src])
    facts = loadfacts.gather(
        "mylib",
        imports.ImportFailure(
            "pkg._C", "ImportError: undefined symbol", symbol="_ZN3c1010kiln_checkEi"
        ),
        f"pkg/_C{SUFFIX}",
        ["libc10.so"],
        {"libc10.so": [(str(lib), "torch")]},
        {"torch": "2.13.0"},
        {},
        None,
        set(),
        "torch==2.14.1",
    )
    assert facts.demangled == "c10::kiln_check(int)"
    assert facts.same_name == ("libc10.so (torch 2.13.0): c10::kiln_check(long)",)
    assert facts.dependency == "torch"
    cause = table.explain_load(facts)
    assert cause.row == "abi-mismatch"
    assert "(compiled against torch==2.14.1; the environment holds torch 2.13.0)" in cause.cause


def test_a_library_nobody_ships_names_the_wheel_or_the_runtime_library_entry(
    tmp_path: Path,
) -> None:
    lib = _so(
        tmp_path,
        "build/libkilnabsent.so.1",
        [_tree(tmp_path) / "csrc/extra.cpp"],
        "-Wl,-soname,libkilnabsent.so.1",
    )
    module = tmp_path / "needs.cpp"
    module.write_text(MODULE_CPP)
    (tmp_path / "ops.h").write_text(OPS_H)
    _so(tmp_path, f"pkg/_C{SUFFIX}", [module], f"-L{lib.parent}", "-l:libkilnabsent.so.1")
    res = _import(tmp_path, "pkg._C")
    read = imports.read_failure("pkg._C", res.stderr, False)
    assert read.library == "libkilnabsent.so.1"
    facts = loadfacts.gather("mylib", read, None, [], {}, {}, {}, None, set(), None)
    cause = table.explain_load(facts)
    assert cause.row == "library-nobody-ships"
    # a TOML table that pastes as it is (issue 35): a key a line
    assert cause.fix.endswith(
        ':\n      [[build.runtime_libraries]]\n      soname = "libkilnabsent.so.1"\n'
        '      package = "PACKAGE"'
    )
    import tomllib

    pasted = "\n".join(ln.strip() for ln in cause.fix.split(":\n", 1)[1].splitlines())
    assert tomllib.loads(pasted)["build"]["runtime_libraries"][0]["soname"] == "libkilnabsent.so.1"
    cudart = table.explain_load(LoadFailure("v", "m", None, "x", library="libcudart.so.13"))
    assert cudart.fix.startswith("add nvidia-cuda-runtime to runtime-requirements.txt")
    torch_first = table.explain_load(
        LoadFailure("v", "pkg", None, "x", library="libc10.so", library_is_torch=True)
    )
    assert torch_first.row == "imports-before-torch"


@pytest.mark.parametrize(
    ("output", "row"),
    [
        (
            'Traceback (most recent call last):\n  File "/env/pkg/__init__.py", line 3, in '
            "<module>\nRuntimeError: CUDA initialization failed: no CUDA-capable device\n",
            "needs-gpu",
        ),
        (
            'Traceback (most recent call last):\n  File "/env/pkg/__init__.py", line 1, in '
            "<module>\nModuleNotFoundError: No module named 'einops'\n",
            "missing-python-dependency",
        ),
        (
            'Traceback (most recent call last):\n  File "/env/pkg/__init__.py", line 7, in '
            "<module>\nValueError: broken on purpose\n",
            "raises-at-import",
        ),
    ],
)
def test_python_level_failures_have_their_rows(output: str, row: str) -> None:
    read = imports.read_failure("pkg", output, False)
    facts = loadfacts.gather("mylib", read, None, [], {}, {}, {}, None, set(), None)
    cause = table.explain_load(facts)
    assert cause.row == row
    if row == "raises-at-import":
        assert (
            cause.cause
            == "importing pkg raises ValueError: broken on purpose at /env/pkg/__init__.py:7"
        )
    timed_out = imports.read_failure("pkg", output, True)
    assert (
        table.explain_load(
            loadfacts.gather("mylib", timed_out, None, [], {}, {}, {}, None, set(), None)
        ).row
        == "import-timeout"
    )


# --------------------------------------------------------------------------- the runner


def test_the_inside_runner_imports_with_bind_now_a_stub_and_a_time_limit(tmp_path: Path) -> None:
    """``python -m kiln.inside prove``'s own loop: a module that imports, one with an
    undefined symbol (caught at load: LD_BIND_NOW), one that hangs (stopped at its limit);
    libcuda is the driver here or a stub made for these imports."""
    tree = _tree(tmp_path)
    _so(tmp_path, "good/_C" + SUFFIX, [tree / "csrc/module.cpp", tree / "csrc/extra.cpp"])
    _so(tmp_path, "bad/_C" + SUFFIX, [tree / "csrc/module.cpp"])
    (tmp_path / "good" / "__init__.py").write_text("")
    (tmp_path / "bad" / "__init__.py").write_text("")
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(30)\n")
    (tmp_path / "cuda.py").write_text(
        "import ctypes\nlib = ctypes.CDLL('libcuda.so.1')\nprint('cuInit', lib.cuInit(0))\n"
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "fixture.pth").write_text(f"{tmp_path}\n")
    found = inside_proof.run(
        {
            "python": str(venv / "bin" / "python"),
            "modules": [{"name": n} for n in ("good._C", "bad._C", "slow", "cuda")],
            "timeout_s": 3,
            "cuda_home": "/usr/local/cuda",
            "work": str(tmp_path / "work"),
        }
    )
    results = {r["name"]: r for r in found["modules"]}
    assert results["good._C"]["returncode"] == 0, results["good._C"]
    assert str((results["good._C"]["facts"] or {}).get("file")).endswith("good/_C" + SUFFIX)
    assert "undefined symbol: _Z10kiln_scalei" in results["bad._C"]["output"]
    assert results["slow"]["timed_out"] and results["slow"]["seconds"] < 10
    assert results["cuda"]["returncode"] == 0, results["cuda"]
    if found["driver"] != "found":  # the stub answers dlopen and says it is one
        assert "cuInit 34" in results["cuda"]["output"]


# pip 23.0.1's (Debian 12's venv pip) answer to a wheel whose download was cut short
# (seen with a server that closed the connection after 1000 of 100000 bytes)
PIP_CUT_DOWNLOAD = (
    (
        "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have "
        "updated the package versions, please update the hashes. Otherwise, examine the package "
        "contents carefully; someone may have tampered with them.\n"
    )
    + """\
    tinypkg==1.0 from http://127.0.0.1:8765/f/tinypkg-1.0-py3-none-any.whl#sha256=00:
        Expected sha256 00
             Got        44f8354494a5ba03ba1792a8d3e9c534c47a9181980fde7a3f44b06ef2ae7c7f
"""
)


def test_what_pip_said_keeps_the_package_a_hash_error_names_and_says_a_cut_download_reads_so() -> (
    None
):
    from kiln.orchestrate.importproof import _tool_said

    said = _tool_said(PIP_CUT_DOWNLOAD.splitlines())
    assert "DO NOT MATCH THE HASHES" in said and "tinypkg==1.0 from http://" in said
    assert "Expected sha256 00 Got" in said
    assert "a download cut short reads the same" in said
    plain = _tool_said(["Collecting x", "ERROR: No matching distribution found for x"])
    assert plain == " (ERROR: No matching distribution found for x)"
    assert _tool_said(["Error: [Errno 28] No space left on device"]).endswith("device)")
    assert _tool_said([]) == ""
    # as a failed command's error carries them: its output's lines indented
    indented = ["    " + line for line in PIP_CUT_DOWNLOAD.splitlines()]
    assert _tool_said(indented) == said
    two = ["  ERROR: Could not find a version", "  ERROR: No matching distribution", "  x"]
    assert _tool_said(two) == " (ERROR: Could not find a version ERROR: No matching distribution)"


@pytest.mark.parametrize("first_alone", [False, True])
def test_while_others_compile_the_first_module_is_imported_alone(
    tmp_path: Path, first_alone: bool
) -> None:
    """While other steps compile (``first_alone``), the first of a wheel's modules is
    imported by itself and the others after it, at once: it compiles the bytecode they
    share (a package's two modules each compiled torch._dynamo's, 9.4 CPU-s each beside
    the compiles); with the machine to itself, all at once."""
    log = tmp_path / "log"
    for name in ("one", "two", "three"):
        (tmp_path / f"{name}.py").write_text(
            "import time\n"
            f"open({str(log)!r}, 'a').write('{name} start %f\\n' % time.time())\n"
            "time.sleep(0.4)\n"
            f"open({str(log)!r}, 'a').write('{name} end %f\\n' % time.time())\n"
        )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "fixture.pth").write_text(f"{tmp_path}\n")
    found = inside_proof.run(
        {
            "python": str(venv / "bin" / "python"),
            "modules": [{"name": n} for n in ("one", "two", "three")],
            "timeout_s": 30,
            "cuda_home": None,
            "work": str(tmp_path / "work"),
            "jobs": 4,
            "first_alone": first_alone,
        }
    )
    assert [r["name"] for r in found["modules"]] == ["one", "two", "three"]
    assert {r["returncode"] for r in found["modules"]} == {0}
    at = {tuple(line.split()[:2]): float(line.split()[2]) for line in log.read_text().splitlines()}
    one_done = at[("one", "end")] <= min(at[("two", "start")], at[("three", "start")])
    assert one_done == first_alone, at
    assert (
        at[("two", "start")] < at[("three", "end")] and at[("three", "start")] < at[("two", "end")]
    )
