"""An upstream's ``[build-system] requires`` held against the build venv (issue 40).

kiln builds without isolation (``pip wheel --no-build-isolation``, or the backend's hook
called once): the build venv stands in for the environment ``requires`` would make. A pin
it breaks (``setuptools<75`` against setuptools 80) builds "fine" with what the upstream
excludes; a requirement it lacks fails in setup.py minutes later or not at all. Both are
known from the tree before anything compiles: ``kiln add`` names them in the draft, the
build refuses the step before its compile.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kiln.verify import imports

# What a backend's get_requires_for_build_wheel adds to ``requires`` for a setting of its
# own (kiln calls no such hook: it builds without isolation, from what it pinned):
# scikit-build-core's metadata providers, by the module a [tool.scikit-build] metadata
# field names (extending-jax: its version from setuptools-scm, which its requires lack).
PROVIDER_REQUIRES = {
    "scikit_build_core.metadata.setuptools_scm": "setuptools-scm",
    "scikit_build_core.metadata.fancy_pypi_readme": "hatch-fancy-pypi-readme",
}


def declared(tree: Path) -> list[str]:
    """``[build-system] requires`` of the tree's pyproject.toml (none: none), and what its
    backend's configuration makes it require (:data:`PROVIDER_REQUIRES`)."""
    try:
        data = tomllib.loads((tree / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    requires = data.get("build-system", {}).get("requires", [])
    listed = [r for r in requires if isinstance(r, str)] if isinstance(requires, list) else []
    fields = data.get("tool", {}).get("scikit-build", {}).get("metadata", {})
    for field in fields.values() if isinstance(fields, dict) else []:
        provider = field.get("provider") if isinstance(field, dict) else None
        extra = PROVIDER_REQUIRES.get(str(provider))
        if extra and canonicalize_name(extra) not in {_requirement_name(r) for r in listed}:
            listed.append(extra)
    return listed


def _requirement_name(requirement: str) -> str:
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return requirement


def unmet(tree: Path, installed: Mapping[str, str]) -> list[str]:
    """The requirements of ``[build-system] requires`` the build venv does not meet, as
    written (what ``kiln add`` resolves into the vendor's build tools)."""
    return [str(req) for req, _ in imports.unmet_requirements(declared(tree), installed)]


def problems(tree: Path, installed: Mapping[str, str]) -> list[str]:
    """Each requirement of ``[build-system] requires`` the build venv (``installed``:
    canonical name -> version) does not meet, said with what it has instead."""
    return [
        f"{req} (the build venv has no {req.name})"
        if have is None
        else f"{req} (the build venv has {req.name} {have})"
        for req, have in imports.unmet_requirements(declared(tree), installed)
    ]


def refusal(vendor: str, found: list[str]) -> str:
    """The one-line error of a step refused for them."""
    return (
        f"{vendor}: the upstream's pyproject.toml [build-system] requires "
        f"{'; '.join(found)}: kiln builds without isolation, in the build venv, so the "
        f"upstream would be built with what it excludes or without what it needs; fix: "
        f"pin versions that satisfy it in build.build_tools of vendors/{vendor}.toml (this "
        f"vendor's build alone) or the profile's build_tools (kiln.toml), or patch the pin "
        f"where the upstream's code does not need it (patches/)"
    )


def tools_unmet(tools: Path, installed: Mapping[str, str]) -> list[str]:
    """Each dependency of a vendor's build tool (``Requires-Dist`` of a distribution in
    its tools folder, ``tools``) that neither the tools nor the build venv
    (``installed``) meet: ``tool X: needs REQ (...)``. The tools are installed without
    their dependencies (each pinned, as in a lock): a dependency left out would fail
    the build with ``No module named`` after minutes; it is named before the compile."""
    found: list[str] = []
    for dist in sorted(metadata.distributions(path=[str(tools)]), key=_name):
        for req, have in imports.unmet_requirements(list(dist.requires or []), installed):
            held = f"the build has {req.name} {have}" if have else f"no {req.name}"
            found.append(f"{_name(dist)} {dist.version} needs {req} ({held})")
    return found


def _name(dist: metadata.Distribution) -> str:
    return canonicalize_name(dist.metadata["Name"] or "")


def tools_refusal(vendor: str, found: list[str]) -> str:
    """The one-line error of a step whose build tools lack a dependency."""
    return (
        f"{vendor}: build.build_tools are installed without their dependencies and "
        f"{'; '.join(found)}: fix: pin each missing dependency in build.build_tools of "
        f"vendors/{vendor}.toml (`kiln add` drafts them with their dependencies), then "
        f"build again"
    )
