"""The house's rules (issue 13), each a test that fails when broken: imports only go down
the stages, ``kiln.inside`` runs with the standard library alone (as in a builder
container, ``python -I -S``), every error and exit code lives in ``kiln/errors.py``, the
committed JSON Schema is the one the manifest's models make, and nothing of one
particular upstream or release is named in the engine."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kiln import errors
from kiln.release import manifest

KILN = Path(__file__).resolve().parents[2] / "kiln"

# Each stage and what it may import (besides itself, the standard library and the
# third-party libraries it uses): a stage is a folder of kiln/ (or a leaf module), and it
# imports only from the layers below its own. The verbs' engines are a folder of their
# own (kiln/verbs/), above every stage; commands/ (each verb's command line) above them.
LAYERS = [
    {"errors"},
    {"fsutil"},
    {"inside"},
    {"config"},
    {"sources", "toolchain"},
    {"plan", "verify", "runners", "release"},
    {"timings"},
    {"orchestrate"},
    {"verbs"},
    {"commands"},
    {"cli"},
    {"__main__"},
]


def _stage(module: str) -> str:
    """``kiln.orchestrate.kinds.wheel`` -> ``orchestrate``."""
    return module.split(".")[1] if module.count(".") else ""


def _rank(stage: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if stage in layer)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kiln"):
            # ``from kiln.verbs import hub_publish`` imports the module kiln.verbs.hub_publish;
            # a name that is no module (kiln/__init__.py's __version__) is its package's
            folder = KILN.joinpath(*node.module.split(".")[1:])
            for a in node.names:
                is_module = (folder / a.name).is_dir() or (folder / f"{a.name}.py").is_file()
                if is_module:
                    found.add(f"{node.module}.{a.name}")
                elif node.module != "kiln":
                    found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kiln.")}
    return found


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(KILN.rglob("*.py")):
        rel = path.relative_to(KILN.parent).with_suffix("")
        name = ".".join(p for p in rel.parts if p != "__init__")
        out[name] = path
    return out


def layer_violations() -> list[str]:
    bad = []
    for name, path in _modules().items():
        if name == "kiln":
            continue
        mine = _stage(name)
        for imported in _imports(path):
            theirs = _stage(imported)
            if not theirs or theirs == mine:
                continue
            if _rank(theirs) > _rank(mine) or (_rank(theirs) == _rank(mine) and theirs != mine):
                bad.append(f"{name} imports {imported} ({mine} may not use {theirs})")
    return bad


def test_imports_only_go_down_the_stages() -> None:
    assert layer_violations() == []


def test_the_layer_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of config/ that imports orchestrate/, and a stage that imports a verb's
    engine: named."""
    fake = tmp_path / "kiln"
    (fake / "config").mkdir(parents=True)
    (fake / "orchestrate").mkdir()
    (fake / "release").mkdir()
    (fake / "config" / "bad.py").write_text("from kiln.orchestrate import pipeline\n")
    (fake / "orchestrate" / "pipeline.py").write_text("")
    (fake / "verbs").mkdir()
    (fake / "release" / "files.py").write_text("from kiln.verbs import hub_publish\n")
    (fake / "verbs" / "hub_publish.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "KILN", fake)
    assert layer_violations() == [
        "kiln.config.bad imports kiln.orchestrate.pipeline (config may not use orchestrate)",
        "kiln.release.files imports kiln.verbs.hub_publish (release may not use verbs)",
    ]


INSIDE_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
before = set(sys.modules)
import kiln.inside.__main__, kiln.inside.step, kiln.inside.facts, kiln.inside.proc
import kiln.inside.memwatch
import kiln.inside.kit.objcache, kiln.inside.kit.compilegate, kiln.inside.kit.cudashim
import kiln.inside.kit.pipcuda, kiln.inside.kit.patchapply, kiln.inside.kit.rebuild
loaded = {m.split(".")[0] for m in set(sys.modules) - before}
print(" ".join(sorted(loaded - set(sys.stdlib_module_names) - {"kiln"})))
"""


def test_inside_needs_the_standard_library_alone() -> None:
    """As a builder container runs it: isolated, no site-packages (``-I -S``)."""
    res = subprocess.run(
        [sys.executable, "-I", "-S", "-c", INSIDE_PROBE, str(KILN.parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.strip() == ""


def test_inside_runs_its_probe_isolated(tmp_path: Path) -> None:
    code = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "sys.argv = ['kiln.inside', 'probe', '--python', sys.executable]; "
        "runpy.run_module('kiln.inside', run_name='__main__')"
    )
    res = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(KILN.parent)],
        capture_output=True,
        text=True,
        check=False,
    )
    facts = json.loads(res.stdout.strip().splitlines()[-1])
    assert facts["python_path"] == sys.executable and "cuda_home" in facts


def _error_classes() -> list[tuple[str, str]]:
    """(module, class) of every class deriving from a kiln error, anywhere in kiln/."""
    found = []
    names = {c.__name__ for c in errors._all(errors.KilnError)}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                if bases & (names | {"KilnError"}):
                    found.append((name, node.name))
    return found


def test_every_error_and_exit_code_is_in_one_table() -> None:
    outside = [f"{m}.{c}" for m, c in _error_classes() if m != "kiln.errors"]
    assert outside == []
    codes: dict[int, str] = {}
    for code, name, _ in errors.table():
        cls = getattr(errors, name)
        if cls.exit_code == getattr(cls.__mro__[1], "exit_code", None) and name != "KilnError":
            continue  # a refinement of its parent (MergeError, FetchFailed): the same code
        assert code not in codes, f"exit code {code}: {codes.get(code)} and {name}"
        codes[code] = name
    doc = errors.__doc__ or ""
    for code, name in codes.items():
        assert re.search(rf"\| {code} \| {name}\b", doc), f"{name} ({code}) missing from the table"


def test_the_committed_schema_is_the_models_schema() -> None:
    assert manifest.committed_schema_text() == manifest.schema_text(), (
        "kiln/schemas/manifest.schema.json is stale: "
        "python -m kiln manifest schema > kiln/schemas/manifest.schema.json"
    )


# Names of the release kiln was made for, and of its upstreams: they belong in vendors/,
# kiln.toml and examples/, never in the engine.
FOREIGN = re.compile(
    r"deepinfer|deepgemm|deep_gemm|deepep|deep_ep|flashmla|flash_mla|deepselect|tilelang|"
    r"inferencekey|prefixcache|/workspace\b|DG_JIT|TILELANG",
    re.IGNORECASE,
)


def foreign_names(root: Path) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".sh", ".json", ".txt", ".in"):
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if FOREIGN.search(line):
                    hits.append(f"{path.relative_to(root)}:{i}: {line.strip()[:80]}")
    return hits


def test_nothing_of_deepinfer_or_its_upstreams_in_the_engine() -> None:
    assert foreign_names(KILN) == []


def test_the_foreign_name_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "readme.py").write_text('EXPORT = "DG_JIT_CACHE_DIR=/workspace/x"\n')
    assert len(foreign_names(tmp_path)) == 1


def test_every_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    """tests/conftest.py gives each test a pytest-timeout limit (a hang fails its own test
    instead of CI's 90 minutes), tight in tests/unit/."""
    items = request.session.items
    limits = {item.nodeid: item.get_closest_marker("timeout") for item in items}
    assert all(limits.values()), [n for n, m in limits.items() if m is None]
    own = limits[request.node.nodeid]
    assert own is not None and own.args[0] <= 120


def test_no_package_of_the_engine_is_named_build() -> None:
    """Tools treat ``build/`` folders as output (.gitignore, setuptools, code maps): a
    package of that name is not drawn (issue 36)."""
    assert [p for p in KILN.rglob("build") if p.is_dir()] == []


@pytest.mark.timeout(300)
def test_building_kiln_itself_writes_nothing_into_build(tmp_path: Path) -> None:
    """``build/`` is the workspace's scratch space; setuptools' lib/ and bdist.*/ from
    building kiln go to .kiln-self-build/ (setup.cfg)."""
    repo = KILN.parent
    copy = tmp_path / "repo"
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True
    ).stdout.split(b"\0")
    for rel in filter(None, files):
        src, dest = repo / rel.decode(), copy / rel.decode()
        if src.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", tmp_path / "w"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in (copy / "build").iterdir()) == ["README.md"]
    assert (copy / ".kiln-self-build" / "lib" / "kiln").is_dir()


def aliased_as_other_modules(root: Path) -> list[str]:
    """``from kiln.release import files as release``: a module given the name of another
    module or package of kiln (the reader looks for the wrong file)."""
    names = {p.stem for p in root.rglob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in root.rglob("*") if p.is_dir() and (p / "__init__.py").is_file()}
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for a in node.names:
                    if a.asname and a.asname != a.name and a.asname in names:
                        bad.append(
                            f"{path.relative_to(root)}:{node.lineno}: {a.name} as {a.asname}"
                        )
    return bad


def test_no_module_is_imported_under_another_modules_name() -> None:
    assert aliased_as_other_modules(KILN) == []


def test_the_alias_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "__init__.py").write_text("")
    (tmp_path / "release" / "files.py").write_text("")
    (tmp_path / "merge.py").write_text("from kiln.release import files as release\n")
    assert aliased_as_other_modules(tmp_path) == ["merge.py:1: files as release"]


