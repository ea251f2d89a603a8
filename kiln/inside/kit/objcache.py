#!/usr/bin/env python3
"""kiln's compiler wrapper: deterministic compiles and a relocatable object cache
(stdlib only).

Determinism (always, unless ``KILN_DETERMINISTIC=0``): every compile gets prefix maps
for the tree, the Python's site-packages and the CUDA home (``-ffile-prefix-map``, also
through ``-Xcompiler`` for nvcc), so no build path lands in debug info or ``__FILE__``
strings; nvcc compiles also get ``-Xcudafe --orig_src_path_name=<path in the tree>``
(the module id hashed into device code) and run with ``--keep --keep-dir <temp>``
(intermediate files named after the source, not ``tmpxft_<pid>``); flags named in
``KILN_NVCC_DROP`` (e.g. ``-lineinfo``, which records source mtimes and the build
directory) are dropped. With ``KILN_NVCC_ARCHS`` (``arch_control = "rewrite"``) every nvcc
call's own arch flags are replaced by the archs the build makes, or the call refused
(``archflags.py``, ``docs/archs.md``).

Object cache:
Used as ``objcache.py REAL_COMPILER ARGS...`` through small wrappers that kiln puts
in ``.kiln/bin`` and names in ``CC``, ``CXX``, ``NVCC`` and ``PYTORCH_NVCC``. A
compile (``-c SRC -o OUT``) is looked up by its command line, with the tree, the
Python's site-packages and the CUDA home written as placeholders
(``KILN_OBJCACHE_ROOTS="TREE=/path;SITE=/path;CUDA=/path"``), and by the content of
every file the compile read (its dependency list). A hit copies the object and
writes the depfile the build asked for; anything else runs the real compiler.

Why not ccache: ccache entries carry creation times and its manifests the mtimes
and ctimes of headers, so a cache shipped inside a release tarball would make that
tarball differ on every build. This cache holds only content: ``objects/<sha256>.o``
and ``entries/<key>.json`` with sorted keys. It is what lets ``rebuild_c`` recompile
one changed file of an installed tree in seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from kiln.inside.kit import compileflags, compilegate, contract, cudashim, treemem
except ImportError:  # run as .kiln/objcache.py of a shipped tree: the kit's copies beside it
    import compileflags  # type: ignore[no-redef]
    import compilegate  # type: ignore[no-redef]
    import contract  # type: ignore[no-redef]
    import cudashim  # type: ignore[no-redef]
    import treemem  # type: ignore[no-redef]

# Where the CUDA home with the fixed-module-ID cudafe++ lies in a tree (cudashim.py);
# machine-specific like everything under .kiln/host, never packed.
SHIM_HOME = os.path.join(".kiln", "host", "cuda")
DEP_FLAGS_WITH_VALUE = ("-MF", "-MT", "-MQ", "--dependency-output", "-odir")
DEP_FLAGS = (
    "-MD",
    "-MMD",
    "--generate-dependencies-with-compile",
    "--generate-nonsystem-dependencies-with-compile",
)


def _names(roots: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The roots, plus the other spellings of a root the cache meets: where a CUDA home is
    a farm of links into another prefix (kiln's PyPI CUDA), dependencies resolve to that
    prefix, which must be named too or an entry carries the cache's location. Only for
    naming paths in entries and keys: the compile's prefix maps use ``roots`` alone."""
    pairs = list(roots)
    for name, path in roots:
        include = os.path.realpath(os.path.join(path, "include"))
        if os.path.basename(include) == "include" and os.path.dirname(include) != path:
            pairs.append((name, os.path.dirname(include)))
    # The build venv's own include/ (setuptools adds -I<venv>/include), so that a key does
    # not carry where the venv lies; only a venv (pyvenv.cfg), never a prefix such as /usr.
    python = os.environ.get(contract.OBJCACHE_PYTHON, "")
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python))) if python else ""
    if venv and os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        pairs.append(("VENV", os.path.realpath(venv)))
    return sorted(pairs, key=lambda p: -len(p[1]))


def normalize(text: str, roots: list[tuple[str, str]]) -> str:
    for name, path in roots:
        text = text.replace(path, f"@{name}@")
    return text


