"""A fix that changes the build environment, resolved before it is printed.

The step finds that the headers of a pinned distribution (torch's NCCL) lack what the
upstream uses; a newer pin in ``build_tools`` beside the profile's torch would end in
``ResolutionImpossible``. So the fix names the real option: the first version of the
pinning distribution (torch) whose own pin is newer, found by a dry resolve of
``torch>CURRENT`` with ``DIST>PINNED`` against the profile's index (pip's own
configuration, the profile's ``torch_index``), for the profile's Python and platform
(manylinux_2_28, torch's tag): metadata only, nothing installed. Where the index cannot be reached
(``--offline``, or no answer) the fix says so and gives the command to run."""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from kiln.config.models import Profile
from kiln.errors import FixEdit, KilnError
from kiln.inside import proc

log = logging.getLogger(__name__)

TIMEOUT_S = 120.0


def requirements(resolve: dict[str, str]) -> list[str]:
    return [
        f"{resolve['pinner']}>{resolve['pinner_version']}",
        f"{resolve['dist']}>{resolve['above']}",
    ]


def pip_command(profile: Profile, reqs: list[str], target: Path, report: Path) -> list[str]:
    index = ["--extra-index-url", profile.torch_index] if profile.torch_index else []
    return [
        sys.executable,
        *("-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--no-input"),
        *("--only-binary=:all:", "--python-version", profile.python),
        *(arg for platform in profile.wheel_platforms for arg in ("--platform", platform)),
        *("--target", str(target), "--report", str(report)),
        *index,
        *reqs,
    ]


def dry_resolve(profile: Profile, reqs: list[str]) -> tuple[dict[str, str], str, str | None]:
    """pip's dry resolve of ``reqs`` on the profile's index: (name -> version of what it
    would install, empty where it did not resolve; pip's output; why pip did not answer)."""
    with tempfile.TemporaryDirectory(prefix="kiln-fixcheck-") as tmp:
        report = Path(tmp) / "report.json"
        try:
            res = proc.run(
                pip_command(profile, reqs, Path(tmp) / "target", report),
                check=False,
                timeout=TIMEOUT_S,
                what="a dry resolve of " + " with ".join(reqs),
            )
        except subprocess.TimeoutExpired:
            return {}, "", f"no answer in {TIMEOUT_S:g} s"
        except (KilnError, OSError) as exc:  # no pip
            return {}, "", str(exc).splitlines()[0]
        got: dict[str, str] = {}
        if res.returncode == 0 and report.is_file():
            got = {
                item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text()).get("install", [])
            }
        return got, res.output or f"exit code {res.returncode}", None


def _last(output: str) -> str:
    return output.strip().splitlines()[-1] if output.strip() else "no output"


# A resolved sentence that replaces the fix instead of joining it (the fix was wrong).
INSTEAD = "instead: "


def distribution(resolve: dict[str, str], profile: Profile, offline: bool) -> str:
    """Whether the module setup.py imports is a distribution pip installs (a dry resolve
    of ``dist`` alone on the profile's index, metadata only): its newest version to pin,
    or, where the index has no such distribution, a replacement of the fix, which asked
    for it in build_tools (issue 41: a fix that could never work)."""
    dist, module = resolve["dist"], resolve.get("module", resolve["dist"])
    by_hand = f"pip install --dry-run {shlex.quote(dist)}"
    if offline:
        return f"not checked that {dist} is a distribution (--offline); to check: {by_hand}"
    got, output, failed = dry_resolve(profile, [dist])
    if failed:
        return f"not checked ({failed}); to check: {by_hand}"
    version = got.get(dist.lower())
    if version:
        return f'the profile\'s index has {dist} {version}: "{dist}=={version}"'
    if "No matching distribution" in output or "(from versions: none)" in output:
        return (
            f"{INSTEAD}no distribution named {dist} is on the profile's index (a dry "
            f"resolve): {module} is not something pip installs into the build venv; it is "
            f"the upstream's own (a submodule not checked out, a file its build generates "
            f"first, a folder setup.py expects on sys.path) or another project's: read what "
            f"setup.py expects there, and give it to the build (a submodule in the vendor "
            f"TOML, a patch)"
        )
    return f"not checked ({_last(output)}); to check: {by_hand}"


_RESOLVED_PIN = re.compile(r'^the profile\'s index has \S+ \S+: "(?P<pin>[^"]+==[^"]+)"$')


def build_tools_edit(resolve: dict[str, str], resolved: str, vendor: str) -> FixEdit | None:
    """Once :func:`distribution` found the version to pin, the setup-import fix is
    mechanical: that pin appended to the vendor's own build.build_tools (the edit
    ``kiln build --fix`` applies; kiln/orchestrate/fixes.py)."""
    m = _RESOLVED_PIN.match(resolved)
    if resolve.get("kind") != "distribution" or not m:
        return None
    return {
        "file": f"vendors/{vendor}.toml",
        "keys": ["build", "build_tools"],
        "append": [m["pin"]],
    }


def check(resolve: dict[str, str], profile: Profile, offline: bool) -> str:
    """One sentence for the fix: the version that pins a newer ``dist``, that none does,
    or why it was not resolved (with the command that would)."""
    if resolve.get("kind") == "distribution":
        return distribution(resolve, profile, offline)
    pinner, dist = resolve["pinner"], resolve["dist"]
    reqs = requirements(resolve)
    asked = " with ".join(reqs)
    by_hand = "pip install --dry-run " + " ".join(shlex.quote(r) for r in reqs)
    if offline:
        return f"not resolved (--offline); to find one: {by_hand}"
    got, output, failed = dry_resolve(profile, reqs)
    if failed:
        return f"not resolved ({failed}); to find one: {by_hand}"
    version, pinned = got.get(pinner.lower()), got.get(dist.lower())
    if version and pinned:
        return (
            f"{pinner} {version} pins {dist} {pinned} (a dry resolve of {asked} on "
            f"the profile's index): set the profile's torch to {version}"
        )
    if f"requirement {reqs[0]} (from versions: none)" in output:
        # the index listed no version at all (unreachable, or not the index torch is on)
        return f"not resolved (the index pip reached lists no {pinner}); to find one: {by_hand}"
    if "ResolutionImpossible" in output or "No matching distribution" in output:
        return f"no {pinner} on the profile's index pins a newer {dist} (a dry resolve of {asked})"
    return f"not resolved ({_last(output)}); to find one: {by_hand}"
