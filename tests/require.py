"""A test whose resource is missing skips on a developer's machine, and fails where the
resource must be there: ``.ci/run`` installs and starts everything the tests need and sets
``KILN_REQUIRE_ALL=1`` (or one ``KILN_REQUIRE_<NAME>=1``), so a skip there is a bug."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required(name: str) -> bool:
    """Whether the resource ``name`` (DOCKER, BUNDLES, FLEET, CGROUP, ROOT, CHROMIUM, CCACHE,
    SOFTHSM) must be here."""
    return "1" in (os.environ.get("KILN_REQUIRE_ALL"), os.environ.get(f"KILN_REQUIRE_{name}"))


def missing(name: str, reason: str) -> NoReturn:
    """Skip for ``reason``, or fail where ``name`` is required."""
    if required(name):
        pytest.fail(f"KILN_REQUIRE_{name} (or _ALL) is set but {reason}")
    pytest.skip(reason)
