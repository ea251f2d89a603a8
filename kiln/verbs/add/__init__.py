"""``kiln add URL[@REV]``: a vendor TOML written from reading an upstream's tree.

Flow: resolve REV to a full commit through kiln's git cache and mirrors
(:mod:`kiln.verbs.add.revision`), check it out with its submodules at their gitlinks
(:func:`kiln.sources.checkout.checkout`), read it (:mod:`kiln.verbs.add.scan`: the build
backend, setup.py, the headers its sources reach, licenses), decide every key against
the workspace's profiles (:mod:`kiln.verbs.add.recipe`), check the result as the workspace
would load it under each, and write ``vendors/<name>.toml`` atomically; then the build's
dry run for that vendor (:func:`dry_run`). docs/add.md says how each key is decided.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kiln.config.fields import NAME_RE, WORKSPACE_FILE
from kiln.config.models import Profile, Source
from kiln.config.workspace import Workspace, read_profiles
from kiln.errors import ConfigError, KilnError, ToolchainError
from kiln.inside import proc
from kiln.inside.facts import find_cuda_home, nvcc_version
from kiln.orchestrate import dryrun, fixcheck, stages
from kiln.orchestrate.options import Options, ToolchainChoice
from kiln.release.files import REQUIREMENTS
from kiln.sources import origins
from kiln.sources.checkout import checkout
from kiln.toolchain import buildenv, cudapypi
from kiln.verbs.add import recipe, revision, scan, stdcheck, unitcheck

log = logging.getLogger(__name__)

_PATHS = (
    "import json, sysconfig; p = sysconfig.get_paths(); "
    "print(json.dumps([p['purelib'], p['include']]))"
)


@dataclass(frozen=True)
class Added:
    path: Path  # the vendor TOML written
    name: str
    commit: str
    recipe: recipe.Recipe
    findings: scan.Findings
    checked: list[stdcheck.Tried]  # the drafted standard flags, preprocessed
    compiled: list[unitcheck.Compiled]  # the first units, compiled with the draft


def default_name(url: str) -> str:
    """The repository's name, lowercased, as a vendor name (``DeepThing.git`` ->
    ``deepthing``)."""
    stem = url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")
    if not NAME_RE.match(name):
        raise ConfigError(f"{url}: no vendor name can be made from it; pass --name NAME")
    return name


def _pins(findings: scan.Findings, profile: Profile, offline: bool) -> dict[str, str]:
    """The build tools the tree's build needs and the build venv lacks, resolved together
    on the profile's index (a dry resolve: metadata only): what the build imports (its
    newest version) and what pyproject.toml's ``[build-system] requires`` asks that the
    build venv does not meet, each with its dependencies (the tools are installed
    without them, as a lock: pip's whole install set), less what the build venv already
    holds at the version resolved. None --offline, or where pip does not answer (then
    the draft says what to set)."""
    wanted = [dist for _, dist, _ in findings.build_tool_needs()]
    wanted += findings.build_system_unmet
    if offline or not wanted:
        return {}
    got, said, failed = fixcheck.dry_resolve(profile, wanted)
    if failed or not got:
        lines = said.strip().splitlines()
        errors = [ln for ln in lines if ln.startswith("ERROR:")]
        why = failed or next(iter(errors), lines[-1] if lines else "no output")
        log.warning(
            "build tools %s not resolved on the profile's index (%s): the draft says what to set",
            ", ".join(wanted),
            why,
        )
    pins = {canonicalize_name(k): v for k, v in got.items()}
    return {k: v for k, v in pins.items() if findings.build_venv.get(k) != v}


def add(
    workspace: Path,
    url: str,
    rev: str | None = None,
    name: str | None = None,
    cache: Path = Path(".kiln-cache"),
    mirrors: Path | None = None,
    offline: bool = False,
    force: bool = False,
    *,
    profile: str | None = None,
    python: str | None = None,
    cuda_home: str | None = None,
    check: bool = True,
) -> Path:
    """Write ``<workspace>/vendors/<name>.toml`` for ``url`` at ``rev``; its path."""
    return add_recipe(
        workspace, url, rev, name, cache, mirrors, offline, force,
        profile=profile, python=python, cuda_home=cuda_home, check=check,
    ).path  # fmt: skip


def add_recipe(
    workspace: Path,
    url: str,
    rev: str | None,
    name: str | None,
    cache: Path,
    mirrors: Path | None,
    offline: bool,
    force: bool,
    *,
    profile: str | None = None,
    python: str | None = None,
    cuda_home: str | None = None,
    check: bool = True,
) -> Added:
    """:func:`add`, returning the findings and the decided keys too. ``check``: compile
    the draft's first units before writing it (:mod:`kiln.verbs.add.unitcheck`)."""
    profiles = read_profiles(workspace)
    if profile not in profiles:
        known = ", ".join(str(p) for p in profiles if p) or "none"
        raise ConfigError(
            f"{WORKSPACE_FILE}: --profile {profile}: no [profiles.{profile}] table (known: {known})"
        )
    name = name or default_name(url)
    if not NAME_RE.match(name):
        raise ConfigError(
            f"--name {name!r}: not a vendor name (lowercase letters, digits, '-' and '_')"
        )
    target = workspace / "vendors" / f"{name}.toml"
    if target.exists() and not force:
        raise ConfigError(
            f"{target}: already exists; pass --force to overwrite it (or --name for another)"
        )
    git = origins.decide(workspace, mirrors=mirrors, offline=offline).git_cache(cache)
    commit, how = revision.resolve(git, url, rev, name)
    log.info("%s: %s resolved to %s (%s)", name, rev or "HEAD", commit, how)
    env = _environment(profiles[profile], cache, python, cuda_home)
    with tempfile.TemporaryDirectory(prefix="kiln-add-") as tmp:
        co = checkout(git, Source(url=url, commit=commit), Path(tmp) / name, name)
        findings = scan.scan(co, env)
        findings.pins = _pins(findings, profiles[profile], git.offline)  # as decided
        made = recipe.build(findings, profiles, name, rev, how)
        family = recipe.family_to_check(findings, profiles) if check else []
        if family:  # the compiler says whether the code builds for them, not a rule
            findings.family_checked = unitcheck.family_archs(
                name, made.data.build, findings, env, co.path, family
            )
            made = recipe.build(findings, profiles, name, rev, how)
        _check(workspace, list(profiles), name, made.text)
        checked = stdcheck.check(name, made.data.build, findings, env)
        compiled = (
            unitcheck.check(
                name, made.data.build, findings, env, co.path, cache / "add" / name / "unit-check"
            )
            if check
            else []
        )
    _write(target, made.text)
    log.info("%s: wrote %s", name, target)
    listed = runtime_requirements(workspace, name, findings.requires)
    if listed:
        lock = (workspace / "runtime-requirements.lock").is_file()
        log.info(
            "%s: the wheel requires %s (%s): listed in %s, so install.sh installs them%s",
            name,
            ", ".join(listed),
            findings.requires[0][1],
            REQUIREMENTS,
            "; run `kiln lock` to pin them in runtime-requirements.lock" if lock else "",
        )
    return Added(target, name, commit, made, findings, checked, compiled)


def runtime_requirements(workspace: Path, name: str, requires: list[tuple[str, str]]) -> list[str]:
    """The wheel's stated requirements that the workspace's ``runtime-requirements.txt``
    does not name yet, appended to it (made where missing; torch is left to the profile,
    which install.sh keeps where the file names none): what install.sh installs must hold
    them, or the build refuses the wheel before its compile. Returns the lines added."""
    path = workspace / REQUIREMENTS
    text = path.read_text() if path.is_file() else ""
    named = set()
    for line in text.splitlines():
        try:
            named.add(canonicalize_name(Requirement(line.split("#", 1)[0].strip()).name))
        except InvalidRequirement:
            continue
    new: list[str] = []
    for spec, _where in requires:
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue
        key = canonicalize_name(req.name)
        if (
            key == "torch"
            or key in named
            or (req.marker and not req.marker.evaluate({"extra": ""}))
        ):
            continue
        named.add(key)
        new.append(f"{req.name}{req.specifier}")
    if new:
        head = "" if not text or text.endswith("\n") else "\n"
        body = f"{head}# kiln add {name}: what its wheel requires ({requires[0][1]})\n"
        _write(path, text + body + "".join(f"{line}\n" for line in new))
    return new


def _environment(
    profile: Profile, cache: Path, python: str | None, cuda_home: str | None
) -> scan.Environment:
    """Where the build's headers come from: the build Python (provisioned as a build
    would, once) and the CUDA home a build would use."""
    with tempfile.TemporaryDirectory(prefix="kiln-add-logs-") as logs:
        exe = buildenv.build_python(profile, cache, python, Path(logs))
    purelib, include = json.loads(proc.output([exe, "-c", _PATHS], what="the build Python"))
    home = profile_cuda_home(profile, cache, cuda_home)
    return scan.Environment(
        Path(purelib),
        home if (home / "include").is_dir() else None,
        Path(include) if Path(include).is_dir() else None,
    )


def profile_cuda_home(profile: Profile, cache: Path, explicit: str | None) -> Path:
    """The CUDA home add's checks compile with: the one named (``--cuda-home``,
    ``$CUDA_HOME``), else this machine's where its nvcc is the profile's CUDA (major.minor,
    as a build requires), else the profile's own from PyPI (provisioned once, as a build
    with ``--toolchain pypi`` does): never another CUDA than the build's."""
    if explicit or os.environ.get("CUDA_HOME"):
        return find_cuda_home(explicit)
    home = find_cuda_home(None)
    try:
        found = nvcc_version(home)
    except ToolchainError:
        found = ""
    if found.split(".")[:2] == profile.cuda.split(".")[:2]:
        return home
    try:
        with tempfile.TemporaryDirectory(prefix="kiln-add-logs-") as logs:
            pinned = cudapypi.provision(profile.cuda, cache, Path(logs))
    except KilnError as exc:
        log.warning(
            "the profile's CUDA %s could not be provisioned (%s): add checks with %s's nvcc %s",
            profile.cuda,
            str(exc).splitlines()[0],
            home,
            found or "(none)",
        )
        return home
    log.info(
        "add checks with the profile's CUDA %s (%s), not this machine's %s",
        profile.cuda,
        pinned,
        found or "none",
    )
    return pinned


def _check(workspace: Path, profiles: list[str | None], name: str, text: str) -> None:
    """Load the recipe as the workspace would under each of its profiles, before writing."""
    with tempfile.TemporaryDirectory(prefix="kiln-add-check-") as tmp:
        root = Path(tmp)
        shutil.copyfile(workspace / WORKSPACE_FILE, root / WORKSPACE_FILE)
        (root / "vendors").mkdir()
        (root / "vendors" / f"{name}.toml").write_text(text)
        for profile in profiles:
            try:
                Workspace(root, profile)
            except ConfigError as exc:
                shown = f" (--profile {profile})" if profile else ""
                raise ConfigError(
                    f"vendors/{name}.toml (not written){shown}: {str(exc).splitlines()[0]}"
                ) from None


def _write(target: Path, text: str) -> None:
    """Atomically: a reader sees the old file or the whole new one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is not a recipe's mode
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dry_run(
    workspace: Path,
    name: str,
    cache: Path,
    mirrors: Path | None,
    offline: bool,
    *,
    profile: str | None = None,
    python: str | None = None,
    cuda_home: str | None = None,
    toolchain: ToolchainChoice = "system",
) -> dryrun.DryRun:
    """``kiln build --dry-run`` of the one vendor (the plan as data)."""
    opts = Options(
        workspace=workspace,
        vendors=(name,),
        profile=profile,
        cache=cache,
        mirrors=mirrors,
        offline=offline,
        python=python,
        cuda_home=cuda_home,
        toolchain=toolchain,
    )
    return stages.dry_run(opts)


__all__ = ["Added", "add", "add_recipe", "default_name", "dry_run"]
