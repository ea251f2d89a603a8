"""The runners kiln has, by name: the one place a runner's name is told apart (as
``kiln/orchestrate/kinds/__init__.py`` is for build kinds). Everything else asks a
runner's :class:`~kiln.runners.protocol.Capabilities`. A new runner is a module with a
class that follows :class:`~kiln.runners.protocol.Runner` (its ``capabilities``
declared), ``available(request)`` and ``make(request)``, and one line in
:data:`RUNNERS`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kiln.errors import ConfigError
from kiln.runners import docker, local
from kiln.runners.protocol import Capabilities, Runner, RunnerRequest


@dataclass(frozen=True)
class RunnerKind:
    # whether ``--runner auto`` may take it for this request (tried in RUNNERS' order)
    available: Callable[[RunnerRequest], bool]
    # the runner for this request; raises ConfigError where it cannot be made
    make: Callable[[RunnerRequest], Runner]
    # what it can do, for records read where no runner is made (a manifest's runner.kind)
    capabilities: Callable[[], Capabilities]


RUNNERS: Final[dict[str, RunnerKind]] = {
    "docker": RunnerKind(docker.available, docker.make, docker.capabilities),
    "local": RunnerKind(local.available, local.make, local.capabilities),
}


def make(choice: str, req: RunnerRequest) -> Runner:
    """The runner ``--runner`` names; ``auto``: the first of :data:`RUNNERS` available."""
    if choice == "auto":
        choice = next(name for name, kind in RUNNERS.items() if kind.available(req))
    kind = RUNNERS.get(choice)
    if kind is None:
        known = ", ".join(["auto", *RUNNERS])
        raise ConfigError(f"--runner {choice}: unknown runner (choose: {known})")
    return kind.make(req)


def capabilities(kind: str) -> Capabilities:
    """What the runner named ``kind`` (as a manifest records it) can do."""
    found = RUNNERS.get(kind)
    if found is None:
        raise ConfigError(f"runner {kind!r}: not a runner kiln has ({', '.join(RUNNERS)})")
    return found.capabilities()


def image_digest(ref: str) -> str:
    """The registry's digest of an image, asked where images live (``kiln lock``)."""
    return docker.image_digest(ref)
