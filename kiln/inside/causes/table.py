"""The cause table: each part's rows in the order they are tried (the first that
matches wins), and the matching. The rows live by what failed (compile, archs, link,
buildsetup, network, resources; load for the import proof)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from kiln.inside.causes.archs import (
    arch_dropped,
    arch_refused,
    arch_uncovered,
    ptx_instruction,
    unknown_arch,
)
from kiln.inside.causes.buildsetup import setup_import
from kiln.inside.causes.cause import Cause, Diagnosis, Failure, LoadFailure
from kiln.inside.causes.compile import (
    cxx_standard,
    missing_header,
    missing_identifier,
    output_gone,
)
from kiln.inside.causes.link import missing_library, undefined_symbol
from kiln.inside.causes.load import (
    load_abi_mismatch,
    load_left_off_link,
    load_missing_library,
    load_missing_module,
    load_needs_gpu,
    load_never_compiled,
    load_python_error,
    load_timeout,
)
from kiln.inside.causes.network import network_download
from kiln.inside.causes.resources import cannot_write, disk_full, killed

ROWS: tuple[Callable[[Failure], Cause | None], ...] = (
    cannot_write,
    disk_full,
    killed,
    setup_import,
    network_download,
    arch_refused,
    arch_uncovered,
    output_gone,
    arch_dropped,
    ptx_instruction,
    unknown_arch,
    missing_header,
    cxx_standard,
    missing_identifier,
    missing_library,
    undefined_symbol,
)


def explain(
    d: Diagnosis, output: str, env: Mapping[str, str], tree: Path, vendor: str
) -> Cause | None:
    """The first row that knows these errors, or None (the errors alone are shown)."""
    f = Failure(d, output, env, tree, vendor)
    for row in ROWS:
        cause = row(f)
        if cause is not None:
            return cause
    return None


LOAD_ROWS: tuple[Callable[[LoadFailure], Cause | None], ...] = (
    load_timeout,
    load_missing_library,
    load_abi_mismatch,
    load_left_off_link,
    load_never_compiled,
    load_needs_gpu,
    load_missing_module,
    load_python_error,
)


def explain_load(f: LoadFailure) -> Cause:
    """The first import row that knows this failure (always one: the last is general)."""
    for row in LOAD_ROWS:
        cause = row(f)
        if cause is not None:
            return cause
    return Cause(
        "import-failed",
        f"importing {f.module} failed: {f.message}",
        "see the import's output in the log",
    )
