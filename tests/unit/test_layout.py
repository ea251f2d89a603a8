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
# third-party libraries it uses). Top-level modules: verbs (anything below them),
# commands/ (a verb's command line: the verbs and below), cli (wires the commands), and
# the leaves errors and fsutil.
LAYERS = [
    {"errors"},
    {"fsutil"},
    {"inside"},
    {"config"},
    {"sources", "toolchain"},
    {"plan", "verify", "runners", "release"},
    {"timings"},
    {"build"},
    {"verbs"},
    {"commands"},
    {"cli"},
    {"__main__"},
]
VERBS = {
    "add",
    "lock",
    "reproduce",
    "merge",
    "publish",
    "rebuild_c",
    "gpu_test",
    "jit_cache",
    "demo",
    "verify_wheel",
}


def _stage(module: str) -> str:
    """``kiln.build.kinds.wheel`` -> ``build``; a verb module -> ``verbs``."""
    part = module.split(".")[1] if module.count(".") else ""
    return "verbs" if part in VERBS else part


def _rank(stage: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if stage in layer)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kiln"):
            if node.module == "kiln":
                # kiln/__init__.py's own names (__version__, version_line) are the root's
                found |= {
                    f"kiln.{a.name}"
                    for a in node.names
                    if (KILN / a.name).is_dir() or (KILN / f"{a.name}.py").is_file()
                }
            else:
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
    """A module of config/ that imports build/: named."""
    fake = tmp_path / "kiln"
    (fake / "config").mkdir(parents=True)
    (fake / "build").mkdir()
    (fake / "config" / "bad.py").write_text("from kiln.build import pipeline\n")
    (fake / "build" / "pipeline.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "KILN", fake)
    assert layer_violations() == [
        "kiln.config.bad imports kiln.build (config may not use build)"
    ] or layer_violations() == [
        "kiln.config.bad imports kiln.build.pipeline (config may not use build)"
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
    codes = {}
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
    assert limits[request.node.nodeid].args[0] <= 120
