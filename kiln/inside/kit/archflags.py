"""The arch rewrite of ``arch_control = "rewrite"`` (stdlib ``os``, ``re`` and ``shlex``
only: it runs inside kiln's compiler wrapper, under ``python -I -S``).

kiln names the archs a build makes in ``KILN_NVCC_ARCHS`` (``"sm_100a sm_103a"``).
Every nvcc call through the wrapper then loses its own arch flags (``-gencode``,
``--generate-code``, ``-arch``, ``--gpu-architecture``, ``-code``, ``--gpu-code``, in
every spelling nvcc accepts, including those in ``NVCC_PREPEND_FLAGS`` and
``NVCC_APPEND_FLAGS``) and gets, in their place, one
``-gencode=arch=compute_X,code=sm_X`` for each of those archs that its own request
*covers*: SASS only, no PTX (see ``docs/archs.md``).

A requested arch covers a built arch when it is
- generic (``sm_90``, ``compute_80``) and not newer: code written for no arch's own
  features compiles for any later one (the GPU would otherwise JIT it from PTX);
- family-specific (``sm_100f``) and an arch of the same family (major) not older than it
  (``sm_100f`` covers ``sm_100a`` and ``sm_103a``; ``sm_103f`` not ``sm_100a``), with
  the family's features (an ``a`` or ``f`` target, never a generic one);
- arch-specific (``sm_90a``) and exactly that arch.
``native``, ``all`` and ``all-major`` cover every built arch (the build's archs are the
GPUs the release targets); a call with no arch flag at all is nvcc's default (the oldest
generic arch), so it covers them all too.

A call whose request covers none of the built archs (a unit written for ``sm_90a`` alone,
in a build of ``sm_100a`` and ``sm_103a``) is refused (:class:`Refused`): it must never
be compiled silently for an arch it was not written for.
"""

from __future__ import annotations

import os
import re
import shlex

TYPE_CHECKING = False  # typing's own costs each nvcc call its import
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

try:
    from kiln.inside.kit import contract
except ImportError:  # run from a tree's .kiln/: the kit's copies beside it
    import contract  # type: ignore[no-redef]

# nvcc reads extra flags from these; the rewrite reads them into the command line.
NVCC_ENV_FLAGS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")

# option -> what its value holds (one arch, a list of codes, an arch=...,code=... spec)
ARCH_OPTIONS = {
    "-arch": "arch",
    "--gpu-architecture": "arch",
    "-code": "code",
    "--gpu-code": "code",
    "-gencode": "gencode",
    "--generate-code": "gencode",
}
# Options whose separate value is another tool's flag (``-Xcompiler -arch=x``): not nvcc's.
PASS_THROUGH = frozenset(
    {
        "-Xcompiler",
        "--compiler-options",
        "-Xlinker",
        "--linker-options",
        "-Xarchive",
        "--archive-options",
        "-Xptxas",
        "--ptxas-options",
        "-Xnvlink",
        "--nvlink-options",
        "-Xcudafe",
        "-Xfatbin",
        "-Xnvvm",
        "-o",
        "--output-file",
        "-ccbin",
        "--compiler-bindir",
        "-optf",
        "--options-file",
    }
)
# Calls that make no device code: nothing is added where they name no arch.
NO_CODE = frozenset(
    {
        "-E",
        "--preprocess",
        "-M",
        "--generate-dependencies",
        "-MM",
        "--generate-nonsystem-dependencies",
        "-V",
        "--version",
        "-h",
        "--help",
        "-arch-ls",
        "--list-gpu-arch",
        "-code-ls",
        "--list-gpu-code",
    }
)
ANY = ("native", "all", "all-major")
_NAME = re.compile(r"^(?:sm|compute|lto)_(\d{2,3})([af]?)$")
_KEY = re.compile(r"(\w+)=(\[[^\]]*\]|\"[^\"]*\"|'[^']*'|[^,]*)")


# How a refusal names the unit's own arch flags, as its command spelt them (a two-token
# ``-gencode arch=...`` as two words): the cause table reads them back to name the flags
# to drop where the build does not print its commands (kiln.inside.causes.archs.arch_refused).
FLAGS_SAID = "; its arch flags: "


def arch_tokens(args: list[str]) -> list[str]:
    """The call's arch flags as it spells them, in order; a two-token one as its two
    words joined by a space (``-gencode arch=compute_90a,code=sm_90a``)."""
    out: list[str] = []
    for i, a in enumerate(args):
        option, sep, _ = a.partition("=")
        if option in ARCH_OPTIONS:
            out.append(a if sep else " ".join(args[i : i + 2]))
    return out


class ArchFlagError(Exception):
    """An arch flag the rewrite cannot read, or a request it must refuse."""


class Refused(ArchFlagError):
    """A call whose arch flags cover none of the archs the build makes."""

    def __init__(self, unit: str, asked: str, built: str, flags: str = "") -> None:
        super().__init__(
            f"{unit}: written for {asked} only, none of the archs this build makes "
            f"({built}): kiln compiles no unit for an arch it was not written for; leave it "
            f'out with the upstream\'s own switch (arch_control = "toggles") or a patch '
            f"(docs/archs.md)" + (f"{FLAGS_SAID}{flags}" if flags else "")
        )
        self.unit, self.asked, self.built = unit, asked, built


