"""Every error kiln reports, and its exit code: one table (cibuildwheel's errors.py is
the model). Each error is one line for people: the thing, the cause, the fix.

The CLI (and ``python -m kiln.inside``) prints ``kiln: error: <message>`` and exits with
``error.exit_code``; no traceback. Standard library only: the code that runs in builder
containers raises these too.

| code | error |
| --- | --- |
| 1 | KilnError: any other kiln error (a wrong combination of options) |
| 2 | ConfigError: a TOML, vendor, key, SHA, arch or `KILN_*` variable malformed or unknown |
| 3 | SourceError: an unknown or ambiguous commit, a missing mirror, a failed or stalled fetch |
| 4 | PatchError: a patch that is absent, conflicts, or escapes its tree |
| 5 | ToolchainError: nvcc, the build Python or torch missing or of the wrong version |
| 6 | BuildError: a build command failed (with the log's tail and path), or ran out of memory |
| 7 | VerifyError: a built file is not what the recipe asked (archs, device code, tags, linkage) |
| 8 | ManifestError: a manifest malformed, or files that differ (check, verify, merge) |
| 9 | PreflightError: the machine cannot run this build (every reason listed) |
| 10 | ArchiveError: an archive unreadable, or a member escaping its folder |
| 11 | RebuildError: rebuild-c (not a kiln tree, a patch that does not apply, a failed rebuild) |
| 12 | DockerUnavailable: the Docker daemon cannot be reached |
| 13 | DiskFull: a write failed for lack of space (names the file, the mount, its free space) |
| 14 | PublishError: a release that fails its check, a bad target, no token, the Hub refused |
| 15 | Busy: another kiln build holds the artifacts or work folder (its pid and command named) |
| 16 | GpuTestError: kiln gpu-test could not run, or the upstream's GPU test failed |
| 17 | TimingsError: kiln timings: no such folder, or no build records in it |
| 18 | ImportFailed: a built module does not load where the release lands (import proof) |
| 19 | SignatureError: a release signature missing, by another key, or not matching its files |
| 130 | Interrupted: Ctrl-C or SIGTERM; nothing half-written is left |
"""

from __future__ import annotations

from typing import TypedDict, TypeVar


class FixEdit(TypedDict, total=False):
    """A fix as an edit ``kiln build --fix`` applies (kiln/orchestrate/fixes.py): one key
    of a workspace file (``keys``, from the top table down) set to ``set``, or ``append``
    added to the list there; ``append_lines``: lines added to a text file."""

    file: str
    keys: list[str]
    set: object
    append: list[object]
    append_lines: list[str]


class ErrorEntry(TypedDict, total=False):
    """One error of a failure record: an :class:`ErrorLine`'s fields and ``text``, the
    error as the screen shows it (with its instantiation chain)."""

    text: str
    message: str
    file: str | None
    line: int | None
    tool: str
    chain: list[str]


class CauseEntry(TypedDict, total=False):
    """A failure record's cause: the row of the cause table, what it says and the fix;
    ``resolve``/``resolved``: a fix that changes the build environment and what its dry
    resolve said (``kiln/orchestrate/fixcheck.py``)."""

    row: str
    cause: str
    fix: str
    resolve: dict[str, str] | None
    resolved: str
    edit: FixEdit | None  # the fix as an edit `kiln build --fix` applies


class FailureRecord(TypedDict, total=False):
    """``<vendor>.failure.json``: what a failed step (or import proof) left beside its log,
    read by the first screen, the summary table, GitHub's annotations and the timings
    report. Read from disk: any key may be missing."""

    vendor: str
    unit: str | None
    errors: list[ErrorEntry]
    command: str | None
    cause: CauseEntry | None
    log: str


class KilnError(Exception):
    """Any other error kiln reports (the base of all the rest). Complete when made:
    nothing changes an error once it is raised (:func:`with_message` makes a new one)."""

    exit_code = 1

    def __init__(
        self, *args: object, output: str = "", record: FailureRecord | None = None
    ) -> None:
        super().__init__(*args)
        self.output = output  # a failed command's whole output (read: inside.diagnose)
        # a failed step's failure record (<vendor>.failure.json), read by the summary table
        self.record = record


