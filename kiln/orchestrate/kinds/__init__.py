"""Build kinds: how a vendor's step is run and what it leaves, behind one protocol and
a registry (cibuildwheel's ``platforms/__init__.py`` does so for platforms). A vendor
TOML names its kind (``build.kind``); adding a kind is adding a module here.

- ``wheel``: the tree's wheel with build isolation off (its PEP 517 backend called once,
  :mod:`kiln.inside.pep517`: the wheel ``pip wheel --no-build-isolation`` makes, without
  pip's second run of ``setup.py``); the wheel is re-packed
  under kiln's version label, verified (SASS per shared object, tags, linkage) and
  placed in ``wheels/``.
- ``inplace``: the upstream's own command builds in the tree (an engine's extension);
  the declared outputs are verified, the module imported, and the tree with kiln's kit
  shipped as a deterministic tarball.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kiln.config.models import Vendor
    from kiln.orchestrate.context import Context, Step
    from kiln.release.manifest import Output
    from kiln.sources.checkout import Checkout
    from kiln.sources.patches import AppliedPatch


@dataclass(frozen=True)
class Job:
    """One vendor's build as its kind sees it: the run's context, the recipe, the step to
    run, the release being staged, the checkout, the patches applied, the environment
    kiln and the recipe set (recorded), and the timings to fill in."""

    ctx: Context
    vendor: Vendor
    step: Step
    stage: Path
    co: Checkout
    applied: list[AppliedPatch]
    recorded_env: dict[str, str]
    timings: dict[str, float]


class BuildKind(Protocol):
    name: str

    def out_dir(self, stage: Path, vendor: Vendor, tree: Path) -> Path:
        """Where the step leaves what it made."""
        ...

    def outputs(self, job: Job) -> list[Output]:
        """Run the step, verify what it made, put it into the release ``stage``."""
        ...


def _registry() -> dict[str, BuildKind]:
    from kiln.orchestrate.kinds import inplace, wheel

    return {k.name: k for k in (wheel.KIND, inplace.KIND)}


class _Kinds(dict[str, BuildKind]):
    """``KINDS["wheel"]``: the registry, filled on first use (the kinds import the build
    context, which imports this package)."""

    def _fill(self) -> None:
        if not super().__len__():
            self.update(_registry())

    def __getitem__(self, key: str) -> BuildKind:
        self._fill()
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._fill()
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        self._fill()
        return super().__iter__()


KINDS: dict[str, BuildKind] = _Kinds()
