"""Every name that crosses into kiln through the environment, and the typed values the
host hands a build step (standard library only: copied into every tree's ``.kiln/`` with
the kit, imported there by plain name; in kiln as ``kiln.inside.kit.contract``).

No ``KILN_`` string is written anywhere else in kiln (``tests/unit/test_contract.py``):
a reader and a writer of one variable meet here, where mypy and the tools that follow
names see them. The values the host sets for a step are typed classes that write
themselves into an environment (``to_env``) and read themselves back (``from_env``):
``kiln.plan.environment`` alone builds them; the kit, the causes and the step read them.
"""

from __future__ import annotations

# The compiler wrapper imports this on every compile: no dataclasses, no typing (tens of
# milliseconds each, per call); the types are for mypy alone.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# --- What a user sets: each option's variable (kiln.orchestrate.options, commands/flags)
ALLOW_NETWORK = "KILN_ALLOW_NETWORK"
ALLOW_UNPINNED_IMAGE = "KILN_ALLOW_UNPINNED_IMAGE"
ARTIFACTS = "KILN_ARTIFACTS"
ARTIFACT_CACHE = "KILN_ARTIFACT_CACHE"
BUILD_PYTHON = "KILN_BUILD_PYTHON"
CACHE_DIR = "KILN_CACHE_DIR"
CACHE_STORE = "KILN_CACHE_STORE"
COMPILER_CACHE = "KILN_COMPILER_CACHE"
COMPILER_CACHE_BACKEND = "KILN_COMPILER_CACHE_BACKEND"
CUDA_HOME = "KILN_CUDA_HOME"
DISTRIBUTE = "KILN_DISTRIBUTE"
DOCKER_DIR = "KILN_DOCKER_DIR"
DOCKER_MOUNTS = "KILN_DOCKER_MOUNTS"
FROM_BUNDLES = "KILN_FROM_BUNDLES"
GPU_PYTHON = "KILN_GPU_PYTHON"
IMAGE = "KILN_IMAGE"
JOBS = "KILN_JOBS"
KEEP_CONTAINER = "KILN_KEEP_CONTAINER"
LEARNED_FROM = "KILN_LEARNED_FROM"
MEM_BUDGET = "KILN_MEM_BUDGET"
MEM_LIMIT = "KILN_MEM_LIMIT"
MIRRORS = "KILN_MIRRORS"
NO_ARTIFACT_CACHE = "KILN_NO_ARTIFACT_CACHE"
NO_COMPILER_CACHE = "KILN_NO_COMPILER_CACHE"
NO_IMPORT_PROOF = "KILN_NO_IMPORT_PROOF"
OFFLINE = "KILN_OFFLINE"
PROFILE = "KILN_PROFILE"
PROOF_ENV = "KILN_PROOF_ENV"
RUNNER = "KILN_RUNNER"
SAVE_LEARNED = "KILN_SAVE_LEARNED"
SIGN = "KILN_SIGN"
TIMINGS = "KILN_TIMINGS"
TOOLCHAIN = "KILN_TOOLCHAIN"
VENDOR = "KILN_VENDOR"
WAIT = "KILN_WAIT"
WORK = "KILN_WORK"
WORKSPACE = "KILN_WORKSPACE"
# signing: a key kiln cannot derive, a token's PIN, a keyless signer's identity
SIGN_PUBKEY = "KILN_SIGN_PUBKEY"
SIGN_PIN = "KILN_SIGN_PIN"
SIGN_IDENTITY = "KILN_SIGN_IDENTITY"
SIGN_ISSUER = "KILN_SIGN_ISSUER"
# a build server's token (never written to a log or record)
DIST_TOKEN = "KILN_DIST_TOKEN"

# --- What a machine's operator sets: the isolating programs (a path, or "none"), a
# fetch's stall limit
BWRAP = "KILN_BWRAP"
UNSHARE = "KILN_UNSHARE"
FETCH_STALL_S = "KILN_FETCH_STALL_S"

# --- What the host sets for a build step (read where the build runs)
BUILD_ARCHS = "KILN_BUILD_ARCHS"
NVCC_ARCHS = "KILN_NVCC_ARCHS"
NVCC_EXPECT = "KILN_NVCC_EXPECT"
NVCC_ALSO = "KILN_NVCC_ALSO"
NVCC_DROP = "KILN_NVCC_DROP"
CXX_APPEND = "KILN_CXX_APPEND"
NVCC_APPEND = "KILN_NVCC_APPEND"
GATE_DIR = "KILN_GATE_DIR"
GATE_HINTS = "KILN_GATE_HINTS"
GATE_MEM_GIB = "KILN_GATE_MEM_GIB"
JOB_STATS = "KILN_JOB_STATS"
STEP_MEM = "KILN_STEP_MEM"
STEP_FAILURE = "KILN_STEP_FAILURE"
BUILD_TOOLS = "KILN_BUILD_TOOLS"
CCACHE = "KILN_CCACHE"
SCCACHE = "KILN_SCCACHE"
SCCACHE_STATS = "KILN_SCCACHE_STATS"
SCCACHE_STORE_VARS = "KILN_SCCACHE_STORE_VARS"
SCCACHE_DIST_PORT = "KILN_SCCACHE_DIST_PORT"
DIST_URL = "KILN_DIST_URL"
# the step's network refusal's record (kiln.inside.netrefuse)
REFUSED_DOWNLOADS = "KILN_REFUSED_DOWNLOADS"

