"""Every printed fix proven by applying it (issue 41): fixture upstreams that fail one way
each (tests/broken.py) are built, the fix each failure printed is read off the screen and
applied as printed, and the next build reaches the state the fix promises: a release, or
for a declaration that lets preflight check a system package, a refusal before any compile.

- ptx-instruction: "the upstream's arch guard around that code" (a patch in patches/);
- arch-uncovered: "build only what it covers: build.archs = [...]" (the arch-dropped
  fixture under ``arch_control = "rewrite"``);
- arch-refused: "drop its own arch flags ...: build.nvcc_drop_flags = [...]" (a unit
  written for sm_90a alone, whose code is valid on the build's arch);
- missing-identifier: "pin the upstream at a revision that does not use ..." (the
  fixture's history has one before the call);
- missing-header, missing-library: the ``[[build.system]]`` table, pasted into the vendor's
  TOML as printed: the next build is refused by preflight, naming the package, with
  nothing compiled;
- missing-library: "add its folder to build.env LIBRARY_PATH": the library built into a
  folder of its own; linked, the wheel still needs it at load, which the import proof
  names (the next state) instead of releasing an unloadable wheel.

- declared-never-compiled, library-nobody-ships (tests/landing.py, the import proof's):
  the source added to setup.py as a patch; the ``[[build.runtime_libraries]]`` table pasted.

- compiler-cannot-write: "point TMPDIR ... at a disk with room, and rerun" (a recipe TMPDIR
  on a 64 KiB file system, then a folder with room);
- import-timeout: "raise build.import_proof.timeout_s" (an import of 3 s under 1 s).

(unknown-arch's and the other mechanical rows' fixes are applied by ``kiln build --fix`` in
tests/integration/test_fix.py.)
"""

from __future__ import annotations

import difflib
import json
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

import tomlkit

from tests import broken, landing
from tests.conftest import build_args, run_kiln, shared_cache
from tests.integration.test_import_proof import PROFILE_NO_TORCH, _build
from tests.integration.test_inplace import make_wheel
from tests.workspace import PROFILE, write

GUARDED = """\
__global__ void k() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;");
#endif
}
"""


def printed_fixes(stderr: str) -> dict[str, str]:
    """vendor -> its fix as the error screen printed it (the ``  fix:`` line and the lines
    indented under it, unindented: a TOML table the user pastes)."""
    screen = stderr[stderr.rindex("kiln: error: ") :].splitlines()
    fixes: dict[str, str] = {}
    vendor = None
    for i, line in enumerate(screen):
        head = re.match(r"(?:kiln: error: )?(?:building )?([\w.-]+)(?: failed|: )", line)
        if head and not line.startswith(" "):
            vendor = head[1]
        if line.startswith("  fix: ") and vendor:
            block = [line.removeprefix("  fix: ")]
            for more in screen[i + 1 :]:
                if not more.startswith("      "):
                    break
                block.append(more.removeprefix("      "))
            fixes[vendor] = "\n".join(block)
    return fixes


def _edit(path: Path, change) -> None:
    doc = tomlkit.parse(path.read_text())
    change(doc)
    path.write_text(tomlkit.dumps(doc))


