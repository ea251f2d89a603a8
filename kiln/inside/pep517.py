"""A wheel built by calling the project's PEP 517 backend once (standard library only).

Why not ``pip wheel``: for a project without ``pyproject.toml`` pip runs ``setup.py``
twice (``egg_info``, then ``bdist_wheel``), and for one with it the backend twice
(``prepare_metadata_for_build_wheel``, then ``build_wheel``). The setup scripts of CUDA
extensions import torch at the top (5 CPU-seconds here) and some do real work there
(one public upstream generates its type stubs), so the first run costs as much as the
second and yields only metadata that ``build_wheel`` writes again. ``python -m build -n -x`` calls
the backend once for the same reason; kiln cannot rely on ``build`` being installed in
the user's build Python, so this module calls the hook itself, as ``pyproject_hooks``
(pip's and build's hook caller) does: the backend named in ``[build-system]``
(``setuptools.build_meta:__legacy__`` where none is named, as pip does), its
``backend-path`` first on ``sys.path``, run in a fresh interpreter whose working
directory is the tree. The wheel's content is the one ``pip wheel`` makes (both run
``setup.py bdist_wheel``; the three public upstreams of examples/public gave the same
wheel bytes either way); build isolation is off, as with ``--no-build-isolation``, and the
release's ``build-<release>.sh`` still names ``pip wheel``, which a user has.
"""

from __future__ import annotations

from pathlib import Path

LEGACY_BACKEND = "setuptools.build_meta:__legacy__"

# The backend named in [build-system], loaded as pyproject_hooks loads it: both hooks run
# as ``python -c HOOK BACKEND OUT_DIR [BACKEND_PATH...]`` in the tree.
_BACKEND = """\
import importlib, os, sys
spec, out, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path[:0] = [os.path.abspath(p) for p in paths]
module, _, attrs = spec.partition(":")
backend = importlib.import_module(module)
for attr in filter(None, attrs.split(".")):
    backend = getattr(backend, attr)
"""
HOOK = _BACKEND + 'print("kiln: built " + backend.build_wheel(out), flush=True)\n'

# The wheel's metadata alone (seconds: setup.py runs, nothing compiles), so what the wheel
# will require is known before the compile. Exit 3: the backend has no such hook (PEP 517
# lets it leave it out; then only the built wheel says).
METADATA_HOOK = (
    _BACKEND
    + """\
hook = getattr(backend, "prepare_metadata_for_build_wheel", None)
if hook is None:
    print("kiln: the backend has no prepare_metadata_for_build_wheel hook", flush=True)
    sys.exit(3)
print("kiln: metadata " + os.path.join(out, hook(out)), flush=True)
"""
)
NO_METADATA_HOOK = 3


def backend_of(tree: Path) -> tuple[str, list[str]] | None:
    """The tree's build backend and its ``backend-path``; None where ``pyproject.toml``
    cannot be read here (a Python without ``tomllib``: then kiln runs ``pip wheel``)."""
    pyproject = tree / "pyproject.toml"
    if not pyproject.is_file():
        return LEGACY_BACKEND, []
    try:
        import tomllib
    except ImportError:  # Python < 3.11 runs kiln.inside in an old builder image
        return None
    try:
        system = tomllib.loads(pyproject.read_text()).get("build-system", {})
    except (OSError, ValueError):
        return None  # pip will name what is wrong with the file
    return str(system.get("build-backend", LEGACY_BACKEND)), list(system.get("backend-path", []))


def command(python: str, tree: Path, out_dir: Path) -> list[str] | None:
    """The argv that builds ``tree``'s wheel into ``out_dir`` through its backend, once."""
    found = backend_of(tree)
    if found is None:
        return None
    backend, paths = found
    return [python, "-c", HOOK, backend, str(out_dir), *paths]


def metadata_command(python: str, tree: Path, out_dir: Path) -> list[str] | None:
    """The argv that writes ``tree``'s wheel metadata (a ``.dist-info`` folder) into
    ``out_dir`` through its backend's ``prepare_metadata_for_build_wheel``."""
    found = backend_of(tree)
    if found is None:
        return None
    backend, paths = found
    return [python, "-c", METADATA_HOOK, backend, str(out_dir), *paths]