# --- What the kit sets for its own compiler wrappers, in the step
OBJCACHE_DIR = "KILN_OBJCACHE_DIR"
OBJCACHE_ROOTS = "KILN_OBJCACHE_ROOTS"
OBJCACHE_PYTHON = "KILN_OBJCACHE_PYTHON"
OBJCACHE_DISABLE = "KILN_OBJCACHE_DISABLE"
OBJCACHE_VERBOSE = "KILN_OBJCACHE_VERBOSE"
REAL_CC = "KILN_REAL_CC"
REAL_CXX = "KILN_REAL_CXX"
REAL_NVCC = "KILN_REAL_NVCC"
REAL_CUDAFE = "KILN_REAL_CUDAFE"
MODULE_ID = "KILN_MODULE_ID"
WRAPPED = "KILN_WRAPPED"  # a compile the wrapper already runs ("1")
DETERMINISTIC = "KILN_DETERMINISTIC"  # "0": the deterministic flags off (a benchmark's)
PREFIX = "KILN_PREFIX_"  # + a root's name (TREE, SITE, CUDA): its path, for the specs

# --- A placeholder of the shipped templates (install.sh, the rebuild script)
VERSION = "KILN_VERSION"


def _words(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(env.get(name, "").split())


def _put(env: dict[str, str], name: str, words: tuple[str, ...]) -> None:
    if words:
        env[name] = " ".join(words)


class Archs:
    """The archs a step builds, as the host tells its compiles and its diagnosis."""

    __slots__ = ("also", "built", "expect", "rewrite")

    def __init__(
        self,
        rewrite: tuple[str, ...] = (),
        expect: tuple[str, ...] = (),
        built: tuple[str, ...] = (),
        also: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        # every nvcc call's arch flags replaced by these (arch_control = "rewrite")
        self.rewrite = tuple(rewrite)
        # each CUDA unit must make every one (arch_control = "torch-arch-list")
        self.expect = tuple(expect)
        # what the recipe builds, whatever the control: read by the failure's diagnosis
        self.built = tuple(built)
        # under the rewrite: an asked target -> archs built from it too (build.arch_also)
        self.also = {k: tuple(v) for k, v in (also or {}).items()}

    def to_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        _put(env, NVCC_ARCHS, self.rewrite)
        _put(env, NVCC_EXPECT, self.expect)
        _put(env, BUILD_ARCHS, self.built)
        _put(env, NVCC_ALSO, tuple(f"{k}:{a}" for k, v in sorted(self.also.items()) for a in v))
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Archs:
        also: dict[str, tuple[str, ...]] = {}
        for word in _words(env, NVCC_ALSO):
            asked, _, arch = word.partition(":")
            also[asked] = (*also.get(asked, ()), arch)
        return cls(
            _words(env, NVCC_ARCHS), _words(env, NVCC_EXPECT), _words(env, BUILD_ARCHS), also
        )

    @property
    def named(self) -> tuple[str, ...]:
        """The archs the step was asked for, whichever way it was told."""
        return self.built or self.rewrite or self.expect


class Flags:
    """The recipe's flags the compiler wrapper applies to every call of a step."""

    __slots__ = ("cxx_append", "nvcc_append", "nvcc_drop")

    def __init__(
        self,
        nvcc_drop: tuple[str, ...] = (),
        cxx_append: tuple[str, ...] = (),
        nvcc_append: tuple[str, ...] = (),
    ) -> None:
        self.nvcc_drop = tuple(nvcc_drop)
        self.cxx_append = tuple(cxx_append)
        self.nvcc_append = tuple(nvcc_append)

    def to_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        _put(env, NVCC_DROP, self.nvcc_drop)
        _put(env, CXX_APPEND, self.cxx_append)
        _put(env, NVCC_APPEND, self.nvcc_append)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Flags:
        return cls(_words(env, NVCC_DROP), _words(env, CXX_APPEND), _words(env, NVCC_APPEND))


class StepFiles:
    """Where a step's compiles meet the host: the compile gate and the step's records."""

    __slots__ = ("gate_dir", "gate_hints", "gate_mem_gib", "job_stats", "step_failure", "step_mem")

    def __init__(
        self,
        gate_dir: str | None = None,
        gate_hints: str | None = None,
        gate_mem_gib: float = 0.0,
        job_stats: str | None = None,
        step_mem: str | None = None,
        step_failure: str | None = None,
    ) -> None:
        self.gate_dir = gate_dir  # the machine's compile gate (shared by every step)
        self.gate_hints = gate_hints  # the step's learned figures, per unit
        self.gate_mem_gib = gate_mem_gib  # what a compile of a kind never seen reserves
        self.job_stats = job_stats  # the wrapper's record of each compile (.jobs)
        self.step_mem = step_mem  # the step's memory samples
        self.step_failure = step_failure  # the failure record the host shows

    def to_env(self) -> dict[str, str]:
        named = {
            GATE_DIR: self.gate_dir,
            GATE_HINTS: self.gate_hints,
            JOB_STATS: self.job_stats,
            STEP_MEM: self.step_mem,
            STEP_FAILURE: self.step_failure,
        }
        env = {k: v for k, v in named.items() if v}
        if self.gate_mem_gib:
            env[GATE_MEM_GIB] = str(self.gate_mem_gib)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StepFiles:
        return cls(
            gate_dir=env.get(GATE_DIR) or None,
            gate_hints=env.get(GATE_HINTS) or None,
            gate_mem_gib=float(env.get(GATE_MEM_GIB, "0") or 0),
            job_stats=env.get(JOB_STATS) or None,
            step_mem=env.get(STEP_MEM) or None,
            step_failure=env.get(STEP_FAILURE) or None,
        )