def test_printed_fixes_applied_as_printed_reach_what_they_promise(
    tmp_path: Path, build_python: Path, pypi_cuda: Path
) -> None:
    faults = broken.make(tmp_path / "broken")
    names: tuple[str, ...] = (
        "ptx-instruction",
        "missing-identifier",
        "missing-header",
        "missing-library",
        "arch-refused",
    )
    vendors = {n: broken.vendor(n, faults.commits[n]) for n in names}
    # the arch-dropped fixture (its table targets sm_100a alone) under kiln's rewrite
    uncovered = broken.vendor("arch-dropped", faults.commits["arch-dropped"])
    uncovered["build"]["arch_control"] = "rewrite"
    ws = write(tmp_path / "ws", {**vendors, "arch-uncovered": uncovered})
    names = (*names, "arch-uncovered")
    shared_cache(tmp_path / "cache")

    def build(*extra: str) -> subprocess.CompletedProcess[str]:
        return run_kiln(
            *build_args(
                ws, tmp_path, *extra, mirrors=faults.mirrors, python=build_python, toolchain="pypi"
            )
        )

    res = build()
    assert res.returncode == 6, res.stderr[-3000:]
    fixes = printed_fixes(res.stderr)
    assert set(fixes) == set(names), fixes

    # ptx-instruction: the arch guard, as a patch of the unit the fix names
    assert fixes["ptx-instruction"].startswith(
        "compile csrc/hopper.cu only for archs that have wgmma.fence: the upstream's arch "
        "guard around that code (#if __CUDA_ARCH__ ...)"
    )
    before = broken.FAULTS["ptx-instruction"][1]["csrc/hopper.cu"].splitlines(keepends=True)
    patch = "".join(
        difflib.unified_diff(
            before, GUARDED.splitlines(keepends=True), "a/csrc/hopper.cu", "b/csrc/hopper.cu"
        )
    )
    (ws / "patches" / "guard-wgmma.patch").write_text(patch)
    (ws / "patches" / "series.toml").write_text(
        '[[patch]]\nfile = "guard-wgmma.patch"\ntarget = "ptx-instruction"\n'
    )
    # missing-identifier: the revision before the upstream used what this NCCL lacks
    assert (
        "or pin the upstream at a revision that does not use ncclKilnFutureProperties, "
        "ncclKilnFutureQuery (vendors/missing-identifier.toml source.commit)"
    ) in fixes["missing-identifier"]
    _edit(
        ws / "vendors" / "missing-identifier.toml",
        lambda d: d["source"].__setitem__("commit", faults.earlier["missing-identifier"]),
    )
    # arch-uncovered: "else build only what it covers: build.archs = [...]", as printed
    fix = fixes["arch-uncovered"]
    m = re.search(
        r"build only what it covers: build\.archs = (\[.*?\]) in vendors/arch-uncovered", fix
    )
    assert m, fix
    archs = json.loads(m[1])
    assert archs == ["sm_100a"], archs
    _edit(ws / "vendors" / "arch-uncovered.toml", lambda d: d["build"].__setitem__("archs", archs))
    # arch-refused: a unit written for sm_90a alone; its code is valid on sm_100a (an
    # empty kernel), so its own flag dropped as printed, the rewrite gives it sm_100a
    fix = fixes["arch-refused"]
    m = re.search(r"build\.nvcc_drop_flags = (\[.*?\]) in vendors/arch-refused\.toml", fix)
    assert m, fix
    drop = json.loads(m[1])
    assert drop == ["-gencode=arch=compute_90a,code=sm_90a"], drop
    _edit(
        ws / "vendors" / "arch-refused.toml",
        lambda d: d["build"].__setitem__("nvcc_drop_flags", drop),
    )
    fixed = build("ptx-instruction", "missing-identifier", "arch-uncovered", "arch-refused")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "release ready" in fixed.stderr

    # missing-header, missing-library: the printed [[build.system]] table, pasted as is
    for name in ("missing-header", "missing-library"):
        fix = fixes[name]
        assert f"declare it in vendors/{name}.toml so preflight checks it" in fix, fix
        table = fix[fix.index("[[build.system]]") :]
        recipe = ws / "vendors" / f"{name}.toml"
        recipe.write_text(recipe.read_text() + "\n" + table + "\n")
    declared = build("missing-header", "missing-library")
    assert declared.returncode != 0, declared.stderr[-3000:]
    err = declared.stderr
    assert "hwloc.h" in err and "libhwloc-dev" in err, err[-3000:]
    assert "kilnabsent" in err, err[-3000:]
    assert "building missing-header failed" not in err  # refused before its compile
    assert "building missing-library failed" not in err
    assert "Traceback" not in err


