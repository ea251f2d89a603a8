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

SUPPORTED_KINDS = ("wheel", "inplace")


@dataclass(frozen=True)
class BuildStep:
    """Everything one build needs; plain data so a container can receive it as JSON."""

    vendor: str
    kind: str
    command: list[str] | None
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
        """The wheel made (kind "wheel") or the tree built in place (kind "inplace")."""
        if step.kind == "inplace":
            assert step.command
            return recipes.run_inplace(
                step.command, step.tree, step.env, step.log_file, step.vendor
            )
        return recipes.build_wheel(
            step.python, step.tree, step.out_dir, step.env, step.log_file, step.vendor
        )


def make_runner(kind: str) -> Runner:
    if kind == "local":
        return LocalRunner()
    raise ConfigError(f"--runner {kind}: unknown runner (choose: local)")
