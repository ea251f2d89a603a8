"""A team's extension from ``kiln add`` to a proven wheel with zero hand edits (issue 40):
for each upstream of a corpus nobody wrote for kiln, ``kiln add`` then ``kiln build``,
nothing edited in between, each in a workspace of its own, offline from the corpus's
repositories through kiln's mirrors.

The corpus is a folder of git repositories (``NAME.git``, bare or not: fetch them
outside this repository; never commit upstream code) and an optional ``corpus.toml``
naming, per repository, the revision to add and its build shape::

    [extension-cpp]
    rev = "0ec4969"
    shape = "torch BuildExtension setup.py"

Printed per upstream (and written to ``--out`` as ``onboarding.md`` and
``results.json``): the commit it resolved to, the recipe add drafted (kind and
arch_control), add's seconds, the time to the first proven wheel (the build's wall when
it released; the first line of its refusal otherwise), the compiles it ran (the
compiler wrapper's records: ``*.jobs``), the compiles repeated (a unit compiled more
than once), and the archs kiln's own cuobjdump reads from every shared object of the
release. The target: every one a proven wheel with exactly the profile's archs, zero
hand edits, zero repeated compiles; or a refusal within its first compile that says why.

    python benchmarks/onboarding.py --corpus DIR [--cache .kiln-cache] [--root build/onboarding]
        [--names a,b] [--kiln-toml FILE] [--out DIR] [-- extra kiln build/add arguments]

``--kiln-toml``: the workspaces' kiln.toml (default: a release of the profile below:
CUDA 13.2 from PyPI, ``--toolchain pypi`` unless the extra arguments name another,
Python 3.11, torch 2.14.1, sm_100a and sm_103a). ``nox -s
bench_onboarding -- --corpus DIR``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import kilnrun  # noqa: E402

from kiln.plan import jobs  # noqa: E402
from kiln.release import manifest as manifest_io  # noqa: E402
from kiln.verbs.add import default_name  # noqa: E402
from kiln.verify.binaries import device_archs  # noqa: E402

BASE_URL = "https://corpus.invalid/"
KILN_TOML = """\
[release]
name = "onboarding-{name}"