def expand(text: str, roots: list[tuple[str, str]]) -> str:
    for name, path in roots:
        text = text.replace(f"@{name}@", path)
    return text


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_depfile(text: str) -> list[str]:
    body = text.replace("\\\n", " ")
    _, _, deps = body.partition(": ")
    out, current = [], ""
    for token in deps.split(" "):
        if token.endswith("\\"):  # an escaped space inside a path
            current += token[:-1] + " "
            continue
        current += token
        if current.strip():
            out.append(current.strip())
        current = ""
    return out


class Call:
    """One compiler invocation, split into what the cache needs to know."""

    def __init__(self, compiler: str, args: list[str]) -> None:
        self.compiler = compiler
        self.args = args
        self.out: str | None = None
        self.depfile: str | None = None
        self.source: str | None = None
        self.cacheable = False
        self._parse()

    def _parse(self) -> None:
        a = self.args
        if "-c" not in a or any(x in a for x in ("-E", "-M", "-MM", "-")):
            return
        sources = [x for x in a if x.endswith(compileflags.SOURCE_SUFFIXES) and os.path.isfile(x)]
        if "-o" not in a or len(sources) != 1:
            return
        self.out = a[a.index("-o") + 1]
        self.source = sources[0]
        for flag in ("-MF", "--dependency-output"):
            if flag in a:
                self.depfile = a[a.index(flag) + 1]
        self.cacheable = True

    def key_args(self) -> list[str]:
        """The command line without the output names (they do not change the object)."""
        skip = {self.out, self.depfile}
        return [x for x in self.args if x not in skip]

    def deps_args(self) -> list[str]:
        """The same compile turned into ``-M`` (list every file read, to stdout)."""
        out, skip_next = [], False
        for x in self.args:
            if skip_next:
                skip_next = False
                continue
            if x in ("-o", *DEP_FLAGS_WITH_VALUE):
                skip_next = True
                continue
            if x in ("-c", *DEP_FLAGS):
                continue
            out.append(x)
        return [*out, "-M"]


def compiler_identity(compiler: str) -> str:
    res = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return hashlib.sha256((res.stdout + res.stderr).encode()).hexdigest()


def _launcher(call: Call) -> list[str]:
    """The compiler cache in front of the real compiler for compiles, when kiln configured
    one: sccache (``KILN_SCCACHE``) or ccache (``KILN_CCACHE``), each with its settings.
    Only where the working directory is in the tree (its base directory): elsewhere the
    tree's paths could not be written relative, and a hit would name another tree."""
    sccache = os.environ.get(contract.SCCACHE)
    tool = sccache or os.environ.get(contract.CCACHE)
    base = os.environ.get("SCCACHE_BASEDIRS" if sccache else "CCACHE_BASEDIR")
    in_base = bool(base) and compileflags.inside(
        os.path.realpath(os.getcwd()), os.path.realpath(base or "/")
    )
    return [tool] if tool and call.cacheable and in_base else []


SPECS = os.path.join(".kiln", "host", "prefix-maps.specs")
PREFIX_ENV = contract.PREFIX  # + a root's name (TREE, SITE, CUDA): its path, for the specs


def _specs_maps(args: list[str]) -> list[tuple[str, str, str]]:
    """kiln's own prefix maps in ``args`` (those of a root: an upstream's own stay where
    they are), as (the argument, the root's name, the target)."""
    names = {path: name for name, path in compileflags.env_roots()}
    found = []
    for a in args:
        if a.startswith("-ffile-prefix-map="):
            old, _, target = a.removeprefix("-ffile-prefix-map=").rpartition("=")
            if old in names:
                found.append((a, names[old], target))
    return found


