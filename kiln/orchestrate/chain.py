"""A typed sequence of stages: each stage turns the value before it into the next (its
resources on the build's exit stack), and says what it would do in a dry run. A chain is
typed from its first stage's value to its last one's, so mypy refuses a stage put where
the value before it is not the one it takes (:mod:`kiln.orchestrate.stages` is the
build's chain)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")
Next = TypeVar("Next")
S = TypeVar("S")  # what the dry run has said so far

# the build: the value before -> the next (its resources on the build's exit stack)
Does = Callable[[In, contextlib.ExitStack], Out]


@dataclass(frozen=True)
class Stage(Generic[In, Out, S]):
    name: str
    does: Does[In, Out]
    # the dry run: what it would do, and its refusals, added to what was said before
    says: Callable[[S], S]


@dataclass(frozen=True)
class Chain(Generic[In, Out, S]):
    """Stages run one after another, typed from the first one's value to the last one's:
    ``chain.then(stage)`` type-checks only where ``stage`` takes what ``chain`` makes.
    Their names and dry-run sayings are kept in order beside."""

    names: tuple[str, ...]
    says: tuple[Callable[[S], S], ...]
    does: Does[In, Out]

    @staticmethod
    def of(stage: Stage[In, Out, S]) -> Chain[In, Out, S]:
        return Chain((stage.name,), (stage.says,), stage.does)

    def then(self, stage: Stage[Out, Next, S]) -> Chain[In, Next, S]:
        first, second = self.does, stage.does

        def does(value: In, stack: contextlib.ExitStack) -> Next:
            return second(first(value, stack), stack)

        return Chain((*self.names, stage.name), (*self.says, stage.says), does)
