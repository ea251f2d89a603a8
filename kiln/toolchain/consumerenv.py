"""The consumer's environment: what a release's ``install.sh`` makes where the release
lands, for the import proof (:mod:`kiln.orchestrate.importproof`).

``install.sh`` makes a venv with the profile's Python and installs ``requirements.txt``
into it (the workspace's hash-pinned ``runtime-requirements.lock``, else its
``runtime-requirements.txt``, else the profile's torch: :func:`kiln.release.files.
requirements`) with the pip arguments of :func:`pip_requirement_args`; then the
release's wheels, ``--no-deps --no-index``. kiln makes the first part from the same
requirements text, with the same hashes required and the same indexes (pip's own
settings where the build runs: :mod:`kiln.toolchain.pipconfig`), once per set of inputs
under its cache (``envs/consumer-*``), where the build runs (through its runner: in the
builder container for the Docker runner), and reuses it. uv installs them
(:mod:`kiln.toolchain.uvtool`: hard links from one cache, so torch's 5 GB are on disk
once; measured by ``benchmarks/consumerenv.py``: 20 s the first time, 11 s for another
environment of a cached lock, most of it compiling bytecode, where pip took 70 s and
5 GB for each), linked from the uv cache that filled the build venv where there is one
(:func:`kiln.toolchain.uvtool.shared_cache`); the files are the wheels' own, their
hashes checked as pip checks them. Where kiln's uv is missing, pip makes it. uv
compiles no bytecode here: the proofs compile what they import, once, beside the
environment (:attr:`ConsumerEnv.pycache`).

Each proof then puts one wheel (or one unpacked tree) into a small venv of its own
that sees this one's packages after its own (:func:`overlay_pth`), so the shared
environment is never changed.

A venv cannot be renamed into place (its scripts and ``pyvenv.cfg`` name its path): it
is made where it stays, under the entry's lock, and trusted only once its marker,
written last, is there (as the build venv, :mod:`kiln.toolchain.buildenv`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kiln.toolchain import uvtool
from kiln.toolchain.pipconfig import UvSettings

LAYOUT = 2  # part of every environment's identity: a change here makes them anew
BUILD_PYTHON = "build-python"  # --proof-env: the build Python's distributions
BUILD_PYTHON_PTH = "kiln-build-python.pth"
# Run by the build Python: its site folders into a .pth of the consumer venv ARGV[1].
WRITE_PTH = (
    "import pathlib, sys, sysconfig; "
    "site = next(pathlib.Path(sys.argv[1]).glob('lib/python3*/site-packages')); "
    "paths = sysconfig.get_paths(); "
    f"(site / {BUILD_PYTHON_PTH!r}).write_text("
    "'\\n'.join(dict.fromkeys([paths['purelib'], paths['platlib']])) + '\\n')"
)
MARKER = ".kiln-complete"
REQUIREMENTS_FILE = "kiln-requirements.txt"
PIP_QUIET = ("--quiet", "--disable-pip-version-check")


def has_requirements(text: str) -> bool:
    """Whether a requirements text names anything (install.sh skips pip otherwise)."""
    return any(ln.strip() and not ln.lstrip().startswith("#") for ln in text.splitlines())


def all_hashed(text: str) -> bool:
    """Every requirement carries ``--hash=``: pip installs it with ``--require-hashes``."""
    reqs = [
        ln
        for ln in text.replace("\\\n", " ").splitlines()
        if ln.strip() and not ln.lstrip().startswith(("#", "-"))
    ]
    return bool(reqs) and all("--hash=" in ln for ln in reqs)


def pip_requirement_args(text: str, torch_index: str | None) -> list[str]:
    """The arguments ``install.sh`` gives ``pip install -r requirements.txt`` (its
    template is filled from this list): hashes required where every line has one, the
    profile's torch index as an extra index."""
    args = ["--require-hashes"] if all_hashed(text) else []
    if torch_index:
        args += ["--extra-index-url", torch_index]
    return args


