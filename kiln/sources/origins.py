"""Where a verb's upstream sources come from, decided in one place for every verb
(build, its dry run, add, lock, verify, gpu-test): a mirrors file (``--mirrors``), or
git bundles (``--bundles``: made bare repositories in the work folder, and then offline:
the bundles are the whole input), and ``--offline``. A dry run reads the bundles where
they are (git lists a bundle's heads without unbundling it) and makes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.config.mirrors import Mirrors
from kiln.sources import bundles
from kiln.sources.checkout import GitCache


@dataclass(frozen=True)
class Origins:
    mirrors: Mirrors
    mirrors_file: Path | None  # what the steps and a rebuild read (None: no file)
    offline: bool
    bundle_files: dict[str, Path]  # upstream URL -> its bundle (with --bundles)

    def git_cache(self, cache: Path) -> GitCache:
        """The git cache that fetches from these origins."""
        return GitCache(cache, self.mirrors, self.offline)


def is_offline(offline: bool, bundles_dir: Path | None) -> bool:
    """Whether a verb is offline: ``--offline``, or ``--bundles`` (the bundles are the
    whole input). Decided here alone; :func:`decide` and a dry run that could not decide
    its origins ask it."""
    return offline or bundles_dir is not None


def decide(
    workspace: Path,
    *,
    mirrors: Path | None,
    offline: bool,
    bundles_dir: Path | None = None,
    bundle_mirrors: Path | None = None,
    dry: bool = False,
) -> Origins:
    """The origins of a verb's sources (``bundle_mirrors``: where ``--bundles`` are made
    bare repositories, needed with ``bundles_dir``; ``dry``: made nowhere). Whether the
    verb is offline (:func:`is_offline`) is read from what this returns."""
    offline = is_offline(offline, bundles_dir)
    if bundles_dir is None:
        return Origins(Mirrors.load(mirrors), mirrors, offline, {})
    found = bundles.bundle_files(workspace, bundles_dir)
    if dry:
        return Origins(Mirrors({url: str(b) for url, b in found.items()}), None, offline, found)
    if bundle_mirrors is None:
        raise ValueError("origins.decide: --bundles are made bare repositories where?")
    made = bundles.mirrors_from_bundles(workspace, bundles_dir, bundle_mirrors)
    return Origins(Mirrors.load(made), made, offline, found)
