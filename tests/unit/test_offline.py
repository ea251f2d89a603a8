"""--offline is decided once (kiln.sources.origins: --offline, or --bundles, whose bundles
are the whole input) and read from what that decision returns: every other read of the
option is an argument to it (a scan of kiln's source), and a verb given --bundles alone is
offline (a real bundle of a real repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from kiln.sources import origins

KILN = Path(__file__).resolve().parents[2] / "kiln"
# the option as given (Options' field or argparse's): read only to be decided
_GIVEN = re.compile(r"\b(?:opts|args|options)\.offline\b")
_DECIDING = re.compile(r"offline=(?:opts|args)\.offline\b|is_offline\((?:opts|args)\.offline\b")


def test_is_offline_with_offline_or_bundles() -> None:
    assert not origins.is_offline(False, None)
    assert origins.is_offline(True, None)
    assert origins.is_offline(False, Path("bundles"))


def test_the_option_as_given_is_read_only_by_the_decision() -> None:
    reads = [
        f"{path.relative_to(KILN)}:{n}: {line.strip()}"
        for path in sorted(KILN.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _GIVEN.search(line) and not _DECIDING.search(line)
    ]
    assert reads == [], "--offline read past its decision:\n" + "\n".join(reads)


def test_bundles_alone_make_a_verb_offline(tmp_path: Path) -> None:
    repo = tmp_path / "up"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "f").write_text("x\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    bundles_dir = tmp_path / "bundles"
    bundles_dir.mkdir()
    subprocess.run([*git, "bundle", "create", "-q", str(bundles_dir / "up.bundle"), "main"])
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "bundles.toml").write_text('[bundles]\n"https://example.invalid/up.git" = "up.bundle"\n')
    dry = origins.decide(ws, mirrors=None, offline=False, bundles_dir=bundles_dir, dry=True)
    made = origins.decide(
        ws, mirrors=None, offline=False, bundles_dir=bundles_dir, bundle_mirrors=tmp_path / "m"
    )
    assert dry.offline and made.offline
    assert made.git_cache(tmp_path / "cache").offline
    assert not origins.decide(ws, mirrors=None, offline=False).offline