class Uncovered(ArchFlagError):
    """A unit's device compile whose arch flags cover some of the archs the build makes,
    not all: the rewrite gives it only those, so its shared object would lack the others
    for its kernels. Refused at that first compile, not after the whole build."""

    def __init__(self, unit: str, asked: str, kept: str, missing: str, built: str) -> None:
        super().__init__(
            f"{unit}: written for {asked}, which covers {kept} of the archs this build makes "
            f"({built}), not {missing}: the rewrite gives a unit only the built archs its "
            f"own flags cover; kiln stops at this first compile instead of refusing the "
            f"wheel after the whole build"
        )


# How the wrapper prints an error of this module (kiln.inside.diagnose reads it back).
PREFIX = "kiln arch rewrite: error: "
REFUSED = re.compile(
    r"^(?P<unit>.+?): written for (?P<asked>.+?) only, none of the archs this build makes "
    r"\((?P<built>[^)]*)\)"
)
UNCOVERED = re.compile(
    r"^(?P<unit>.+?): written for (?P<asked>.+?), which covers (?P<kept>.+?) of the archs "
    r"this build makes \((?P<built>[^)]*)\), not (?P<missing>.+?): the rewrite"
)


class Target:
    """One GPU target: ``sm_100a`` is ``Target(100, "a")``. (A plain class: a dataclass
    would cost each nvcc call the import of ``inspect``, about 12 ms.)"""

    __slots__ = ("number", "suffix")

    def __init__(self, number: int, suffix: str) -> None:
        self.number = number
        self.suffix = suffix  # "" (generic), "f" (family-specific) or "a" (arch-specific)

    @property
    def major(self) -> int:
        return self.number // 10

    @property
    def name(self) -> str:
        return f"sm_{self.number}{self.suffix}"

    def gencode(self) -> str:
        n = f"{self.number}{self.suffix}"
        return f"-gencode=arch=compute_{n},code=sm_{n}"


def target(name: str) -> Target:
    """``sm_90a``, ``compute_90a`` and ``lto_90a`` all read as ``Target(90, "a")``."""
    m = _NAME.match(name)
    if not m:
        raise ArchFlagError(f"{name!r} is not a GPU architecture nvcc knows the form of")
    return Target(int(m[1]), m[2])


def covers(asked: str, built: Target, also: Mapping[str, Sequence[str]] | None = None) -> bool:
    """Whether code written for ``asked`` (as the flags name it) may be built for
    ``built``; ``also``: the recipe's ``build.arch_also`` (an asked target -> archs the
    compiler was shown to build its code for)."""
    if asked in ANY:
        return True
    a = target(asked)
    if also and built.name in also.get(a.name, ()):
        return True
    if a.suffix == "":
        return a.number <= built.number
    if a.suffix == "f":
        return built.suffix in ("a", "f") and built.major == a.major and built.number >= a.number
    return built.suffix == "a" and built.number == a.number


def _names(option: str, value: str) -> list[str]:
    """The arch names one arch flag's value holds."""
    if not value:
        raise ArchFlagError(f"{option} has no value")
    if ARCH_OPTIONS[option] != "gencode":
        return [v for v in value.strip("[]\"'").split(",") if v]
    found = list(_KEY.finditer(value))
    keys = [m[1] for m in found]
    if ",".join(m[0] for m in found) != value or set(keys) - {"arch", "code"} or "arch" not in keys:
        raise ArchFlagError(f"{option} {value}: not in nvcc's arch=...,code=... form")
    out = []
    for _, v in (m.groups() for m in found):
        out += [x.strip() for x in v.strip("[]\"'").split(",") if x.strip()]
    return out


def split(args: list[str]) -> tuple[list[str], list[str], int | None]:
    """(the call without its arch flags, the arch names they held in order, the index in
    the remaining call where the first of them stood; None where there was none)."""
    rest: list[str] = []
    asked: list[str] = []
    first: int | None = None
    i = 0
    while i < len(args):
        a = args[i]
        option, sep, value = a.partition("=")
        if option in ARCH_OPTIONS:
            if not sep:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            asked += _names(option, value)
            first = len(rest) if first is None else first
        elif a in PASS_THROUGH:
            rest += args[i : i + 2]
            i += 1
        else:
            rest.append(a)
        i += 1
    for name in asked:
        if name not in ANY:
            target(name)  # unreadable: refused before anything runs
    return rest, list(dict.fromkeys(asked)), first


def _shown(names: list[str]) -> str:
    """The request as people read it: ``sm_90a`` for ``compute_90a`` and ``sm_90a``."""
    seen = [n if n in ANY else target(n).name for n in names]
    return ", ".join(dict.fromkeys(seen))