[profile]
cuda = "13.2"
python = "3.11"
torch = "2.14.1+cu130"
archs = ["sm_100a", "sm_103a"]
build_tools = ["setuptools==80.9.0", "wheel==0.45.1", "ninja==1.13.0", "packaging==26.4"]
"""


@dataclass
class Row:
    name: str
    shape: str
    commit: str = ""
    recipe: str = ""
    add_s: float | None = None
    proven_s: float | None = None
    compiles: int = 0
    repeated: int = 0
    archs: dict[str, list[str]] = field(default_factory=dict)
    result: str = ""

    def cells(self) -> list[str]:
        archs = sorted({a for found in self.archs.values() for a in found})
        return [
            self.name,
            self.shape,
            self.commit[:12],
            self.recipe,
            f"{self.add_s:.1f}" if self.add_s is not None else "-",
            f"{self.proven_s:.1f}" if self.proven_s is not None else "-",
            str(self.compiles),
            str(self.repeated),
            ", ".join(archs) or "-",
            self.result,
        ]


HEADER = [
    "upstream",
    "shape",
    "commit",
    "recipe",
    "add s",
    "to proven wheel s",
    "compiles",
    "repeated",
    "archs (cuobjdump)",
    "result",
]


def corpus_entries(corpus: Path, names: list[str] | None) -> dict[str, dict[str, str]]:
    """NAME -> {rev, shape} for every ``NAME.git`` of the corpus (``corpus.toml`` adds
    the revision and shape; ``names`` picks)."""
    listed: dict[str, dict[str, str]] = {}
    meta = corpus / "corpus.toml"
    if meta.is_file():
        listed = {k: dict(v) for k, v in tomllib.loads(meta.read_text()).items()}
    found = sorted(p.name.removesuffix(".git") for p in corpus.glob("*.git"))
    if not found:
        sys.exit(f"{corpus}: no NAME.git repositories (fetch the corpus there first)")
    chosen = [n for n in found if names is None or n in names]
    return {n: {"rev": "", "shape": "", **listed.get(n, {})} for n in chosen}


def corpus_mirrors(corpus: Path) -> str:
    """kiln's mirrors file for the corpus: its repositories under the corpus's made-up
    URL, and what the corpus's own ``mirrors.toml`` adds (its submodules' hosts, folders
    relative to the corpus)."""
    table = {BASE_URL: f"{corpus}/"}
    own = corpus / "mirrors.toml"
    if own.is_file():
        for url, folder in tomllib.loads(own.read_text()).get("mirrors", {}).items():
            table[url] = str((corpus / folder).resolve()) + "/"
    return "[mirrors]\n" + "".join(f'"{url}" = "{folder}"\n' for url, folder in table.items())


def _kiln(args: list[str], log: Path) -> tuple[int, float, str]:
    return kilnrun.run(args, log)


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("kiln: error:")]
    picked = errors[0] if errors else (lines[-1] if lines else "no output")
    return picked.removeprefix("kiln: error:").strip()[:160]


def compile_counts(logs: Path) -> tuple[int, int]:
    """(units compiled, units compiled more than once) from the wrapper's records: a
    unit is a source with its command line (one source built into two modules with other
    flags is two units; the same command twice is one unit compiled again)."""
    compiled = [
        (j.get("source"), j.get("args_sha"))
        for f in sorted(logs.rglob("*.jobs"))
        for j in jobs.job_stats(f)
        if j.get("result") == "compiled" and j.get("source")
    ]
    twice = sum(1 for n in Counter(compiled).values() if n > 1)
    return len(compiled), twice


def release_archs(release: Path) -> dict[str, list[str]]:
    """Every shared object of the release's wheels and trees -> the SASS archs
    cuobjdump reads (kiln.verify.binaries.device_archs)."""
    out: dict[str, list[str]] = {}
    for wheel in sorted(release.glob("wheels/*.whl")):
        with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
            for member in zf.namelist():
                if member.endswith(".so") or ".so." in member:
                    path = Path(zf.extract(member, tmp))
                    out[f"{wheel.name}:{member}"] = device_archs(path)[0]
    for tarball in sorted(release.glob("*.tar.zst")):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["tar", "--zstd", "-xf", tarball, "-C", tmp], check=True)
            for so in sorted(Path(tmp).rglob("*.so")):
                if ".kiln" not in so.parts:
                    out[f"{tarball.name}:{so.relative_to(tmp)}"] = device_archs(so)[0]
    return out


def onboard(name: str, entry: dict[str, str], args: argparse.Namespace, extra: list[str]) -> Row:
    """``name``: the corpus repository's (any case); its vendor and release names are
    what ``kiln add`` makes of its URL (lowercased: ``FlashInfer`` -> ``flashinfer``)."""
    row = Row(name, entry.get("shape", ""))
    vendor = default_name(f"{BASE_URL}{name}.git")
    ws = args.root / name
    shutil.rmtree(ws, ignore_errors=True)
    (ws / "vendors").mkdir(parents=True)
    (ws / "patches").mkdir()
    template = args.kiln_toml.read_text() if args.kiln_toml else KILN_TOML
    (ws / "kiln.toml").write_text(template.replace("{name}", vendor))
    logs = args.root / f"{name}-logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    # the corpus's repositories through the mirrors (no GitHub); PyPI stays reachable for
    # what add pins (build tools) and the consumer environment (pass -- --offline to cut it)
    where = ["--cache", str(args.cache), "--mirrors", str(args.mirrors)]
    rev = f"@{entry['rev']}" if entry.get("rev") else ""
    rc, row.add_s, err = _kiln(
        ["add", f"{BASE_URL}{name}.git{rev}", "--workspace", str(ws), "--name", vendor,
         "--no-dry-run", *where, *extra],
        logs / "add.log",
    )  # fmt: skip
    if rc != 0:
        row.result = f"add refused (exit {rc}): {_first_error(err)}"
        return row
    recipe = tomllib.loads((ws / "vendors" / f"{vendor}.toml").read_text())
    row.commit = recipe["source"]["commit"]
    build = recipe.get("build", {})
    row.recipe = f"{build.get('kind', '?')}/{build.get('arch_control', 'torch-arch-list')}"
    artifacts = ws / "artifacts"
    rc, wall, err = _kiln(
        ["build", "--workspace", str(ws), "--artifacts", str(artifacts),
         "--work", str(ws / "work"), *where, *extra],
        logs / "build.log",
    )  # fmt: skip
    row.compiles, row.repeated = compile_counts(artifacts / "logs")
    if rc != 0:
        row.result = f"refused (exit {rc}): {_first_error(err)}"
        return row
    release = artifacts / f"onboarding-{vendor}"
    row.proven_s = wall
    row.archs = release_archs(release)
    proven = manifest_io.read(release / "manifest.json").vendors[vendor].outputs
    ok = all(o.import_proof for o in proven if o.kind in ("wheel", "tarball"))
    row.result = "proven" if ok else "released without a proof"
    return row


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a folder of NAME.git repos")
    ap.add_argument("--cache", type=Path, default=REPO / ".kiln-cache")
    ap.add_argument("--root", type=Path, default=REPO / "build" / "onboarding")
    ap.add_argument("--names", default=None, help="comma-separated: only these")
    ap.add_argument("--kiln-toml", type=Path, default=None, help="the workspaces' kiln.toml")
    ap.add_argument("--out", type=Path, default=None, help="write onboarding.md and results.json")
    args = ap.parse_args(argv)
    args.corpus = args.corpus.resolve()
    args.root = args.root.resolve()
    args.root.mkdir(parents=True, exist_ok=True)
    args.mirrors = args.root / "mirrors.toml"
    args.mirrors.write_text(corpus_mirrors(args.corpus))
    if "--toolchain" not in extra:
        extra += ["--toolchain", "pypi"]  # the default profile's CUDA 13.2, as nox -s demo
    entries = corpus_entries(args.corpus, args.names.split(",") if args.names else None)
    rows = []
    for name, entry in entries.items():
        row = onboard(name, entry, args, extra)
        rows.append(row)
        print(" | ".join(row.cells()), flush=True)
    report = table(rows)
    print("\n" + report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "onboarding.md").write_text(report + "\n")
        (args.out / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