@dataclass(frozen=True)
class ConsumerEnv:
    """One consumer environment, made or not: where it is and what makes it."""

    root: Path
    base_python: str  # the Python it is made from (the build's: the profile's version)
    requirements: str
    pip_args: tuple[str, ...]
    key: str
    uv: str | None = None  # kiln's uv binary; None: pip installs the requirements
    uv_cache: Path | None = None  # the uv cache it links from; None: its folder's own
    # "install": what install.sh installs, from the index; "build-python": the build
    # Python's own distributions seen through a .pth (--proof-env build-python)
    source: str = "install"

    @property
    def pycache(self) -> Path:
        """Where the import proofs keep this environment's bytecode: made without it
        (compiling all of torch's 4,000 modules cost 20 CPU-seconds beside the compiles
        of a cold build), the proofs compile what they import, once, into this folder
        beside it (``-X pycache_prefix``), and the environment stays read-only."""
        return self.root.parent / f"{self.root.name}.pycache"

    @property
    def links_from(self) -> Path:
        """The uv cache the requirements are linked from (:mod:`kiln.toolchain.uvtool`)."""
        return self.uv_cache or uvtool.cache_of(self.root.parent)

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def made(self) -> bool:
        return (self.root / MARKER).is_file()

    def site_packages(self) -> Path:
        found = sorted((self.root / "lib").glob("python3*/site-packages"))
        if not found:
            raise FileNotFoundError(f"{self.root}: no lib/python3*/site-packages")
        return found[0]

    def site_dirs(self) -> list[Path]:
        """Where its distributions are: its own site-packages, then (``build-python``)
        the build Python's, as its ``.pth`` names them."""
        own = self.site_packages()
        try:
            lines = (own / BUILD_PYTHON_PTH).read_text().splitlines()
        except OSError:
            lines = []
        return [own, *(Path(line) for line in lines if line.strip())]

    def distributions(self) -> dict[str, str]:
        """Canonical name -> version of every distribution it sees (its own first)."""
        found: dict[str, str] = {}
        for site in reversed(self.site_dirs()):
            found.update(distributions(site))
        return found

    def libraries(self) -> dict[str, list[tuple[str, str]]]:
        """File name -> [(path, distribution)] of every shared library it sees."""
        found: dict[str, list[tuple[str, str]]] = {}
        for site in self.site_dirs():
            for name, where in libraries(site).items():
                found.setdefault(name, []).extend(where)
        return found

    def commands(self, settings: UvSettings | None = None) -> list[tuple[list[str], str]]:
        """(argv, what) in order: the venv, then the requirements (when there are any):
        by uv with pip's ``settings`` where kiln has uv, else by the venv's pip.
        Without pip in it (uv's, or nothing to install), the venv is made
        ``--without-pip``: an image's Python without ``ensurepip``, Debian's without
        python3-venv, still makes it."""
        if self.source == BUILD_PYTHON:
            return [
                (
                    [self.base_python, "-m", "venv", "--without-pip", str(self.root)],
                    "the consumer venv",
                ),
                (
                    [self.base_python, "-I", "-c", WRITE_PTH, str(self.root)],
                    "the build Python's distributions, seen from the consumer venv",
                ),
            ]
        reqs = has_requirements(self.requirements)
        by_uv = reqs and self.uv is not None
        venv = [self.base_python, "-m", "venv", *([] if reqs and not by_uv else ["--without-pip"])]
        out = [([*venv, str(self.root)], "the consumer venv")]
        if not reqs:
            return out
        requirements = str(self.root / REQUIREMENTS_FILE)
        if by_uv and self.uv is not None:
            settings = settings or UvSettings()
            if "--require-hashes" in self.pip_args:
                settings = settings.for_hashed()
            install = uvtool.install_command(
                self.uv,
                self.python,
                self.links_from,
                settings,
                [*self.pip_args, "-r", requirements],
                bytecode=False,
            )
        else:
            install = [str(self.python), "-m", "pip", "install", *PIP_QUIET, *self.pip_args]
            install += ["-r", requirements]
        out.append((install, "the runtime requirements into the consumer venv"))
        return out


