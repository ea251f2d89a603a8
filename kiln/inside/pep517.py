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
release's ``build-<release>.sh`` still names ``pip wheel``, which a user has. Where kiln
checks the wheel's requirements before its compile, the same interpreter calls
``prepare_metadata_for_build_wheel`` first (:data:`HOOK`): setup.py's second run finds
torch imported already.
"""

from __future__ import annotations

from pathlib import Path

LEGACY_BACKEND = "setuptools.build_meta:__legacy__"

# The backend named in [build-system], loaded as pyproject_hooks loads it, run as
# ``python -c HOOK BACKEND OUT_DIR METADATA_DIR [BACKEND_PATH...]`` in the tree. With a
# METADATA_DIR (not ""), the wheel's metadata comes first, in the same interpreter
# (``prepare_metadata_for_build_wheel``: setup.py runs, nothing compiles; torch, which
# setup.py imports, is then imported once for both), its ``.dist-info`` name is written
# to ``METADATA_DIR/ready`` ("" where the backend has no such hook or it failed), and
# the hook waits for kiln's ``METADATA_DIR/verdict``: ``go`` builds the wheel, anything
# else exits with STOPPED before any compile (kiln holds the wheel's requirements
# against where it lands: kiln.orchestrate.beforecompile).
HOOK = """\
import importlib, os, sys, time, traceback
spec, out, meta, paths = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
sys.path[:0] = [os.path.abspath(p) for p in paths]
module, _, attrs = spec.partition(":")
backend = importlib.import_module(module)
for attr in filter(None, attrs.split(".")):
    backend = getattr(backend, attr)
if meta:
    name, hook = "", getattr(backend, "prepare_metadata_for_build_wheel", None)
    if hook is None:
        print("kiln: the backend has no prepare_metadata_for_build_wheel hook", flush=True)
    else:
        try:
            name = hook(meta)
            print("kiln: metadata " + os.path.join(meta, name), flush=True)
        except Exception:
            traceback.print_exc()
            print("kiln: the metadata hook failed (the proof checks the wheel)", flush=True)
    with open(os.path.join(meta, "ready.part"), "w") as fh:
        fh.write(name)
    os.replace(os.path.join(meta, "ready.part"), os.path.join(meta, "ready"))
    verdict = os.path.join(meta, "verdict")
    while not os.path.exists(verdict):
        time.sleep(0.05)
    with open(verdict) as fh:
        said = fh.read().strip()
    if said != "go":
        print("kiln: stopped before the compile: " + said, flush=True)
        sys.exit(%d)
print("kiln: built " + backend.build_wheel(out), flush=True)
"""
STOPPED = 75  # the hook's exit code where kiln refused the wheel before its compile
HOOK %= STOPPED
READY = "ready"  # in METADATA_DIR: the .dist-info's name, "" where none was written
VERDICT = "verdict"  # in METADATA_DIR: "go", else why the build stops


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


def command(
    python: str, tree: Path, out_dir: Path, metadata_dir: Path | None = None
) -> list[str] | None:
    """The argv that builds ``tree``'s wheel into ``out_dir`` through its backend, once
    (its metadata first into ``metadata_dir``, where given, for kiln's verdict)."""
    found = backend_of(tree)
    if found is None:
        return None
    backend, paths = found
    return [python, "-c", HOOK, backend, str(out_dir), str(metadata_dir or ""), *paths]
