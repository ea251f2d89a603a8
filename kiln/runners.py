"""Where a build step runs. The host does what needs the network (fetching, lock);
build steps go through a runner. The local runner runs them here: use it inside
the builder image (on a pod) or with a provisioned toolchain on a workstation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kiln import recipes
from kiln.errors import ConfigError

SUPPORTED_KINDS = ("wheel",)


@dataclass(frozen=True)
class BuildStep:
    """Everything one build needs; plain data so a container can receive it as JSON."""

    vendor: str
    kind: str
    python: Path
    tree: Path
    out_dir: Path
    env: dict[str, str]
    log_file: Path


class Runner(Protocol):
    kind: str
    image: str | None

    def build(self, step: BuildStep) -> Path: ...


class LocalRunner:
    kind = "local"
    image: str | None = None

    def build(self, step: BuildStep) -> Path:
        if step.kind != "wheel":
            raise ConfigError(f"{step.vendor}: build kind {step.kind!r} is not supported yet")
        return recipes.build_wheel(
            step.python, step.tree, step.out_dir, step.env, step.log_file, step.vendor
        )


def make_runner(kind: str) -> Runner:
    if kind == "local":
        return LocalRunner()
    raise ConfigError(f"--runner {kind}: unknown runner (choose: local)")
