"""What a cause row reads and says: the failed step (:class:`Failure`: its first
errors, output, environment and tree), a failed import (:class:`LoadFailure`), and the
row's answer (:class:`Cause`: the cause, the fix, and the fix as an edit where it is
mechanical)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

from kiln.errors import FailureRecord, FixEdit


@dataclass(frozen=True)
class Cause:
    row: str
    cause: str
    fix: str
    # A fix that changes the build environment, to be resolved (dry) against the profile's
    # index where the index can be reached (the host, kiln/orchestrate/fixcheck.py): the
    # distribution that pins, its version, the pinned one and the version to go above.
    resolve: dict[str, str] | None = None
    # The fix as a structured edit ``kiln build --fix`` applies (kiln/orchestrate/fixes.py):
    # {"file": "vendors/x.toml", "keys": ["build", "env", "X"], "set": value} or "append":
    # [values] to a list; None where the fix needs judgement (then it stays text).
    edit: FixEdit | None = None


def toml_edit(
    vendor: str, keys: list[str], *, set_to: object = None, append: Sequence[object] | None = None
) -> FixEdit:
    """A fix that sets (or appends to) one key of the vendor's TOML."""
    edit: FixEdit = {"file": f"vendors/{vendor}.toml", "keys": keys}
    if append is not None:
        edit["append"] = list(append)
    else:
        edit["set"] = set_to
    return edit


@dataclass(frozen=True)
class ErrorLine:
    """One error as a compiler or linker printed it (``file`` relative to the tree)."""

    message: str
    file: str | None = None
    line: int | None = None
    tool: str = ""  # gcc, nvcc, ptxas, ld, python, ...
    # the template instantiations that lead from the upstream's own code to the error
    # (g++'s "required from", nvcc's "detected during"), cut to the screen
    chain: tuple[str, ...] = ()

    def render(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file and self.line else ""
        where = where or (f"{self.file}: " if self.file else "")
        return f"{where}{self.message}"

    def shown(self) -> str:
        """The error and, under it, its instantiation chain (what the screen shows)."""
        return self.render() + "".join(f"\n      {c}" for c in self.chain)


@dataclass
class Diagnosis:
    """What a failed step's output says: the unit, its first errors, the cause and fix."""

    unit: str | None = None
    errors: list[ErrorLine] = field(default_factory=list)
    command: str | None = None  # the failed unit's command line, when ninja printed it
    cause: Cause | None = None

    def to_json(self) -> FailureRecord:
        data = asdict(self)
        data["errors"] = [asdict(e) | {"text": e.shown()} for e in self.errors]
        return cast(FailureRecord, data)


@dataclass(frozen=True)
class Failure:
    """What a row reads: the diagnosis, the whole output, the step's environment, tree."""

    d: Diagnosis
    output: str
    env: Mapping[str, str]
    tree: Path
    vendor: str

    @property
    def messages(self) -> list[str]:
        return [e.message for e in self.d.errors]


@dataclass(frozen=True)
class LoadFailure:
    """What is known of one failed import."""

    vendor: str
    module: str
    shared_object: str | None  # the extension that failed, as the output holds it
    message: str  # the import's last line
    symbol: str | None = None  # an undefined symbol, mangled
    demangled: str | None = None
    definers: tuple[str, ...] = ()  # libraries of the environment that define it exactly
    # the first definer's folder, $ORIGIN-relative to the extension where both land in
    # site-packages and the definer is not torch's (the loader searches no site-packages)
    definer_runpath: str | None = None
    linked: bool = False  # whether the extension's DT_NEEDED names one of them
    same_name: tuple[str, ...] = ()  # "lib (owner): other signature" of the same name
    dependency: str | None = None  # the dependency whose namespace the symbol is in
    torch_pin: str | None = None  # the torch the output was compiled against
    torch_environment: str | None = None  # the torch the consumer environment holds
    declared_at: tuple[str, ...] = ()  # tree:line of its declarations in headers
    defined_uncompiled: tuple[str, ...] = ()  # tree:line of definitions never compiled
    library: str | None = None  # a library the loader could not open
    library_owner: str | None = None  # the distribution of the environment that has it
    # its folder, $ORIGIN-relative to the extension, where both land in site-packages
    library_runpath: str | None = None
    library_is_torch: bool = False
    python_error: str | None = None
    frame: str | None = None  # the innermost traceback frame
    timed_out: bool = False
    gpu: bool = False  # the output reads like a missing GPU or driver
