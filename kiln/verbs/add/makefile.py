"""What a Makefile at the top of a tree says about its build (``kiln add``, issue 40): the
shared objects its rules make (the targets ``make`` is asked for: an upstream's default
goal is often a test program the release does not ship), the variables that name nvcc
by a path (set on make's command line to kiln's wrapper, which a ``?=`` or ``=`` in the
file cannot then override; nvcc by name is the wrapper already, first on PATH), a recipe
that runs nvcc by a literal path (past the wrapper), and what of Python its ``$(shell
...)`` calls import. Read from the file's text; nothing is run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from kiln.verbs.add.pysetup import Seen

# make's own order of the names it looks for
NAMES = ("GNUmakefile", "makefile", "Makefile")
_ASSIGN = re.compile(r"^(?:override\s+|export\s+)?([A-Za-z_][\w.-]*)\s*(\?=|:{1,3}=|\+=|!=|=)(.*)$")
_RULE = re.compile(r"^([^\t=#:][^=#:]*?)\s*::?(?!=)(.*)$")
_IMPORTS = (
    re.compile(r"\bpython3?(?:\.\d+)?\s+-m\s+([A-Za-z_][\w.]*)"),
    re.compile(r"-c\s+[\"']?\s*import\s+([A-Za-z_][\w.]*)"),
)
# the interpreter's extension suffix, as a Makefile asks for it
_EXT_SUFFIX = re.compile(r"--extension-suffix|EXT_SUFFIX")
_LITERAL_NVCC = re.compile(r"(?:^|\s)(/[^\s$]*/nvcc)\b")


@dataclass(frozen=True)
class SharedTarget:
    """A rule's target that is a shared object, as a glob of the release's outputs."""

    target: str | None  # what make is asked for (None: a name make alone expands)
    pattern: str
    seen: Seen


@dataclass
class Makefile:
    name: str  # the file make reads (GNUmakefile, makefile or Makefile)
    shared: list[SharedTarget] = field(default_factory=list)
    nvcc_vars: list[tuple[str, Seen]] = field(default_factory=list)
    literal_nvcc: list[Seen] = field(default_factory=list)  # a recipe's own path to nvcc
    imports: list[tuple[str, Seen]] = field(default_factory=list)  # $(shell python -m X)
    arch_lines: list[Seen] = field(default_factory=list)  # -gencode/-arch/COMPUTE... lines
    modules: dict[str, Seen] = field(default_factory=dict)  # Python modules sources declare


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, the line) with backslash continuations joined and comments
    cut (make's ``#`` outside a recipe; a recipe's shell comment too, which is harmless
    here)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = pending + raw
        pending = ""
        out.append((start, re.sub(r"(?<!\\)#.*", "", line).rstrip()))
    return out


def read(tree: Path) -> Makefile | None:
    """The top Makefile's findings, where ``tree`` has one; else None."""
    name = next((n for n in NAMES if (tree / n).is_file()), None)
    if name is None:
        return None
    text = (tree / name).read_text(errors="replace")
    raw = text.splitlines()
    found = Makefile(name)
    suffix_vars: set[str] = set()

    def seen(number: int) -> Seen:
        return Seen(name, number, raw[number - 1].strip())

    lines = _logical_lines(text)
    for number, line in lines:
        if not line.strip() or line.startswith("\t"):
            continue
        if m := _ASSIGN.match(line):
            var, value = m.group(1), m.group(3).strip()
            words = value.split()
            if words and words[0].rsplit("/", 1)[-1] == "nvcc" and "/" in words[0]:
                # nvcc by its path: set on make's command line where it is all the value;
                # with flags after it, setting it would drop them (named as bypassing)
                if len(words) == 1:
                    found.nvcc_vars.append((var, seen(number)))
                else:
                    found.literal_nvcc.append(seen(number))
            if _EXT_SUFFIX.search(value):
                suffix_vars.add(var)
    for number, line in lines:
        if re.search(r"-gencode|\b-arch\b|--gpu-architecture|\bsm_\d+|COMPUTE_CAPABILITY", line):
            found.arch_lines.append(seen(number))
        for pattern in _IMPORTS:
            for m in pattern.finditer(line):
                found.imports.append((m.group(1), seen(number)))
        if line.startswith("\t"):
            if _LITERAL_NVCC.search(line):
                found.literal_nvcc.append(seen(number))
            continue
        if _ASSIGN.match(line) or not (rule := _RULE.match(line)):
            continue
        # a rule's targets; a prerequisite too where it is a module named through the
        # extension-suffix variable (`all: mod$(SUFFIX)` made by `%$(SUFFIX): %.cu`)
        named = [*rule.group(1).split(), *(p for p in rule.group(2).split() if "$" in p)]
        for target in named:
            shared = _shared(target, suffix_vars)
            if shared and all(s.pattern != shared for s in found.shared):
                asked = target if "$" not in target else None
                found.shared.append(SharedTarget(asked, shared, seen(number)))
    first: dict[str, tuple[str, Seen]] = {}  # each module once, where first seen
    for module, where in found.imports:
        first.setdefault(module, (module, where))
    found.imports = list(first.values())
    return found


def _shared(target: str, suffix_vars: set[str]) -> str | None:
    """The output glob of a rule target that makes a shared object: a literal ``.so``
    path, or a name ending in a variable holding the interpreter's extension suffix."""
    if "%" in target:
        return None
    if "$" not in target:
        return target if target.endswith(".so") or ".so." in target else None
    m = re.fullmatch(r"([^$]+)\$[({](\w+)[)}]", target)
    if m and m.group(2) in suffix_vars:
        return f"{m.group(1)}*.so"
    return None