class ConfigError(KilnError):
    """A lock, profile, series or mirror file, or a KILN_* variable, is malformed."""

    exit_code = 2


class SourceError(KilnError):
    """Fetching, resolving or checking out an upstream failed."""

    exit_code = 3


class FetchFailed(SourceError):
    """A fetch that did not complete.

    ``refused_sha``: the server refused a SHA refspec (kiln then fetches refs)."""

    def __init__(self, message: str, refused_sha: bool) -> None:
        super().__init__(message)
        self.refused_sha = refused_sha


class PatchError(KilnError):
    """A patch is absent, does not apply, or was already applied."""

    exit_code = 4


class ToolchainError(KilnError):
    """A compiler, interpreter or tool is missing or of the wrong version."""

    exit_code = 5


class BuildError(KilnError):
    """A build command failed."""

    exit_code = 6

    def __init__(
        self,
        *args: object,
        output: str = "",
        record: FailureRecord | None = None,
        oom: bool = False,
    ) -> None:
        super().__init__(*args, output=output, record=record)
        self.oom = oom  # the kernel killed it for memory (the runners say so)


class VerifyError(KilnError):
    """A built artifact is not what the recipe asked for."""

    exit_code = 7


class ManifestError(KilnError):
    """A manifest is malformed, or a file no longer matches it."""

    exit_code = 8


class NotReproduced(ManifestError):
    """``kiln verify``: a rebuilt file differs from what the release's manifest records."""


class MergeError(ManifestError):
    """Partial releases that cannot be merged (inconsistent, modified or overlapping)."""


class PreflightError(KilnError):
    """The machine cannot run this build; every reason found is listed at once."""

    exit_code = 9

    def __init__(self, headline: str, problems: list[str], advice: str) -> None:
        body = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{headline}\n{body}" + (f"\n{advice}" if advice else ""))
        self.problems = problems


class ArchiveError(KilnError):
    """An archive is unreadable, or a member would land outside its folder."""

    exit_code = 10


class RebuildError(KilnError):
    """``rebuild-c``: not a kiln tree, a patch that does not apply, a failed rebuild."""

    exit_code = 11


class DockerUnavailable(KilnError):
    """The Docker daemon cannot be reached."""

    exit_code = 12


class DiskFull(KilnError):
    """A write failed for lack of space (ENOSPC) or quota (EDQUOT)."""

    exit_code = 13


class PublishError(KilnError):
    """A release cannot be published (it fails its check, the target or token is wrong)."""

    exit_code = 14


class Busy(KilnError):
    """Another kiln build holds the artifacts or work folder."""

    exit_code = 15


class GpuTestError(KilnError):
    """A GPU test could not run, or ran and failed."""

    exit_code = 16


class TimingsError(KilnError):
    """``kiln timings`` (or ``build --timings``): no build records to draw."""

    exit_code = 17


class ImportFailed(VerifyError):
    """A built module does not load where the release lands (the import proof)."""

    exit_code = 18


class SignatureError(KilnError):
    """A release's signature is missing, not by the given key, or no longer matches it."""

    exit_code = 19


class Interrupted(KilnError):
    """The user or the system stopped the run (SIGINT/SIGTERM)."""

    exit_code = 130


def table() -> list[tuple[int, str, str]]:
    """(exit code, error name, what) for every error: the CLI's help shows it."""
    rows = []
    for cls in _all(KilnError):
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        rows.append((cls.exit_code, cls.__name__, doc))
    return sorted(rows)


def _all(cls: type[KilnError]) -> list[type[KilnError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _all(sub)
    return out


E = TypeVar("E", bound=KilnError)


def with_message(err: E, message: str) -> E:
    """A copy of ``err`` (its class, exit code, output, record) that says ``message``:
    what the pipeline raises for a step's error with the other steps' added, the step's
    own error left as it was raised."""
    new = type(err).__new__(type(err))
    new.__dict__.update(err.__dict__)
    new.args = (message,)
    return new