def test_a_missing_librarys_folder_on_library_path_links_and_ships_it(
    tmp_path: Path, build_python: Path, pypi_cuda: Path
) -> None:
    """missing-library's fix "add its folder to build.env LIBRARY_PATH", applied: the link
    finds it and the wheel ships it (auditwheel repair grafts it from that folder), so the
    import proof loads it and the build releases: one round trip, not a link that succeeds
    and a wheel that cannot load. Without the folder, the repair's refusal names the
    library and the same fix (a library found nowhere to ship)."""
    faults = broken.make(tmp_path / "broken")
    name = "missing-library"
    ws = write(tmp_path / "ws", {name: broken.vendor(name, faults.commits[name])})
    shared_cache(tmp_path / "cache")
    args = build_args(ws, tmp_path, mirrors=faults.mirrors, python=build_python, toolchain="pypi")
    res = run_kiln(*args)
    assert res.returncode == 6, res.stderr[-3000:]
    fix = printed_fixes(res.stderr)[name]
    assert f"or add its folder to build.env LIBRARY_PATH in vendors/{name}.toml" in fix, fix
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "absent.c").write_text("int kiln_absent(void) { return 1; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", libs / "libkilnabsent.so", libs / "absent.c"],
        check=True,
    )
    _edit(
        ws / "vendors" / f"{name}.toml",
        lambda d: d["build"]["env"].__setitem__("LIBRARY_PATH", str(libs)),
    )
    again = run_kiln(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "release ready" in again.stderr
    (wheel,) = (tmp_path / "artifacts" / "test-release" / "wheels").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert any("libkilnabsent" in n for n in zf.namelist()), zf.namelist()


def test_the_import_proofs_printed_fixes_applied_release(
    tmp_path: Path, build_python: Path
) -> None:
    """The import proof's rows (tests/landing.py: real wheels that verify and do not load):
    declared-never-compiled's "add csrc/ops.cpp to the extension's sources in setup.py",
    as a patch; library-nobody-ships' ``[[build.runtime_libraries]]`` table, pasted as
    printed; missing-python-dependency's "add the distribution ... to the wheel's
    dependencies and to runtime-requirements.txt" (a patch and the line; the distribution
    a wheel of a local wheelhouse). All release on the next build."""
    cases = landing.make(tmp_path / "landing")
    bad = ("undefined-symbol", "nobody-ships", "undeclared-dep")
    ws = write(
        tmp_path / "ws",
        {c: landing.vendor(c, cases.commits[c]) for c in bad},
        profile=PROFILE_NO_TORCH,
    )
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse)  # kiln_fixture_dep 1.0
    offline_pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    res = _build(tmp_path, ws, cases.mirrors, build_python, env=offline_pip)
    assert res.returncode == 18, res.stderr[-3000:]
    fixes = printed_fixes(res.stderr)
    assert set(fixes) == set(bad), fixes

    fix = fixes["undefined-symbol"]
    assert fix.startswith("add csrc/ops.cpp to the extension's sources in setup.py"), fix
    before = landing.SETUP_PY.splitlines(keepends=True)
    after = [ln.replace('SPEC["sources"],', 'SPEC["sources"] + ["csrc/ops.cpp"],') for ln in before]
    assert after != before
    patch = "".join(difflib.unified_diff(before, after, "a/setup.py", "b/setup.py"))
    (ws / "patches" / "ops-source.patch").write_text(patch)
    fix = fixes["nobody-ships"]
    assert "or declare it a system requirement in vendors/nobody-ships.toml:" in fix, fix
    table = fix[fix.index("[[build.runtime_libraries]]") :]
    recipe = ws / "vendors" / "nobody-ships.toml"
    recipe.write_text(recipe.read_text() + "\n" + table + "\n")
    fix = fixes["undeclared-dep"]
    assert fix.startswith(
        "add the distribution that provides kiln_fixture_dep to the wheel's dependencies and "
        "to runtime-requirements.txt"
    ), fix
    declared = landing.SETUP_PY.replace(
        '    packages=["landing"],\n',
        '    packages=["landing"],\n    install_requires=["kiln_fixture_dep==1.0"],\n',
    )
    after = declared.splitlines(keepends=True)
    patch = "".join(difflib.unified_diff(before, after, "a/setup.py", "b/setup.py"))
    (ws / "patches" / "declare-dep.patch").write_text(patch)
    (ws / "runtime-requirements.txt").write_text("kiln_fixture_dep==1.0\n")
    (ws / "patches" / "series.toml").write_text(
        '[[patch]]\nfile = "ops-source.patch"\ntarget = "undefined-symbol"\n\n'
        '[[patch]]\nfile = "declare-dep.patch"\ntarget = "undeclared-dep"\n'
    )
    again = _build(tmp_path, ws, cases.mirrors, build_python, env=offline_pip)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "release ready" in again.stderr


