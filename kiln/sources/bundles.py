"""Upstreams from git bundles: the offline hand-over of a firewall (``--bundles DIR``).

A workspace's ``bundles.toml`` says which bundle file holds which upstream URL::

    [bundles]
    "https://github.com/ORG/NAME" = "NAME.bundle"
    "https://github.com/NVIDIA/cutlass.git" = "cutlass.bundle"

kiln turns each bundle of ``DIR`` into a bare repository (once per bundle content) and
writes a mirrors file that maps each URL to it; the build then reaches them through
kiln's mirrors, offline, exactly as it would reach an internal mirror.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from kiln.config.workspace import read_toml
from kiln.errors import ConfigError, SourceError
from kiln.fsutil import sha256_file
from kiln.sources.git import git

log = logging.getLogger("kiln.bundles")

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


def _bare_from(bundle: Path, repo: Path) -> None:
    """``repo``: a bare clone of ``bundle``, made beside and renamed into place."""
    digest = sha256_file(bundle)
    if (repo / MARKER).is_file() and (repo / MARKER).read_text() == digest:
        return
    repo.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{repo.name}-", dir=repo.parent))
    try:
        git("clone", "--quiet", "--mirror", "--", bundle, tmp / "repo", what=f"unbundling {bundle}")
        (tmp / "repo" / MARKER).write_text(digest)
        if repo.exists():
            shutil.rmtree(repo)
        os.rename(tmp / "repo", repo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def mirrors_from_bundles(workspace: Path, bundles_dir: Path, dest: Path) -> Path:
    """Bare repositories for every bundle the workspace names; returns the mirrors file."""
    rules = read_spec(workspace)
    dest = dest.resolve()
    lines = ["# made by kiln from git bundles (--bundles); do not edit", "[mirrors]"]
    for url, name in sorted(rules.items()):
        bundle = bundles_dir / name
        if not bundle.is_file():
            raise SourceError(
                f"{workspace / SPEC_FILE}: {url}: bundle {bundle} not found: put it there "
                f"or point --bundles at the folder that holds it"
            )
        repo = dest / (bundle.stem + ".git")
        _bare_from(bundle, repo)
        lines.append(f'"{url}" = "{repo}"')
    mirrors = dest / "mirrors.toml"
    mirrors.write_text("\n".join(lines) + "\n")
    log.info("upstreams from %s as mirrors: %s", bundles_dir, mirrors)
    return mirrors
