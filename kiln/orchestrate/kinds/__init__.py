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

from typing import Final

from kiln.orchestrate.kinds import inplace, wheel
from kiln.orchestrate.kinds.buildkind import BuildKind, Job, KindName

__all__ = ["KINDS", "BuildKind", "Job", "KindName"]

KINDS: Final[dict[KindName, BuildKind]] = {"wheel": wheel.KIND, "inplace": inplace.KIND}