def with_specs_file(args: list[str], nvcc: bool) -> tuple[list[str], dict[str, str]]:
    """The prefix maps (``-ffile-prefix-map=/abs/tree=.``) moved into a GCC specs file the
    compile names by a path relative to its working directory, and the environment that
    file reads: a compiler cache hashes arguments as written (ccache 4.8 and later also
    nvcc's ``-Xcompiler`` ones; sccache 0.16 all), so the tree's absolute path in them
    made every other folder's compile a miss. The file names no path: each map reads its
    root from the environment (``%:getenv(KILN_PREFIX_TREE =.)``), so its bytes, which
    ccache hashes for g++, are the same in every tree. The same options reach cc1 either
    way: the same object bytes."""
    tree = dict(compileflags.env_roots()).get("TREE")
    maps = _specs_maps(args)
    if not tree or not maps:
        return args, {}
    cpp = " ".join(f"-fmacro-prefix-map=%:getenv({PREFIX_ENV}{n} ={t})" for _, n, t in maps)
    debug = " ".join(f"-fdebug-prefix-map=%:getenv({PREFIX_ENV}{n} ={t})" for _, n, t in maps)
    text = f"*cpp_options:\n+ {cpp}\n\n*cc1_options:\n+ {cpp} {debug}\n\n"
    path = os.path.join(tree, SPECS)
    try:
        with open(path) as fh:
            same = fh.read() == text
    except OSError:
        same = False
    if not same:
        _write_atomic(Path(path), text.encode())
    moved = {a for a, _, _ in maps}
    roots = dict(compileflags.env_roots())
    env = {f"{PREFIX_ENV}{n}": roots[n] for _, n, _ in maps}
    flag = "-specs=" + os.path.relpath(path, os.getcwd())
    out: list[str] = []
    for i, a in enumerate(args):
        if a in moved:
            if nvcc and out and out[-1] == "-Xcompiler" and i and args[i - 1] == "-Xcompiler":
                out.pop()
            continue
        out.append(a)
    return ([*out, "-Xcompiler", flag] if nvcc else [*out, flag]), env


def gcc_like(compiler: str) -> bool:
    """Whether ``compiler`` (or nvcc's host compiler) reads GCC specs files: not clang."""
    return "clang" not in os.path.basename(compiler)


def _tree_relative(path: str | None) -> str:
    """A source as the stats name it: its path in the tree where it is inside."""
    if not path:
        return ""
    tree = dict(compileflags.env_roots()).get("TREE")
    real = os.path.realpath(path)
    return (
        os.path.relpath(real, tree)
        if tree and compileflags.inside(real, tree)
        else os.path.basename(path)
    )


def _written(call: Call) -> str | None:
    """The file a compiler run writes (its ``-o``; a lone ``-c`` writes ``NAME.o`` in its
    folder), absolute: the step's check that no compile of its tree bypassed this wrapper
    (kiln/verify/wrapped.py) looks for it."""
    a = call.args
    if "-o" in a[:-1]:
        return os.path.abspath(a[a.index("-o") + 1])
    sources = [x for x in a if x.endswith(compileflags.SOURCE_SUFFIXES)]
    if "-c" in a and len(sources) == 1:
        return os.path.abspath(os.path.splitext(os.path.basename(sources[0]))[0] + ".o")
    return None


@dataclass
class Ran:
    """What one run of the real compiler measured (``_record`` writes it)."""

    rc: int
    started: float  # monotonic, after the gate wait
    ended: float
    peak_kib: int = 0  # its process tree's peak
    cpu_s: float = 0.0
    cache: str | None = None  # the compiler cache's answer: "hit", "miss", None (none)


