"""What a build step does, wherever it runs (``python -m kiln.inside step SPEC.json``).

Standard library only: inside the builder container kiln's dependencies are not
installed; the container gets kiln's source on ``PYTHONPATH`` and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from kiln.errors import BuildError
from kiln.inside import diagnose, memwatch, netrefuse, pep517, proc, say, sccache
from kiln.inside.kit import contract, pipcuda


@dataclass(frozen=True)
class StepSpec:
    """One build: plain data, written as JSON for the process that runs it."""

    vendor: str
    kind: str  # "wheel" | "inplace"
    python: str
    tree: str
    out_dir: str
    command: list[str] | None = None
    # What this machine's pip CUDA offers (kiln.inside.kit.pipcuda.discover, from the
    # probe): the step makes the link-names folder from it before the build starts.
    pip_cuda: pipcuda.PipCuda | None = None
    # A wheel step whose requirements kiln checks before its compile: the folder its
    # metadata goes to, and kiln's verdict comes from (kiln.inside.pep517.HOOK).
    metadata_dir: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_file(cls, path: Path) -> StepSpec:
        return cls(**json.loads(path.read_text()))


# The vendor's own build tools (build.build_tools: kiln/toolchain/vendortools.py), the
# build's PYTHONPATH. (The runner's PYTHONPATH is kiln's source, for the step's own
# process alone.)
BUILD_TOOLS_ENV = contract.BUILD_TOOLS


def own_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The build's environment from the step process's: kiln's source off PYTHONPATH,
    the vendor's build tools on it."""
    env = dict(environ)
    env.pop("PYTHONPATH", None)
    tools = env.get(BUILD_TOOLS_ENV)
    if tools:
        env["PYTHONPATH"] = tools
    return env


def clean_tree(tree: Path) -> None:
    """Remove stale build state that ninja would otherwise reuse."""
    for stale in [tree / "build", tree / "dist", *tree.glob("*.egg-info")]:
        if stale.is_dir():
            shutil.rmtree(stale)


def build_wheel(
    python: str,
    tree: Path,
    out_dir: Path,
    env: Mapping[str, str] | None,
    metadata_dir: Path | None = None,
) -> Path:
    """The tree's wheel, built in the tree with build isolation off: through its PEP 517
    backend called once (:mod:`kiln.inside.pep517`; its metadata first into
    ``metadata_dir``, for kiln's verdict, where given), else ``pip wheel
    --no-build-isolation``; returns the one wheel it made. Where kiln refused the
    metadata, exits with :data:`pep517.STOPPED` (kiln's own screen says why)."""
    clean_tree(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.whl"))
    hook = pep517.command(python, tree, out_dir, metadata_dir)
    pip = [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir"]
    what = "the PEP 517 build_wheel hook" if hook else "pip wheel"
    argv = hook or [*pip, "--verbose", "--wheel-dir", str(out_dir), str(tree)]
    if hook is None and metadata_dir is not None:  # no hook to wait: kiln checks nothing
        _say_ready(metadata_dir)
    stops = (pep517.STOPPED,) if hook is not None and metadata_dir is not None else ()
    res = proc.run(argv, cwd=tree, env=env, echo=True, what=what, error=BuildError, returns=stops)
    if res.returncode in stops:
        raise SystemExit(res.returncode)
    made = sorted(set(out_dir.glob("*.whl")) - before)
    if len(made) != 1:
        raise BuildError(f"{what} made {len(made)} wheels in {out_dir}, expected one")
    return made[0]


def _say_ready(metadata_dir: Path) -> None:
    """No metadata will come (``pip wheel`` runs): kiln's check has nothing to read."""
    metadata_dir.mkdir(parents=True, exist_ok=True)
    (metadata_dir / pep517.READY).write_text("")


def _die_with_parent() -> None:
    """kiln starts each step in a process group of its own (so Ctrl-C can stop it all);
    if kiln itself is killed (SIGKILL, OOM) nothing would stop that group, and its
    compilers would go on writing into a work tree the next run re-creates. So the
    step watches its parent and, once orphaned, kills its whole group."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        for _ in range(3):  # commands start their own groups (kiln.proc): kill each one
            for pid in memwatch.descendants(os.getpid()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    if os.getpgid(0) == os.getpid():  # only where this step leads its own group
        threading.Thread(target=watch, daemon=True, name="orphan-watch").start()


def run(spec: StepSpec, env: Mapping[str, str] | None = None) -> None:
    """Run one step here (the process's environment is the build's environment),
    sampling the memory of everything it starts into ``KILN_STEP_MEM`` when set."""
    _die_with_parent()
    step_env = dict(os.environ if env is None else env)
    mem_file = contract.StepFiles.from_env(step_env).step_mem
    with contextlib.ExitStack() as stack:
        if mem_file:
            stack.enter_context(memwatch.Watcher(os.getpid(), Path(mem_file)))
        # The step's own sccache servers (the compiler cache's sccache backend).
        stack.enter_context(sccache.served(step_env))
        try:
            _run(spec, step_env)
        except BuildError as exc:
            _record_failure(spec, step_env, exc)
            raise


def _record_failure(spec: StepSpec, env: Mapping[str, str], exc: BuildError) -> None:
    """The failed build's first errors, cause and fix (kiln.inside.diagnose), written to
    ``KILN_STEP_FAILURE`` for the host to show. Read here, where the build ran: the
    headers and libraries it names are the ones the build saw. A diagnosis that itself
    fails must never hide the build's own error."""
    record = contract.StepFiles.from_env(env).step_failure
    # a silent failure (curl -sf) may still have tried a download its wrapper refused
    if not record or not (exc.output or netrefuse.recorded()):
        return
    try:
        # the build's own command first: what it names (a URL it fetches) is evidence too
        said = f"$ {shlex.join(spec.command)}\n" if spec.command else ""
        found = diagnose.diagnose(said + exc.output, Path(spec.tree), env, spec.vendor)
        what = str(exc).splitlines()[0] if str(exc) else "the build"
        diagnose.write_record(Path(record), spec.vendor, what, found)
    except Exception as problem:  # reported; the build's own error stays the error
        say.result(f"kiln: could not read the failure's first errors: {problem!r}")


def _materialize(spec: StepSpec, env: Mapping[str, str] | None) -> None:
    """The pip CUDA's link names in the tree (setup.py may look for CUDA_HOME there)."""
    if spec.pip_cuda is not None:
        where = env if env is not None else os.environ
        try:
            pipcuda.materialize(
                spec.pip_cuda,
                str(Path(spec.tree) / pipcuda.LINKS_DIR),
                cc=where.get(contract.REAL_CC, "gcc"),
            )
        except subprocess.CalledProcessError as exc:
            # the compiler's own words (a full $TMPDIR, a missing gcc) are the first error,
            # read by the diagnosis like any compile's, not a traceback of this call
            failed = BuildError(
                f"compiling kiln's libcuda stub ({exc.cmd[0]}) failed with exit code "
                f"{exc.returncode}",
                output=f"{exc.stdout or ''}{exc.stderr or ''}",
            )
            say.raw(failed.output)
            raise failed from None


def _run(spec: StepSpec, env: Mapping[str, str] | None) -> None:
    tree = Path(spec.tree)
    _materialize(spec, env)
    if spec.kind == "inplace":
        assert spec.command
        proc.run(
            spec.command,
            cwd=tree,
            env=env,
            echo=True,
            what=" ".join(spec.command),
            error=BuildError,
        )
    else:
        meta = Path(spec.metadata_dir) if spec.metadata_dir else None
        build_wheel(spec.python, tree, Path(spec.out_dir), env, meta)
