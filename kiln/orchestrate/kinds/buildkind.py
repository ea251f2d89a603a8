"""What every build kind is: the :class:`BuildKind` protocol and the :class:`Job` it is
given (the registry of kinds is :data:`kiln.orchestrate.kinds.KINDS`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

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


# A vendor TOML's build.kind (kiln.config.models.Build.kind): one module each.
KindName = Literal["wheel", "inplace"]


class BuildKind(Protocol):
    @property
    def name(self) -> KindName:
        """Its build.kind."""
        ...

    def out_dir(self, stage: Path, vendor: Vendor, tree: Path) -> Path:
        """Where the step leaves what it made."""
        ...

    def outputs(self, job: Job) -> list[Output]:
        """Run the step, verify what it made, put it into the release ``stage``."""
        ...