def rewrite(
    args: list[str],
    built: list[str],
    unit: str = "this nvcc call",
    also: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """``args`` with their arch flags replaced by one ``-gencode`` per built arch their
    request covers (in ``built``'s order); a call naming no arch gets them all, unless it
    makes no device code (``-E``, ``-M``, ``--version``: left as it is)."""
    targets = [target(b) for b in built]
    if not targets:
        raise ArchFlagError(f"{unit}: {contract.NVCC_ARCHS} names no arch")
    try:
        rest, asked, first = split(args)
    except ArchFlagError as exc:
        raise ArchFlagError(f"{unit}: {exc}") from None
    if first is None:
        if any(a in NO_CODE for a in args):
            return args
        return [*args, *(t.gencode() for t in targets)]
    keep = [t for t in targets if any(covers(a, t, also) for a in asked)]
    if not keep:
        built_names = ", ".join(t.name for t in targets)
        raise Refused(unit, _shown(asked), built_names, " ".join(arch_tokens(args)))
    return [*rest[:first], *(t.gencode() for t in keep), *rest[first:]]


def from_environment(args: list[str], unit: str) -> list[str]:
    """The rewrite kiln asked for (``KILN_NVCC_ARCHS``), or ``args`` unchanged. nvcc's own
    ``NVCC_PREPEND_FLAGS``/``NVCC_APPEND_FLAGS`` are moved into the command line (and out
    of this process's environment, which the real nvcc inherits), so their arch flags are
    rewritten too."""
    told = contract.Archs.from_env(os.environ)
    built = list(told.rewrite)
    if not built:
        return args
    before = shlex.split(os.environ.pop(NVCC_ENV_FLAGS[0], ""))
    after = shlex.split(os.environ.pop(NVCC_ENV_FLAGS[1], ""))
    whole = [*before, *args, *after]
    rewritten = rewrite(whole, built, unit, told.also)
    check_covered(whole, built, unit, told.also)
    return rewritten


def check_covered(
    args: list[str],
    built: list[str],
    unit: str,
    also: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Raise :class:`Uncovered` where a device compile of a ``.cu`` unit asks for archs
    that cover some of ``built``, not all: its kernels would be missing on the others."""
    compiles = any(a in ("-c", "--compile", "-dc", "--device-c") for a in args)
    if not compiles or not unit.endswith(".cu") or any(a in NO_CODE for a in args):
        return
    _rest, asked, first = split(args)
    if first is None:
        return  # no arch flag: it gets every built arch
    targets = [target(b) for b in built]
    keep = [t for t in targets if any(covers(a, t, also) for a in asked)]
    if keep and len(keep) < len(targets):
        raise Uncovered(
            unit,
            _shown(asked),
            ", ".join(t.name for t in keep),
            ", ".join(t.name for t in targets if t not in keep),
            ", ".join(t.name for t in targets),
        )


DROPPED = re.compile(
    r"^(?P<unit>.+?): compiled for (?P<made>.+?) only, not for (?P<missing>.+?) of the "
    r"recipe's archs \((?P<expected>[^)]*)\)"
)


class Dropped(ArchFlagError):
    """A CUDA unit whose own arch flags leave out an arch the recipe builds (its upstream
    turned TORCH_CUDA_ARCH_LIST into a list of its own): refused at its compile, not
    after the whole build."""

    def __init__(self, unit: str, made: list[str], missing: list[str], expected: list[str]):
        super().__init__(
            f"{unit}: compiled for {', '.join(made) or 'no SASS'} only, not for "
            f"{', '.join(missing)} of the recipe's archs ({', '.join(expected)}): the upstream "
            f"chose its own targets; kiln stops at this first compile instead of refusing the "
            f"wheel after the whole build"
        )


def check_expected(args: list[str], expected: list[str], shown: str | None = None) -> None:
    """Raise :class:`Dropped` where a device compile of a ``.cu`` unit (its arch flags, and
    nvcc's ``NVCC_PREPEND_FLAGS``/``NVCC_APPEND_FLAGS``) makes SASS for fewer of
    ``expected`` than the recipe builds. PTX alone is no SASS; ``all``/``native`` pass.
    ``shown``: how the error names the unit (its path in the tree)."""
    unit = unit_of(args)
    if not unit or not unit.endswith(".cu") or any(a in NO_CODE for a in args):
        return
    if not any(a in ("-c", "--compile", "-dc", "--device-c") for a in args):
        return  # a link or a whole-program call: the units' own compiles were checked
    extra = [shlex.split(os.environ.get(v, "")) for v in NVCC_ENV_FLAGS]
    _rest, asked, first = split([*extra[0], *args, *extra[1]])
    if any(a in ANY for a in asked):
        return
    made = sorted({target(n).name for n in asked if not n.startswith(("compute_", "lto_"))})
    missing = [e for e in expected if e not in made]
    if missing:
        raise Dropped(shown or unit, made if first is not None else [], missing, expected)


def unit_of(args: list[str]) -> str | None:
    """What a refusal names: the call's (first) source file, else its output."""
    suffixes = (".cu", ".cpp", ".cc", ".cxx", ".c")
    sources = [a for a in args if a.endswith(suffixes) and os.path.isfile(a)]
    if sources:
        return sources[0]
    return args[args.index("-o") + 1] if "-o" in args[:-1] else None
