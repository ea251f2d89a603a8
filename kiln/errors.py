"""One error family. Each error is one line for people: the thing, the cause, the fix.

The CLI prints ``str(error)`` and exits with ``error.exit_code``; no traceback.
"""

from __future__ import annotations


class KilnError(Exception):
    """Base of every error kiln reports to a user."""

    exit_code = 1


class ConfigError(KilnError):
    """A lock, profile, series or mirror file is malformed."""

    exit_code = 2


class SourceError(KilnError):
    """Fetching, resolving or checking out an upstream failed."""

    exit_code = 3


class PatchError(KilnError):
    """A patch is absent, does not apply, or was already applied."""

    exit_code = 4


class ToolchainError(KilnError):
    """A compiler, interpreter or tool is missing or of the wrong version."""

    exit_code = 5


class BuildError(KilnError):
    """A build command failed."""

    exit_code = 6


class VerifyError(KilnError):
    """A built artifact is not what the recipe asked for."""

    exit_code = 7


class ManifestError(KilnError):
    """A manifest is malformed, or a file no longer matches it."""

    exit_code = 8


class PreflightError(KilnError):
    """The machine cannot run this build; every reason found is listed at once."""

    exit_code = 9

    def __init__(self, headline: str, problems: list[str], advice: str) -> None:
        body = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{headline}\n{body}\n{advice}")
        self.problems = problems


class DiskFull(KilnError):
    """A write failed for lack of space (ENOSPC) or quota (EDQUOT)."""

    exit_code = 13


class Interrupted(KilnError):
    """The user or the system stopped the run (SIGINT/SIGTERM)."""

    exit_code = 130


class Busy(KilnError):
    """Another kiln build holds the artifacts or work folder."""

    exit_code = 15
