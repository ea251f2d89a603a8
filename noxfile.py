"""Sessions users run. Thin on purpose: each one calls the engine (``python -m kiln``).

nox -s demo                  the whole pipeline over the bundled example, offline
nox -s build_all             every upstream of the release (kiln.toml, vendors/)
nox -s build -- deepep       one upstream
nox -s lock                  pin short SHAs, submodules and patch hashes (needs network)
nox -s publish -- R --to T  check a release, then copy it to a folder or hf://ORG/NAME
nox -s tests / nox -s lint
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]


def _kiln(session: nox.Session, *args: str) -> None:
    session.install("-e", ".")
    session.run("python", "-m", "kiln", *args, *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Build the bundled example (examples/demo) end to end, offline."""
    _kiln(session, "demo")


@nox.session
def build_all(session: nox.Session) -> None:
    """Build every upstream in vendors/ into artifacts/<release>/."""
    _kiln(session, "build")


@nox.session
def build(session: nox.Session) -> None:
    """Build the named upstreams: nox -s build -- deepep [flashmla ...]."""
    if not session.posargs:
        session.error("name the vendor(s) to build: nox -s build -- deepep")
    _kiln(session, "build")


@nox.session
def lock(session: nox.Session) -> None:
    """Resolve short SHAs to full ones, record submodules and patch sha256s."""
    _kiln(session, "lock")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite: real git, real nvcc, real torch extensions, real cuobjdump."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def rebuild_c(session: nox.Session) -> None:
    """Re-apply a patch to an installed tree, rebuild only its _C: -- TREE [PATCH]."""
    if not session.posargs:
        session.error("name the installed tree: nox -s rebuild_c -- /workspace/deepinfer [patch]")
    _kiln(session, "rebuild-c")


@nox.session
def pack_jit_cache(session: nox.Session) -> None:
    """Pack JIT caches into the release: -- DIR --name LABEL [--release FOLDER]."""
    _kiln(session, "pack-jit-cache")


@nox.session
def bench_rebuild_c(session: nox.Session) -> None:
    """Full in-place build vs rebuild_c after a one-line patch edit (benchmarks/)."""
    session.install("-e", ".")
    session.run("python", "benchmarks/rebuild_c.py", *session.posargs)


@nox.session
def bench_speed(session: nox.Session) -> None:
    """kiln build vs the naive serial recipe; no-op, patch, cache-warm runs (benchmarks/)."""
    session.install("-e", ".")
    session.run("python", "benchmarks/speed.py", *session.posargs)


@nox.session
def bench_import_proof(session: nox.Session) -> None:
    """What the import proof adds to a build, no-op and cold (benchmarks/importproof.py)."""
    session.install("-e", ".")
    session.run("python", "benchmarks/importproof.py", *session.posargs)


@nox.session
def bench_onboarding(session: nox.Session) -> None:
    """kiln add then kiln build, no edit between, per upstream of a corpus: -- --corpus DIR."""
    session.install("-e", ".")
    session.run("python", "benchmarks/onboarding.py", *session.posargs)


@nox.session
def bench_fleet(session: nox.Session) -> None:
    """Builder B from builder A's shared cache, and N build servers on paper (benchmarks/)."""
    session.install("-e", ".[fleet]")
    session.run("python", "benchmarks/fleet.py", *session.posargs)


@nox.session
def verify(session: nox.Session) -> None:
    """Rebuild a release from its manifest and compare every file: -- MANIFEST [...]."""
    if not session.posargs:
        session.error("name the manifest: nox -s verify -- artifacts/kiln-demo/manifest.json")
    _kiln(session, "verify")


@nox.session
def publish(session: nox.Session) -> None:
    """Check a release, then publish it: -- RELEASE --to FOLDER|hf://ORG/NAME [--dry-run].

    The Hub token comes from $HF_TOKEN (never an argument); docs/ci.md."""
    if not session.posargs:
        session.error(
            "name the release and the target: "
            "nox -s publish -- artifacts/deepinfer-sm100-cu132 --to hf://ORG/NAME"
        )
    _kiln(session, "publish")


@nox.session
def plan(session: nox.Session) -> None:
    """The release workflow's matrix: one job per upstream x profile (-- --json)."""
    _kiln(session, "plan")


@nox.session
def build_public(session: nox.Session) -> None:
    """The public DeepGEMM, DeepEP and FlashMLA (examples/public), offline from the git
    bundles in $KILN_BUNDLES (default ../shared/upstreams)."""
    bundles = os.environ.get("KILN_BUNDLES", "../shared/upstreams")
    _kiln(session, "build", "--workspace", "examples/public", "--bundles", bundles)
