"""The rows of the GPU architectures: an arch an upstream's table drops, an instruction
an arch lacks, an arch this CUDA does not know, a unit the arch rewrite refused or
would not cover."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from kiln.inside.causes.cause import Cause, Failure, toml_edit
from kiln.inside.causes.places import ARCH_SINCE, ARCH_UNTIL, argv_of, nvcc_version, version_tuple
from kiln.inside.kit import archflags, contract


def _torch_form(arch: str) -> str:
    """``sm_103a`` -> ``10.3a`` (as TORCH_CUDA_ARCH_LIST and upstream tables spell it)."""
    m = re.match(r"sm_(\d+)(\d)([af]?)$", arch)
    return f"{m[1]}.{m[2]}{m[3]}" if m else arch


def _arch_table(tree: Path, made: list[str], missing: list[str]) -> str | None:
    """Where the upstream's setup.py turns TORCH_CUDA_ARCH_LIST into its own targets: the
    first line naming an arch it made (``10.0a``, ``100a``) and none it dropped."""
    setup = tree / "setup.py"
    try:
        lines = setup.read_text(errors="replace").splitlines()
    except OSError:
        return None

    def forms(a: str) -> tuple[str, ...]:
        return (_torch_form(a), a.removeprefix("sm_"))

    for i, line in enumerate(lines, 1):
        if any(x in line for a in made for x in forms(a)) and not any(
            x in line for a in missing for x in forms(a)
        ):
            return f"setup.py:{i}"
    return None


def arch_dropped(f: Failure) -> Cause | None:
    """A CUDA unit made fewer archs than TORCH_CUDA_ARCH_LIST named (kiln's wrapper
    stopped it at its first compile)."""
    for err in f.d.errors:
        m = archflags.DROPPED.match(err.render()) if err.tool == "kiln" else None
        if not m:
            continue
        made = [a.strip() for a in m["made"].split(",") if a.strip() != "no SASS"]
        missing = [a.strip() for a in m["missing"].split(",")]
        listed = f.env.get("TORCH_CUDA_ARCH_LIST", "")
        where = _arch_table(f.tree, made, missing)
        forms = ", ".join(_torch_form(a) for a in missing)
        # the rewrite gives a unit only the archs its own flags cover (an arch-specific
        # target covers itself alone): offered only where the targets made cover the rest
        rewrite = bool(made) and all(
            any(archflags.covers(a, archflags.target(x)) for a in made) for x in missing
        )
        table = f" ({where})" if where else ""
        return Cause(
            "arch-dropped",
            f'kiln set TORCH_CUDA_ARCH_LIST={listed} (arch_control = "torch-arch-list") and '
            f"the upstream asked nvcc for {', '.join(made) or 'no SASS'} only for {m['unit']}: "
            f"it maps the list through targets of its own and leaves "
            f"{', '.join(_torch_form(a) for a in missing)} out"
            + (f" (its arch table: {where})" if where else ""),
            f"give the upstream's table{table} an entry for {forms} (a patch in patches/)"
            + (
                f', or let kiln set every unit\'s archs: arch_control = "rewrite" in '
                f"vendors/{f.vendor}.toml"
                if rewrite
                else f' (arch_control = "rewrite" would not do: {", ".join(made)} covers '
                f"{'itself' if len(made) == 1 else 'themselves'} alone, so the rewrite stops "
                f"the unit as arch-uncovered)"
            )
            + f", or leave {', '.join(missing)} out of build.archs",
        )
    return None


# PTX instructions of one architecture's own features -> the targets that have them
# (PTX ISA 9.0, "Target ISA notes").
INSTRUCTION_ARCHS: tuple[tuple[str, str], ...] = (
    ("wgmma.", "sm_90a only (Hopper's warpgroup MMA; SM100 has tcgen05 instead)"),
    ("tcgen05.", "sm_100a, sm_101a, sm_103a, sm_110a and their families (sm_100f, ...)"),
    ("setmaxnreg", "sm_90a, sm_100a, sm_101a, sm_103a, sm_120a and their families"),
    ("cp.async.bulk.tensor", "sm_90 and later"),
    ("multimem.", "sm_90 and later"),
    ("mbarrier.try_wait", "sm_90 and later"),
    ("elect.sync", "sm_90 and later"),
)
# PTX instruction prefix -> the arch-specific targets that have it (their families too);
# others: the first generic arch that has it.
INSTRUCTION_TARGETS: tuple[tuple[str, frozenset[str], int], ...] = (
    ("wgmma.", frozenset({"90a"}), 0),
    ("tcgen05.", frozenset({"100a", "101a", "103a", "110a", "100f", "101f", "103f", "110f"}), 0),
    ("setmaxnreg", frozenset({"90a", "100a", "101a", "103a", "120a", "100f", "103f", "120f"}), 0),
    ("cp.async.bulk.tensor", frozenset(), 90),
    ("multimem.", frozenset(), 90),
    ("mbarrier.try_wait", frozenset(), 90),
    ("elect.sync", frozenset(), 90),
)


def _has_instruction(insn: str, arch: str) -> bool:
    """Whether ``arch`` (``sm_100a``) has the PTX instruction ``insn`` (unknown: assume so)."""
    name = arch.removeprefix("sm_").removeprefix("compute_")
    for prefix, specific, generic in INSTRUCTION_TARGETS:
        if insn.startswith(prefix):
            number = int(re.sub(r"\D", "", name) or 0)
            return name in specific if specific else number >= generic
    return True


def _built_archs(env: Mapping[str, str]) -> list[str]:
    """The archs the step builds, as kiln told its compiler wrapper or torch."""
    told = contract.Archs.from_env(env).named
    if told:
        return list(told)
    listed = [a.removesuffix("+PTX") for a in env.get("TORCH_CUDA_ARCH_LIST", "").split(";")]
    return [f"sm_{a.replace('.', '')}" for a in listed if a]


_PTX_INSN = re.compile(
    r"Instruction '(?P<insn>[\w.]+)' (?:not supported on \.target|cannot be compiled for "
    r"architecture) '(?P<target>sm_\w+)'"
)


def ptx_instruction(f: Failure) -> Cause | None:
    """ptxas refuses an instruction the unit's target does not have (Hopper's wgmma built
    for sm_100a): the unit, the arch, which archs have it, where its PTX is kept."""
    for err in f.d.errors:
        m = _PTX_INSN.search(err.message)
        if not m or err.tool != "ptxas":
            continue
        insn, target = m["insn"], m["target"]
        has = next((a for p, a in INSTRUCTION_ARCHS if insn.startswith(p)), None)
        unit = f.d.unit or "a unit"
        kept = f" (its PTX, kept: {err.file}:{err.line})" if err.file else ""
        built = _built_archs(f.env)
        having = [a for a in built if _has_instruction(insn, a)]
        guard = (
            f"compile {unit} only for archs that have {insn}: the upstream's arch guard "
            f"around that code (#if __CUDA_ARCH__ ...) or its switch for the unit "
            f'(arch_control = "toggles" with build.arch_toggles in vendors/{f.vendor}.toml)'
        )
        if built and not having:
            # leaving the arch out only moves the failure to the next one of the build
            fix = (
                f"{guard}; no arch this build makes ({', '.join(built)}) has {insn}: "
                f"leaving {target} out of build.archs does not help (the next arch fails the "
                f"same, or none is left), the code must not be compiled for them"
            )
        else:
            fix = f"{guard}, or leave {target} out of build.archs"
        return Cause(
            "ptx-instruction",
            f"{unit} was compiled for {target}, and its device code uses {insn}"
            + (f", which exists on {has}" if has else f", which {target} does not have")
            + kept,
            fix,
        )
    return None


_ARCH = re.compile(r"(?:Unsupported gpu architecture|Value) '(?:compute_|sm_)(?P<arch>\d+[af]?)'")


def _own_arch_flags(f: Failure, archs: set[str]) -> list[str] | None:
    """The failed unit's single-token arch flags (``-gencode=arch=...``, ``-arch=sm_...``,
    read as kiln's compiler wrapper reads them) that name one of ``archs`` (``"90a"``):
    the upstream's own, which the wrapper can drop token by token. None where one of them
    is a two-token ``-gencode arch=...`` (its ``-gencode`` is shared, so it cannot be
    dropped that way)."""
    flags = []
    for flag in archflags.arch_tokens(argv_of(f.d.command)):
        try:
            _, names, _ = archflags.split(flag.split(" "))
        except archflags.ArchFlagError:
            continue
        if any(n.split("_", 1)[-1] in archs for n in names):
            if " " in flag:
                return None
            flags.append(flag)
    return list(dict.fromkeys(flags))


def _drop_flags(flags: list[str]) -> str:
    return f"build.nvcc_drop_flags = [{', '.join(json.dumps(x) for x in flags)}]"


def unknown_arch(f: Failure) -> Cause | None:
    for message in f.messages:
        m = _ARCH.search(message)
        if not m or ("Unsupported" not in message and "is not defined" not in message):
            continue
        arch = m["arch"]
        nvcc = nvcc_version(f.env) or "unknown"
        since, until = ARCH_SINCE.get(arch), ARCH_UNTIL.get(arch)
        if since and until:
            has = f"sm_{arch} is known to CUDA {since} to {until}"
        elif since:
            has = f"sm_{arch} needs CUDA {since} or newer"
        else:
            has = f"no CUDA release kiln knows of has sm_{arch}"
        cause = f"this build's nvcc (CUDA {nvcc}) does not know sm_{arch}: {has}"
        fix = (
            f"set the profile's cuda (and builder image) to a CUDA that has sm_{arch}, or drop "
            f"sm_{arch} from the archs (build.archs / the profile's archs; an arch the "
            f"upstream hard-codes: build.nvcc_drop_flags)"
        )
        if since and nvcc != "unknown" and version_tuple(nvcc) >= version_tuple(since):
            fix = f"sm_{arch} was renamed or dropped: {fix}"
        hard = [] if f"sm_{arch}" in _built_archs(f.env) else _own_arch_flags(f, {arch})
        edit = None
        if hard:
            # the upstream's own flag (kiln was not asked for the arch): dropping that
            # token is a mechanical edit ``kiln build --fix`` applies
            edit = toml_edit(f.vendor, ["build", "nvcc_drop_flags"], append=hard)
            fix = (
                f"the upstream hard-codes {' '.join(hard)}: add {_drop_flags(hard)} to "
                f"vendors/{f.vendor}.toml (kiln's compiler wrapper removes it); or {fix}"
            )
        return Cause("unknown-arch", cause, fix, edit=edit)
    return None


def _said_arch_flags(refusal: str) -> list[str] | None:
    """The unit's own arch flags as the wrapper's refusal names them (a build that runs
    nvcc without printing its commands); None where one is a two-token ``-gencode
    arch=...`` (it cannot be dropped token by token) or none is named."""
    _, sep, said = refusal.partition(archflags.FLAGS_SAID)
    words = said.split() if sep else []
    if not words or any("=" not in w for w in words):
        return None
    return list(dict.fromkeys(words))


def arch_refused(f: Failure) -> Cause | None:
    """A unit whose own arch flags cover none of the archs the rewrite builds. Building
    its archs too does not help (the unit would then cover some of the build's archs, not
    all: arch-uncovered), so the fix is to drop its flags where its code is valid on the
    build's archs, or to leave it out."""
    for err in f.d.errors:
        m = archflags.REFUSED.match(err.render()) if err.tool == "kiln" else None
        if not m:
            continue
        asked = {name.strip().split("_", 1)[-1] for name in m["asked"].split(",")}
        own = _own_arch_flags(f, asked) or _said_arch_flags(err.render())
        drop = (
            f"drop its own arch flags so the rewrite gives it the build's archs: "
            f"{_drop_flags(own)} in vendors/{f.vendor}.toml (kiln's compiler wrapper removes "
            f"them from this vendor's nvcc calls)"
            if own
            else "a patch that drops its own arch flags (the rewrite then gives it the "
            "build's archs)"
        )
        return Cause(
            "arch-refused",
            f'kiln\'s arch rewrite (arch_control = "rewrite") compiles a unit only for the '
            f"archs its own flags cover, and {m['unit']}'s ({m['asked']}) cover none of "
            f"{m['built']}: an arch-specific target covers only itself, a family one the later "
            f"archs of its family, a generic one every later arch (docs/archs.md)",
            f"where {m['unit']}'s code is valid on {m['built']}, {drop}; else leave "
            f"{m['unit']} out of this build with the upstream's own switch "
            f'(arch_control = "toggles" with build.arch_toggles in vendors/{f.vendor}.toml) '
            f"or a patch",
        )
    return None


def arch_uncovered(f: Failure) -> Cause | None:
    """A unit's own arch flags cover only some of the archs the rewrite builds (an
    arch-specific target of one of them): stopped at its first compile."""
    for err in f.d.errors:
        m = archflags.UNCOVERED.match(err.render()) if err.tool == "kiln" else None
        if not m:
            continue
        kept = ", ".join(f'"{a.strip()}"' for a in m["kept"].split(","))
        return Cause(
            "arch-uncovered",
            f'kiln\'s arch rewrite (arch_control = "rewrite") gives a unit only the archs its '
            f"own flags cover, and {m['unit']} asks for {m['asked']}, which covers "
            f"{m['kept']} alone: an arch-specific target runs on that arch only, so its "
            f"kernels would be missing on {m['missing']} (docs/archs.md)",
            f"where the unit's code is valid on the whole family, ask for the family target "
            f"(e.g. -gencode=arch=compute_100f,code=sm_100f: a patch in patches/); else build "
            f"only what it covers: build.archs = [{kept}] in vendors/{f.vendor}.toml",
        )
    return None