def _record(
    call: Call,
    ran: Ran,
    result: str,
    waited: float = 0.0,
    where: str | None = None,
    threads: int = 1,
) -> None:
    """One line per compiler run into the step's stats (``KILN_JOB_STATS``): its peak
    memory over its process tree and its CPU time (for the scheduler's learned estimates
    and the benchmark's floor), when it started after its gate wait (for the most
    compiles that ran at once), how long it waited, and what the compiler cache
    answered."""
    stats = contract.StepFiles.from_env(os.environ).job_stats
    if not stats:
        return
    line = json.dumps(
        {
            "compiler": os.path.basename(call.compiler),
            "source": _tree_relative(call.source),
            "out": _written(call),
            # the compile's own command: one source built twice with other flags (two
            # modules of one setup.py) is two units, not one compiled again
            "args_sha": hashlib.sha256("\0".join(call.args).encode()).hexdigest()[:16],
            "result": result,
            "rc": ran.rc,
            "rss_kib": ran.peak_kib,
            "cpu_s": round(ran.cpu_s, 3),
            "wall_s": round(ran.ended - ran.started, 3),
            "start": round(time.time() - (time.monotonic() - ran.started), 3),
            "waited_s": round(waited, 3),
            **({"where": where} if where else {}),
            **({"threads": threads} if threads > 1 else {}),
            **({"cache": ran.cache} if ran.cache else {}),
        }
    )
    fd = os.open(stats, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one write: lines never interleave
    finally:
        os.close(fd)


def _nvcc_from_shim(call: Call, seed: str) -> tuple[str, dict[str, str]]:
    """nvcc started from kiln's CUDA home (cudashim.py), so cudafe++ takes a module ID
    fixed by the source's path in the tree and the compile's normalized command (else
    it may end the ID with its process id). The real nvcc where there is no tree."""
    roots = dict(compileflags.env_roots())
    tree, home = roots.get("TREE"), roots.get("CUDA")
    if os.environ.get(contract.DETERMINISTIC) == "0" or not tree or not home:
        return call.compiler, {}
    given = os.path.dirname(os.path.dirname(os.path.abspath(call.compiler)))
    if os.path.realpath(given) != home:
        return call.compiler, {}  # some other nvcc than the build's CUDA home
    python = os.environ.get(contract.OBJCACHE_PYTHON) or sys.executable
    shim = cudashim.ensure_home(given, os.path.join(tree, SHIM_HOME), python)
    env = {}
    if call.source and call.source.endswith(".cu"):
        env[contract.MODULE_ID] = cudashim.module_id(_tree_relative(call.source), seed)
    return os.path.join(shim, "bin", os.path.basename(call.compiler)), env


def _priority(call: Call) -> float:
    """Links and other non-compiles first (a step waits on them); compiles by their
    learned CPU time, longest first (compilegate.py)."""
    if not call.cacheable:
        return compilegate.FIRST
    return compilegate.hinted_priority(_tree_relative(call.source))


THREADS_FLAGS = ("--threads", "-t")
TARGET_FLAGS = ("-gencode", "--generate-code")
ARCH_FLAGS = ("-arch", "--gpu-architecture")
CODE_FLAGS = ("-code", "--gpu-code")


def _flag_values(args: list[str], names: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """Each ``NAME VALUE`` or ``NAME=VALUE`` of ``names`` in ``args``: (index of the flag,
    how many arguments it spans, its value)."""
    found = []
    for i, a in enumerate(args):
        for name in names:
            if a == name and i + 1 < len(args):
                found.append((i, 2, args[i + 1]))
            elif a.startswith(name + "="):
                found.append((i, 1, a[len(name) + 1 :]))
    return found


def device_targets(args: list[str]) -> int | None:
    """How many device targets one nvcc compile makes (what its ``--threads`` compile
    side by side): its ``-gencode`` entries, else the real archs of ``-code``, else one
    for ``-arch`` or none given; None where nvcc chooses them (``-arch=all``, ``native``)."""
    gencodes = {v for _, _, v in _flag_values(args, TARGET_FLAGS)}
    if gencodes:
        return len(gencodes)
    archs = [v for _, _, v in _flag_values(args, ARCH_FLAGS)]
    if any(v.startswith(("all", "native")) for v in archs):
        return None
    codes = {c for _, _, v in _flag_values(args, CODE_FLAGS) for c in v.split(",") if c}
    return max(len(codes), 1)


def unit_threads(args: list[str]) -> tuple[list[str], int]:
    """nvcc's ``--threads`` for this unit, no more than its device targets (a thread
    per target is all nvcc uses; ``NVCC_THREADS`` is set per step, for its largest unit),
    and the arguments with it written so. ``--threads 0`` (nvcc: as many as it likes)
    becomes the unit's targets. Without ``--threads``: one. The count changes no byte of
    the object and depends on the unit alone, so cache keys stay the same everywhere."""
    given = _flag_values(args, THREADS_FLAGS)
    if not given:
        return args, 1
    index, span, value = given[-1]  # nvcc takes the last one
    try:
        asked = int(value)
    except ValueError:
        return args, 1
    targets = device_targets(args)
    if targets is None:
        return args, max(asked, 1)
    threads = targets if asked <= 0 else max(1, min(asked, targets))
    if threads == asked:
        return args, threads
    flag = args[index] if span == 2 else args[index].split("=", 1)[0]
    written = [flag, str(threads)] if span == 2 else [f"{flag}={threads}"]
    return [*args[:index], *written, *args[index + span :]], threads


def _spawn(
    argv: list[str], env: dict[str, str], held: compilegate.Held, capture: bool = False
) -> tuple[Ran, str | None]:
    """Run the compiler, its process tree's memory sampled as it runs (and reported to
    the gate as this holder's live figure); with ``capture``, its output returned
    instead of shown. The peak is the larger of the samples' and the largest single
    process's (``ru_maxrss``, exact where sampling may miss a short top)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    out = subprocess.PIPE if capture else None
    proc = subprocess.Popen(
        argv, env=env, stdout=out, stderr=subprocess.STDOUT if capture else None
    )
    with treemem.TreeSampler(proc.pid, held.report if held.live else None) as sampler:
        data, _ = proc.communicate()
    ended = time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    peak = max(sampler.peak_kib, after.ru_maxrss if after.ru_maxrss > before.ru_maxrss else 0)
    text = data.decode(errors="replace") if capture and data is not None else None
    return Ran(proc.returncode, started, ended, peak, cpu), text


def _ccache_log(env: dict[str, str]) -> str | None:
    """This compile's own ccache stats log (``CCACHE_STATSLOG`` for it alone), so its
    record says hit or miss; the step's log gets its lines after (:func:`_ccache_answer`)."""
    step_log = env.get("CCACHE_STATSLOG")
    if not step_log or not os.environ.get(contract.CCACHE):
        return None
    own = f"{step_log}.{uuid.uuid4().hex[:12]}"
    env["CCACHE_STATSLOG"] = own
    return own


def _ccache_answer(own: str | None) -> str | None:
    """What ccache answered this compile ("hit", "miss"; None: not cacheable, or no log),
    its lines appended to the step's stats log (one write)."""
    if own is None:
        return None
    try:
        with open(own) as fh:
            text = fh.read()
        os.unlink(own)
    except OSError:
        return None
    step_log = own.rsplit(".", 1)[0]
    with contextlib.suppress(OSError):
        fd = os.open(step_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    lines = set(text.split())
    if lines & {"direct_cache_hit", "preprocessed_cache_hit"}:
        return "hit"
    return "miss" if "cache_miss" in lines else None


NOTICE_PREFIX = "kiln compiler wrapper: "  # a notice, not an error (WRAPPER_PREFIX)
OOM_LINE = "killed for memory while others compiled beside it: compiling it again alone"


def run_real(call: Call, seed: str = "", alone: bool = False) -> int:
    """The real compiler (behind the compiler cache when configured), once the run's
    compile gate has room for it: in a local slot, or in a remote one (then through the
    step's sccache server that sends compiles to the sccache-dist scheduler). A compile
    the kernel killed for memory is compiled again ``alone``: the build goes on."""
    requested = time.monotonic()
    compiler, extra_env = (
        _nvcc_from_shim(call, seed) if compileflags.is_nvcc(call.compiler) else (call.compiler, {})
    )
    launcher = _launcher(call)
    # What the real compiler runs through this wrapper again (nvcc's -ccbin host
    # compiler) is part of this compile: it must not wait for a gate slot this compile
    # holds (a deadlock), nor be cached or counted twice.
    env = {**os.environ, compileflags.NESTED: "1", **extra_env}
    source = _tree_relative(call.source) if call.cacheable else None
    nvcc = compileflags.is_nvcc(call.compiler)
    # Only nvcc's compiles go to build servers: sccache-dist sends them cicc's and ptxas's
    # work (the device code, the bulk of a CUDA unit), which comes back the same bytes; a
    # g++ compile it runs from the preprocessed source, whose debug info then differs
    # (line tables, file indices: measured on a -g unit) from the local compile's.
    remote_ok = bool(launcher and os.environ.get(contract.SCCACHE_DIST_PORT)) and nvcc
    own_args, threads = unit_threads(call.args) if call.cacheable and nvcc else (call.args, 1)
    kills = treemem.oom_kills()
    with compilegate.from_environment(source, _priority(call), remote_ok, threads, alone) as held:
        args = own_args
        if held.where == "remote":
            env["SCCACHE_SERVER_PORT"] = os.environ[contract.SCCACHE_DIST_PORT]
        elif launcher and (nvcc or gcc_like(call.compiler)):
            args, prefix_env = with_specs_file(args, nvcc)
            env.update(prefix_env)
        own_log = _ccache_log(env) if launcher else None
        argv = [*launcher, compiler, *args]
        plain = not nvcc or os.environ.get(contract.DETERMINISTIC) == "0"
        if plain or "--keep" in call.args or "-o" not in call.args:
            ran, _ = _spawn(argv, env, held)
        elif os.environ.get(contract.SCCACHE) and launcher:
            # sccache hashes --keep-dir as written: a folder named by the compile, given
            # relative to the working directory, is the same in every tree.
            name = hashlib.sha256(f"{seed}\0{_tree_relative(call.out)}".encode()).hexdigest()
            keep = os.path.join(
                dict(compileflags.env_roots())["TREE"], ".kiln", "host", "keep", name[:16]
            )
            shutil.rmtree(keep, ignore_errors=True)
            os.makedirs(keep)
            try:
                rel = os.path.relpath(keep, os.getcwd())
                ran, _ = _spawn([*argv, "--keep", f"--keep-dir={rel}"], env, held)
            finally:
                shutil.rmtree(keep, ignore_errors=True)
        else:
            with tempfile.TemporaryDirectory(prefix="kiln-nvcc-") as keep:
                # One word (``=``): ccache is told to ignore it (a fresh temp dir each time).
                ran = _nvcc_keeping_ptx(
                    [*argv, "--keep", f"--keep-dir={keep}"], env, keep, call, held
                )
        # Taken while the slot is held: the next compile, woken the moment it is let go,
        # may start before this process writes its line, and the records must not show
        # the two overlapping.
        ran.ended = time.monotonic()
    ran.cache = _ccache_answer(own_log)
    waited = ran.started - requested
    killed = ran.rc != 0 and held.where != "remote" and treemem.oom_kills() > kills
    if killed and call.cacheable and not alone:
        _record(call, ran, "oom-killed", waited, held.where, threads)
        sys.stderr.write(f"{NOTICE_PREFIX}{source}: {OOM_LINE}\n")
        sys.stderr.flush()
        return run_real(call, seed, alone=True)
    result = "compiled" if call.cacheable else "other"
    if ran.cache == "hit":
        result = "cache-hit"
    _record(call, ran, result, waited, held.where, threads)
    return ran.rc


def _nvcc_keeping_ptx(
    argv: list[str], env: dict[str, str], keep: str, call: Call, held: compilegate.Held
) -> Ran:
    """nvcc with ``--keep-dir`` a temporary folder: where it fails, its PTX (what ptxas
    names in its errors) is kept beside the step's logs and its messages name that copy,
    not a folder gone with the compile."""
    ran, text = _spawn(argv, env, held, capture=True)
    text = text or ""
    stats = contract.StepFiles.from_env(os.environ).job_stats
    if ran.rc != 0 and stats and ".ptx" in text:
        unit = _tree_relative(call.source) or os.path.basename(call.out or "nvcc")
        kept = os.path.join(os.path.splitext(stats)[0] + "-ptx", unit.replace("/", "_"))
        try:
            os.makedirs(kept, exist_ok=True)
            for name in os.listdir(keep):
                if name.endswith(".ptx"):
                    shutil.copy2(os.path.join(keep, name), os.path.join(kept, name))
            text = text.replace(keep.rstrip("/") + "/", kept + "/")
        except OSError:
            pass  # the error is shown either way
    sys.stderr.write(text)
    sys.stderr.flush()
    return ran


def wrapper_env(
    tree: Path, python: str, site: str, cuda_home: str, base: dict[str, str]
) -> dict[str, str]:
    """The environment that sends a build in ``tree`` through this wrapper (``.kiln/bin``)
    with ``python`` first on PATH: used by kiln's builds and by ``rebuild.py`` alike."""
    kit = tree / ".kiln"
    return {
        contract.OBJCACHE_DIR: str(kit / "objcache"),
        contract.OBJCACHE_ROOTS: f"TREE={tree};SITE={site};CUDA={cuda_home}",
        contract.OBJCACHE_PYTHON: python,
        contract.REAL_CC: base.get("CC", "gcc"),
        contract.REAL_CXX: base.get("CXX", "g++"),
        contract.REAL_NVCC: f"{cuda_home}/bin/nvcc",
        "CC": str(kit / "bin" / "gcc"),
        "CXX": str(kit / "bin" / "g++"),
        "NVCC": str(kit / "bin" / "nvcc"),
        "PYTORCH_NVCC": str(kit / "bin" / "nvcc"),
        # CMake's CUDA compiler (CMAKE_CUDA_COMPILER's default), scikit-build-core's too
        "CUDACXX": str(kit / "bin" / "nvcc"),
        # ``nvcc`` by name (a build.sh, a Makefile) finds this wrapper first; only nvcc:
        # the C and C++ wrappers run the real ones by name
        "PATH": f"{kit / 'path'}:{Path(python).parent}:{base.get('PATH', '/usr/bin:/bin')}",
    }


def _read_entry(path: Path) -> dict[str, Any] | None:
    """A cache entry, or None where it is missing or unreadable (then: a miss)."""
    try:
        entry = json.loads(path.read_text())
        return entry if isinstance(entry.get("deps"), list) and "object" in entry else None
    except (OSError, ValueError, AttributeError):
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def with_own_depfile(call: Call) -> tuple[Call, str | None]:
    """The compile with ``-MD -MF <out>.kiln.d`` added where the build asked for no
    dependency file: the compiler lists what it read while it compiles (gcc and nvcc
    alike), instead of a second ``-M`` run of the preprocessor afterwards."""
    if not call.cacheable or call.depfile is not None or call.out is None:
        return call, None
    if any(x in call.args for x in (*DEP_FLAGS, "-M", "-MM")):
        return call, None  # the build's own -MD without -MF: leave its file alone
    own = call.out + ".kiln.d"
    return Call(call.compiler, [*call.args, "-MD", "-MF", own]), own


def _deps_after_compile(call: Call) -> list[str] | None:
    """Every file the compile read: from its depfile, else from a ``-M`` run (a build
    whose own dependency flags kiln leaves alone); None where that fails."""
    if call.depfile and os.path.isfile(call.depfile):
        return parse_depfile(Path(call.depfile).read_text())
    res = subprocess.run(
        [call.compiler, *call.deps_args()],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, compileflags.NESTED: "1"},
    )
    return parse_depfile(res.stdout) if res.returncode == 0 else None


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: objcache.py REAL_COMPILER ARGS...", file=sys.stderr)
        return 2
    if os.environ.get(compileflags.NESTED) == "1":  # inside a compile this wrapper already runs
        return compileflags.nested_main(argv)
    args = compileflags.deterministic_args(argv[1], argv[2:], compileflags.env_roots())
    told = contract.Archs.from_env(os.environ)
    if compileflags.is_nvcc(argv[1]) and told.rewrite:
        archflags = compileflags.archflags()
        unit = archflags.unit_of(args)
        try:
            args = archflags.from_environment(args, _tree_relative(unit) if unit else "nvcc")
        except archflags.ArchFlagError as exc:
            sys.stderr.write(f"{archflags.PREFIX}{exc}\n")
            return 1
    if compileflags.is_nvcc(argv[1]) and told.expect:
        # arch_control = "torch-arch-list": every CUDA unit makes every arch of the recipe;
        # one that does not is refused now, not the wheel after the whole build.
        archflags = compileflags.archflags()
        unit = archflags.unit_of(args)
        try:
            archflags.check_expected(args, list(told.expect), _tree_relative(unit))
        except archflags.ArchFlagError as exc:
            sys.stderr.write(f"{archflags.PREFIX}{exc}\n")
            return 1
    call = Call(argv[1], args)
    call, own_depfile = with_own_depfile(call)
    roots = _names(compileflags.env_roots())
    # The compile as it would read anywhere: what the object cache keys it by, and the
    # seed of its fixed module ID (the same with or without caches).
    named: list[object] = [
        normalize(os.getcwd(), roots),
        [normalize(os.path.abspath(x) if x == call.source else x, roots) for x in call.key_args()],
    ]
    seed = hashlib.sha256(json.dumps([os.path.basename(call.compiler), *named]).encode())
    try:
        return _compile(call, roots, named, seed.hexdigest(), own_depfile is not None)
    finally:
        if own_depfile:
            with contextlib.suppress(OSError):
                os.unlink(own_depfile)


def _output_gone(call: Call) -> int:
    """The compiler succeeded and its object is gone: another compile of the same build
    wrote the same object file at once (two extensions, or two targets, compiling one
    source into one path) and removed or replaced it. Said in one line the diagnosis reads
    (kiln/inside/causes/compile.py), not a traceback of this wrapper."""
    out = _tree_relative(call.out) if call.out else "its object"
    sys.stderr.write(
        f"{compileflags.WRAPPER_PREFIX}{out}: the compile of {_tree_relative(call.source)} "
        f"succeeded and its output is gone: another compile of this build wrote the same "
        f"object file at once\n"
    )
    return 1


def _compile(
    call: Call, roots: list[tuple[str, str]], named: list[object], seed: str, own: bool
) -> int:
    cache_dir = os.environ.get(contract.OBJCACHE_DIR)
    if not call.cacheable or not cache_dir or os.environ.get(contract.OBJCACHE_DISABLE):
        return run_real(call, seed)
    cache = Path(cache_dir)
    key_material = json.dumps(
        [os.path.basename(call.compiler), compiler_identity(call.compiler), *named]
    )
    key = hashlib.sha256(key_material.encode()).hexdigest()
    entry_path = cache / "entries" / f"{key}.json"
    assert call.out is not None
    entry = _read_entry(entry_path)
    if entry is not None:
        deps = [expand(p, roots) for p, _ in entry["deps"]]
        if all(
            os.path.isfile(d) and sha256_file(d) == h
            for d, (_, h) in zip(deps, entry["deps"], strict=True)
        ):
            obj = cache / "objects" / f"{entry['object']}.o"
            # An object whose bytes no longer hash to its name is corrupt: recompile.
            if obj.is_file() and sha256_file(str(obj)) == entry["object"]:
                Path(call.out).write_bytes(obj.read_bytes())
                if call.depfile and not own:
                    Path(call.depfile).write_text(
                        f"{call.out}: " + " ".join(d.replace(" ", "\\ ") for d in deps) + "\n"
                    )
                if os.environ.get(contract.OBJCACHE_VERBOSE):
                    sys.stderr.write(f"objcache: hit {call.source}\n")  # one write: no interleaving
                now = time.monotonic()
                _record(call, Ran(0, now, now), "objcache-hit")
                return 0
    rc = run_real(call, seed)
    if rc != 0:
        return rc
    found = _deps_after_compile(call)
    if found is None:
        return 0  # compiled fine; just not cacheable
    # Sorted by their normalized names: sorting absolute paths would order the tree's
    # files differently against outside headers when the tree moves (entry bytes differ).
    deps = sorted({os.path.realpath(d) for d in found}, key=lambda d: normalize(d, roots))
    try:
        obj_bytes = Path(call.out).read_bytes()
        obj_hash = hashlib.sha256(obj_bytes).hexdigest()
        entry = {
            "deps": [[normalize(d, roots), sha256_file(d)] for d in deps],
            "object": obj_hash,
            "command": normalize(shlex.join(call.key_args()), roots),
        }
    except FileNotFoundError:
        if os.path.isfile(call.out):
            return 0  # a header it read is gone (generated, then removed): not cached
        return _output_gone(call)
    _write_atomic(cache / "objects" / f"{obj_hash}.o", obj_bytes)
    _write_atomic(entry_path, json.dumps(entry, indent=1, sort_keys=True).encode())
    if os.environ.get(contract.OBJCACHE_VERBOSE):
        sys.stderr.write(f"objcache: miss {call.source}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
