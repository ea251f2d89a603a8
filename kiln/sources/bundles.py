"""Upstreams from git bundles: the offline hand-over of a firewall (``--bundles DIR``).

A workspace's ``bundles.toml`` says which bundle file holds which upstream URL::

    [bundles]
    "https://github.com/ORG/NAME" = "NAME.bundle"
    "https://github.com/NVIDIA/cutlass.git" = "cutlass.bundle"

kiln turns each bundle of ``DIR`` into a bare repository (once per bundle content) and
writes a mirrors file that maps each URL to it; the build then reaches them through
kiln's mirrors, offline, exactly as it would reach an internal mirror. The build does it
in its inputs stage (``orchestrate.pipeline.take_inputs``); ``kiln build --dry-run``
writes nothing: it reads the bundles where they are (:func:`bundle_mirrors`, :func:`heads`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from kiln import fsutil
from kiln.config.workspace import read_toml
from kiln.errors import ConfigError, SourceError
from kiln.fsutil import sha256_file
from kiln.sources.git import git, git_out

log = logging.getLogger(__name__)

SPEC_FILE = "bundles.toml"
MARKER = "kiln-bundle.sha256"


def read_spec(workspace: Path) -> dict[str, str]:
    path = workspace / SPEC_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path}: not found; --bundles needs the workspace's {SPEC_FILE} "
            f'([bundles] "URL" = "FILE.bundle")'
        )
    rules = read_toml(path).get("bundles")
    if (
        not isinstance(rules, dict)
        or not rules
        or not all(isinstance(v, str) and "/" not in v for v in rules.values())
    ):
        raise ConfigError(f"{path}: bundles: must map upstream URLs to bundle file names")
    return rules


def _made(bundle: Path, repo: Path, digest: str | None = None) -> bool:
    marker = repo / MARKER
    return marker.is_file() and marker.read_text() == (digest or sha256_file(bundle))


def unbundled(bundle: Path, dest: Path) -> bool:
    """Whether :func:`mirrors_from_bundles` already made ``bundle``'s mirror in ``dest``."""
    return _made(bundle, dest / (bundle.stem + ".git"))


def _bare_from(bundle: Path, repo: Path) -> None:
    """``repo``: a bare clone of ``bundle``, made beside and renamed into place, under
    its lock (two builds sharing the folder unbundle it once)."""
    digest = sha256_file(bundle)
    fsutil.made_once(
        repo,
        lambda: _made(bundle, repo, digest),
        lambda: _unbundle(bundle, repo, digest),
        f"a mirror of {bundle}",
    )


def _unbundle(bundle: Path, repo: Path, digest: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{repo.name}-", dir=repo.parent))
    try:
        git("clone", "--quiet", "--mirror", "--", bundle, tmp / "repo", what=f"unbundling {bundle}")
        (tmp / "repo" / MARKER).write_text(digest)
        if repo.exists():  # an older bundle's: moved aside first, never seen half-removed
            os.rename(repo, tmp / "old")
        os.rename(tmp / "repo", repo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bundle_files(workspace: Path, bundles_dir: Path) -> dict[str, Path]:
    """Upstream URL -> its bundle file, each checked to be there (else the build's error)."""
    rules = read_spec(workspace)
    found = {}
    for url, name in sorted(rules.items()):
        bundle = bundles_dir / name
        if not bundle.is_file():
            raise SourceError(
                f"{workspace / SPEC_FILE}: {url}: bundle {bundle} not found: put it there "
                f"or point --bundles at the folder that holds it"
            )
        found[url] = bundle.resolve()
    return found


def mirrors_from_bundles(workspace: Path, bundles_dir: Path, dest: Path) -> Path:
    """Bare repositories for every bundle the workspace names; returns the mirrors file."""
    dest = dest.resolve()
    lines = ["# made by kiln from git bundles (--bundles); do not edit", "[mirrors]"]
    for url, bundle in bundle_files(workspace, bundles_dir).items():
        repo = dest / (bundle.stem + ".git")
        _bare_from(bundle, repo)
        lines.append(f'"{url}" = "{repo}"')
    mirrors = dest / "mirrors.toml"
    fsutil.write_atomic(mirrors, "\n".join(lines) + "\n")
    log.info("upstreams from %s as mirrors: %s", bundles_dir, mirrors)
    return mirrors


def is_bundle(path: Path) -> bool:
    """Whether ``path`` is a git bundle file (its first line says so)."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(64)
    except OSError:  # absent, or a folder
        return False
    return first in (b"# v2 git bundle\n", b"# v3 git bundle\n")


def heads(bundle: Path) -> dict[str, str]:
    """The refs a bundle holds (name -> commit), read from its header, nothing written."""
    out = git_out("bundle", "list-heads", bundle, what=f"reading the bundle {bundle}")
    pairs = (line.split(" ", 1) for line in out.splitlines() if " " in line)
    return {ref: sha for sha, ref in pairs}