def test_a_cublas_call_left_unlinked_releases_with_the_link_and_runpath_as_printed(
    tmp_path: Path, build_python: Path
) -> None:
    """Issue 55 (3), cuBLAS unlinked: an extension calls cublasGetProperty and its link
    names no -lcublas. It links (setuptools allows undefined symbols) and verifies; the
    import proof, in the torch profile's consumer environment (torch's nvidia-cublas: the
    real libcublas.so.13 under nvidia/cu13/lib), fails with the undefined symbol and
    library-left-off-link prints the link and the RUNPATH to where cuBLAS lands. Applied
    as printed (a patch of setup.py: not mechanical, so by hand), the next build releases:
    the module calls cuBLAS at import."""
    cases = landing.make(tmp_path / "landing")
    profile = {**PROFILE_NO_TORCH, "torch": PROFILE["torch"]}
    case = "cublas-unlinked"
    ws = write(tmp_path / "ws", {case: landing.vendor(case, cases.commits[case])}, profile=profile)
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 18, res.stderr[-3000:]
    assert "undefined symbol: cublasGetProperty" in res.stderr, res.stderr[-3000:]
    fix = printed_fixes(res.stderr)[case]
    assert fix.startswith(
        "link it and let the loader find it where it lands, in one patch (patches/): add "
        "'cublas' to the extension's libraries in setup.py (-lcublas, NEEDED libcublas.so.13) "
        "and '-Wl,-rpath,$ORIGIN/../nvidia/cu13/lib' to its extra_link_args"
    ), fix
    name, link_arg = landing.printed_link(fix)
    before = landing.SETUP_PY.splitlines(keepends=True)
    after = (
        "".join(before)
        .replace(
            '["cudart_static", "rt", "pthread", "dl"])',
            f'["cudart_static", "rt", "pthread", "dl"]) + [{name!r}]',
        )
        .replace(
            'ext.extra_link_args = SPEC.get("link_args", [])',
            f'ext.extra_link_args = SPEC.get("link_args", []) + [{link_arg!r}]',
        )
    )
    assert after.count(name) == 1 and after.count(link_arg) == 1, after
    patch = "".join(
        difflib.unified_diff(before, after.splitlines(keepends=True), "a/setup.py", "b/setup.py")
    )
    (ws / "patches" / "link-cublas.patch").write_text(patch)
    (ws / "patches" / "series.toml").write_text(
        f'[[patch]]\nfile = "link-cublas.patch"\ntarget = "{case}"\n'
    )
    again = _build(tmp_path / "again", ws, cases.mirrors, build_python)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "release ready" in again.stderr