def base_interpreter(python: str) -> str:
    """The interpreter a venv made by ``python -m venv`` runs: ``python`` itself, or,
    where ``python`` is a venv's (a provisioned build venv), its base (the ``home`` of
    its ``pyvenv.cfg``): two build venvs of one interpreter make the same environment."""
    cfg = Path(python).parent.parent / "pyvenv.cfg"
    try:
        lines = cfg.read_text().splitlines()
    except OSError:
        return python
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return f"{value.strip()}/"
    return python


def installed_lines(requirements: str) -> str:
    """The lines of a requirements text pip acts on (no comments, no blank lines): two
    texts that install the same share one environment (a 5 GB torch made once)."""
    return "\n".join(
        line.strip()
        for line in requirements.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )


def plan(
    cache: Path,
    python_version: str,
    base_python: str,
    requirements: str,
    torch_index: str | None,
    where: str,
    uv: str | None = None,
    uv_cache: Path | None = None,
    source: str = "install",
) -> ConsumerEnv:
    """The environment for these inputs (``where``: what the build runs in, e.g. the
    runner and its builder image, so that a container's environment is never used here;
    ``uv_cache``: the uv cache to link from, where not the environments folder's own; the
    same files either way, so not part of its identity; ``source``: ``build-python``, the
    build Python's own distributions instead of the requirements installed)."""
    args = pip_requirement_args(requirements, torch_index)
    if source == BUILD_PYTHON:
        own: dict[str, object] = {
            "python": python_version,
            "build_python": base_python,
            "where": where,
            "layout": LAYOUT,
            "source": source,
        }
        digest = hashlib.sha256(json.dumps(own, sort_keys=True).encode()).hexdigest()[:12]
        root = cache / "envs" / f"consumer-py{python_version}-{source}-{digest}"
        return ConsumerEnv(root, base_python, requirements, (), digest, source=source)
    spec: dict[str, object] = {
        "python": python_version,
        "base": base_interpreter(base_python),
        # what pip installs: comments and blank lines make no other environment
        "requirements": hashlib.sha256(installed_lines(requirements).encode()).hexdigest(),
        "pip": args,
        "where": where,
        "installer": uvtool.installer(uv),
        "layout": LAYOUT,
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    root = cache / "envs" / f"consumer-py{python_version}-{digest}"
    return ConsumerEnv(root, base_python, requirements, tuple(args), digest, uv, uv_cache)


def mark_made(env: ConsumerEnv) -> None:
    (env.root / MARKER).write_text(json.dumps({"key": env.key}, sort_keys=True))


def distributions(site: Path) -> dict[str, str]:
    """Canonical name -> version of every distribution installed in ``site``."""
    out: dict[str, str] = {}
    for dist in metadata.distributions(path=[str(site)]):
        name = dist.metadata["Name"]
        if name:
            out[canonicalize_name(name)] = dist.version
    return out


def libraries(site: Path) -> dict[str, list[tuple[str, str]]]:
    """File name -> [(path, distribution)] of every shared library in ``site`` (from the
    distributions' RECORDs: the files each one installed)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for dist in metadata.distributions(path=[str(site)]):
        name = canonicalize_name(dist.metadata["Name"] or "?")
        for f in dist.files or []:
            base = os.path.basename(str(f))
            if base.endswith(".so") or ".so." in base:
                out.setdefault(base, []).append((str(site / f), name))
    return out


def unmet(requirements: str, found: dict[str, str]) -> list[str]:
    """The requirements (a requirements text's lines, options and hashes left out) that
    the distributions ``found`` (canonical name -> version) do not meet, each said."""
    out = []
    for line in requirements.replace("\\\n", " ").splitlines():
        text = line.split("#", 1)[0].split(" --", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        try:
            req = Requirement(text)
        except InvalidRequirement:
            out.append(f"{text} (not a requirement kiln can read)")
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        have = found.get(canonicalize_name(req.name))
        if have is None:
            out.append(f"{req} (not installed)")
        elif not req.specifier.contains(have, prereleases=True):
            out.append(f"{req} (it has {have})")
    return out
