"""docs/design.md is the map of the code (issue 36): every path and name it cites exists,
and its layout table names every module of kiln/. A rename that forgets the map fails
here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from tests.conftest import REPO

KILN = REPO / "kiln"
DESIGN = REPO / "docs" / "design.md"
# written by building kiln itself (setup.cfg), never in git
NOT_IN_GIT = {".kiln-self-build/"}
# the project's shared notes beside the checkout (shared/design.md), not in this repository
OUTSIDE = ("shared/",)


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def dotted_problems(text: str) -> list[str]:
    """``kiln.a.b.Name``: the longest importable module, then attributes."""
    bad = []
    for name in sorted(set(re.findall(r"\bkiln(?:\.[A-Za-z_]\w*)+", text))):
        parts = name.split(".")
        if parts[-1] in ("toml", "json", "md", "py", "txt"):
            continue  # a file's name (kiln.toml), not a module's
        for cut in range(len(parts), 0, -1):
            try:
                obj: object = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    bad.append(f"{name}: no {attr}")
                    break
                obj = getattr(obj, attr)
            break
    return bad


def path_problems(text: str, repo: Path) -> list[str]:
    """A cited path with a folder (``kiln/orchestrate/options.py``, ``docs/add.md``,
    ``orchestrate/``): it exists from the repository's root or from kiln/."""
    bad = []
    for tok in _ticked(text):
        tok = tok.split(" ")[0].split("::")[0].rstrip(",;:")
        if tok in NOT_IN_GIT or not re.fullmatch(r"\.?[\w.-]+(/[\w.*-]+)*/?", tok):
            continue
        if "/" not in tok or tok.startswith(("http", ".kiln/", *OUTSIDE)):
            continue
        # from the root, kiln/, tests/, or a package of kiln/ (a table row's kinds/, kit/)
        roots = [repo, repo / "kiln", repo / "tests"]
        roots += [p.parent for p in (repo / "kiln").rglob("__init__.py")]
        if not any((root / tok).exists() for root in roots):
            bad.append(tok)
    return bad


def table_problems(text: str, kiln: Path) -> list[str]:
    """Each row of the layout table: the modules it names are in the folders its first
    cell names (or in kiln/ itself), and every module of kiln/ is named in some row."""
    bad, named = [], set()
    for row in re.findall(r"^\| (.+) \|$", text, re.M):
        cells = [c.strip() for c in row.split(" | ")]
        if len(cells) < 3 or cells[0] in ("level", "---"):
            continue
        folders = [kiln / f.rstrip("/") for f in _ticked(cells[0]) if f.endswith("/")]
        folders.append(kiln)
        for tok in _ticked(cells[2]):
            if not tok.endswith(".py"):
                continue
            found = [p for f in folders for p in f.rglob(Path(tok).name) if str(p).endswith(tok)]
            if not found:
                bad.append(f"{cells[0]}: {tok}")
            named |= {p.resolve() for p in found}
    for path in sorted(kiln.rglob("*.py")):
        if path.name != "__init__.py" and path.resolve() not in named:
            bad.append(f"not in the table: {path.relative_to(kiln)}")
    return bad


def test_every_name_design_md_cites_exists() -> None:
    text = DESIGN.read_text()
    assert dotted_problems(text) == []
    assert path_problems(text, REPO) == []
    assert table_problems(text, KILN) == []


def test_the_design_check_can_fail(tmp_path: Path) -> None:
    kiln = tmp_path / "kiln"
    (kiln / "build").mkdir(parents=True)
    (kiln / "build" / "pipeline.py").write_text("")
    (kiln / "orchestrate").mkdir()
    (kiln / "orchestrate" / "vendor.py").write_text("")
    doc = (
        "`kiln.orchestrate.pipeline.Run` and `kiln.build.pipeline` and `build/learned.py`\n"
        "| `build/` | one build | `pipeline.py`, `options.py` |\n"
    )
    assert dotted_problems(doc) == [
        "kiln.build.pipeline: no build",
        "kiln.orchestrate.pipeline.Run: no Run",
    ]
    assert path_problems(doc, tmp_path) == ["build/learned.py"]
    assert table_problems(doc, kiln) == [
        "`build/`: options.py",
        "not in the table: orchestrate/vendor.py",
    ]