def shared_file_names(root: Path) -> list[str]:
    """File names two modules of ``root`` share (a package's ``__init__.py`` and
    ``__main__.py`` aside): ``commands/lock.py`` beside ``sources/lock.py`` reads as one
    module in a traceback, a search or an editor's tab."""
    seen: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(root)))
    return [f"{name}: {', '.join(paths)}" for name, paths in seen.items() if len(paths) > 1]


def named_like_tests(root: Path) -> list[str]:
    """Modules whose names test runners and tools that skip tests take for tests."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name.startswith("test_") or p.stem.endswith("_test")
    )


def loggers_not_from_their_module(root: Path) -> list[str]:
    """``logging.getLogger("kiln.x")`` outside cli.py (kiln's own root logger): a name
    written by hand outlives a rename; ``__name__`` cannot."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "cli.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"^log\s*=\s*logging\.getLogger\((?!__name__\))", line):
                found.append(f"{path.relative_to(root)}:{n}")
    return found


def test_no_two_modules_share_a_file_name_or_look_like_tests() -> None:
    assert shared_file_names(KILN) == []
    assert named_like_tests(KILN) == []
    assert loggers_not_from_their_module(KILN) == []


def test_the_name_checks_can_fail(tmp_path: Path) -> None:
    (tmp_path / "commands").mkdir()
    (tmp_path / "sources").mkdir()
    (tmp_path / "commands" / "lock.py").write_text("")
    (tmp_path / "sources" / "lock.py").write_text(
        'import logging\nlog = logging.getLogger("kiln.x")\n'
    )
    (tmp_path / "verify_test.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "sources" / "__init__.py").write_text("")
    assert shared_file_names(tmp_path) == ["lock.py: commands/lock.py, sources/lock.py"]
    assert named_like_tests(tmp_path) == ["verify_test.py"]
    assert loggers_not_from_their_module(tmp_path) == ["sources/lock.py:2"]


# Command lines of processes that run where builds run (a builder container, an installed
# tree), standard library alone: kiln's commands/ cannot be imported there.
OWN_COMMAND_LINES = ("inside/__main__.py", "inside/kit/rebuild.py")


def argparse_outside_commands(root: Path) -> list[str]:
    """Modules that parse a command line outside ``commands/`` and ``cli.py`` (and the
    processes above): a command line is a verb's, in its room."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "cli.py" or rel.startswith("commands/") or rel in OWN_COMMAND_LINES:
            continue
        tree = ast.parse(path.read_text())
        if any(
            (isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names))
            or (isinstance(n, ast.ImportFrom) and n.module == "argparse")
            for n in ast.walk(tree)
        ):
            found.append(rel)
    return found


def test_command_lines_are_parsed_only_in_commands() -> None:
    assert argparse_outside_commands(KILN) == []


def test_the_command_line_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "pages.py").write_text("import argparse\n")
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "pages.py").write_text("import argparse\n")
    assert argparse_outside_commands(tmp_path) == ["config/pages.py"]