def test_a_compiler_out_of_temporary_space_is_fixed_by_pointing_tmpdir_elsewhere(
    tmp_path: Path, build_python: Path, small_fs
) -> None:
    """compiler-cannot-write's "point TMPDIR (the compilers' temporary files) ... at a disk
    with room, and rerun", applied: the recipe's TMPDIR on a 64 KiB file system fails nvcc
    with its own fatal error; pointed at a folder with room, the same build releases."""
    cases = landing.make(tmp_path / "landing")
    full = small_fs("64k")
    recipe = landing.vendor("good", cases.commits["good"])
    recipe["build"]["env"] = {**recipe["build"].get("env", {}), "TMPDIR": str(full)}
    ws = write(tmp_path / "ws", {"good": recipe}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 6, res.stderr[-3000:]
    # the compiler's own words first (before this, kiln's libcuda stub failing to compile
    # there was a traceback of the step, cause null)
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"  cause: the compiler could not write its temporary files (TMPDIR: {full})" in (
        res.stderr
    )
    assert "No space left on device" in res.stderr
    fix = printed_fixes(res.stderr)["good"]
    assert "point TMPDIR at a writable folder with room (the compilers' temporary files)" in fix, (
        fix
    )
    roomy = tmp_path / "tmp"
    roomy.mkdir()
    _edit(
        ws / "vendors" / "good.toml", lambda d: d["build"]["env"].__setitem__("TMPDIR", str(roomy))
    )
    again = _build(tmp_path, ws, cases.mirrors, build_python)
    assert again.returncode == 0, again.stderr[-3000:]


def test_an_import_over_its_time_limit_releases_with_the_limit_raised_as_printed(
    tmp_path: Path, build_python: Path
) -> None:
    """import-timeout's "raise build.import_proof.timeout_s in vendors/X.toml if it is only
    slow", applied to an import that takes 3 s under a 1 s limit: the next build proves the
    kept wheel alone (nothing compiled again) and releases."""
    cases = landing.make(tmp_path / "landing")
    recipe = landing.vendor("slow", cases.commits["slow"], import_proof={"timeout_s": 1})
    ws = write(tmp_path / "ws", {"slow": recipe}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 18, res.stderr[-3000:]
    fix = printed_fixes(res.stderr)["slow"]
    assert "raise build.import_proof.timeout_s in vendors/slow.toml if it is only slow" in fix
    _edit(
        ws / "vendors" / "slow.toml",
        lambda d: d["build"]["import_proof"].__setitem__("timeout_s", 30),
    )
    again = _build(tmp_path, ws, cases.mirrors, build_python)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "building (jobs" not in again.stderr  # the proof alone: the wheel was kept


def test_a_package_that_raises_at_import_releases_with_the_skip_as_printed(
    tmp_path: Path, build_python: Path
) -> None:
    """raises-at-import (issue 55 (3): a raising ``__init__``): the printed
    ``import_proof.skip = { ... }``, its REASONs filled in and pasted into [build] as
    printed, and the next build proves the kept wheel without those imports and releases."""
    cases = landing.make(tmp_path / "landing")
    ws = write(
        tmp_path / "ws",
        {"raises": landing.vendor("raises", cases.commits["raises"])},
        profile=PROFILE_NO_TORCH,
    )
    res = _build(tmp_path, ws, cases.mirrors, build_python)
    assert res.returncode == 18, res.stderr[-3000:]
    fix = printed_fixes(res.stderr)["raises"]
    said = re.search(r"with the reason: (import_proof\.skip = \{.*\}) in \[build\] of", fix)
    assert said, fix
    line = said[1].replace('"REASON"', '"configured for another cluster at import"')
    recipe = ws / "vendors" / "raises.toml"
    text = recipe.read_text()
    recipe.write_text(text.replace("[build]\n", f"[build]\n{line}\n", 1))
    assert tomllib.loads(recipe.read_text())["build"]["import_proof"]["skip"]
    again = _build(tmp_path, ws, cases.mirrors, build_python)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "release ready" in again.stderr


def test_a_setup_import_given_as_the_vendors_own_build_tools_releases(
    tmp_path: Path, build_python: Path
) -> None:
    """setup-import (tests/landing.py ``setup-helper``: setup.py imports kiln_setup_helper,
    a distribution the build venv lacks): the printed fix names the vendor's own
    build.build_tools; applied as printed (its version pinned to what the wheelhouse
    offers), the helper is installed for this vendor alone and the build releases, with
    the shared build venv untouched."""
    cases, ws, wheelhouse = landing.setup_helper_workspace(tmp_path, PROFILE_NO_TORCH)
    offline_pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    res = _build(tmp_path, ws, cases.root / "mirrors.toml", build_python, env=offline_pip)
    assert res.returncode == 6, res.stderr[-3000:]
    fix = printed_fixes(res.stderr)["setup-helper"]
    m = re.search(
        r"in vendors/setup-helper\.toml \(installed for this vendor's build alone\), "
        r"e\.g\. build_tools = (\[.*?\])",
        fix,
    )
    assert m, fix
    tools = [t.replace("VERSION", "1.0") for t in json.loads(m[1])]
    assert tools == ["kiln_setup_helper==1.0"], tools
    _edit(
        ws / "vendors" / "setup-helper.toml",
        lambda d: d["build"].__setitem__("build_tools", tools),
    )
    fixed = _build(tmp_path, ws, cases.root / "mirrors.toml", build_python, env=offline_pip)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "release ready" in fixed.stderr
    probe = subprocess.run(
        [str(build_python), "-c", "import kiln_setup_helper"], capture_output=True, text=True
    )
    assert probe.returncode != 0  # the shared build venv is as it was
    manifest = json.loads((tmp_path / "artifacts/test-release/manifest.json").read_text())
    recipe = manifest["vendors"]["setup-helper"]["recipe"]
    assert recipe["build_tools"] == ["kiln_setup_helper==1.0"]
    script = (tmp_path / "artifacts/test-release/build-test-release.sh").read_text()
    assert "#     build tools (first on PYTHONPATH): kiln_setup_helper==1.0" in script
