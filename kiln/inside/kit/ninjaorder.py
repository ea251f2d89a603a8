#!/usr/bin/env python3
"""kiln's ``ninja``, first on a build's PATH (``.kiln/order/ninja``): puts the build
file's compiles in critical-path order, then runs the real ninja (stdlib only).

Why: a step offers no more compiles than it can run at once (``MAX_JOBS``, see
``kiln/plan/schedule.py``), so the compile gate has no queue to pick the longest unit
from; ninja starts ready jobs in the order its build file lists them (its tie-break
when nothing else ranks them). A long unit listed last starts last and runs alone while
the other cores idle. With learned figures (``KILN_GATE_HINTS``), the ``build``
statements of the units are put longest first (their learned CPU time, else their
family's: ``compilegate.hinted_priority``), each run of consecutive ``build``
statements on its own, everything else left where it stands (a statement never moves
past a variable, rule or include it may read). Nothing learned (a first build): by the
estimate of ``unitsize.py`` (the upstream code each unit reads), so the long units
still start first. The order changes no output byte; anything unexpected leaves the
file as it was.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

try:
    from kiln.inside.kit import compileflags, compilegate, unitsize
except ImportError:  # run as .kiln/ninjaorder.py: the kit's copies beside it
    import compileflags  # type: ignore[no-redef]
    import compilegate  # type: ignore[no-redef]
    import unitsize  # type: ignore[no-redef]

ORDER_DIR = "order"  # .kiln/order/ninja: the wrapper kiln puts first on PATH


def real_ninja(path: str, own: str) -> str | None:
    """The first ``ninja`` on ``path`` that is not this wrapper's folder ``own``."""
    own = os.path.realpath(own)
    for folder in path.split(os.pathsep):
        if not folder or os.path.realpath(folder) == own:
            continue
        found = os.path.join(folder, "ninja")
        if os.path.isfile(found) and os.access(found, os.X_OK):
            return found
    return None


def build_file(args: list[str]) -> str:
    """The build file ninja will read: ``-C DIR`` and ``-f FILE`` as ninja takes them."""
    folder, name = ".", "build.ninja"
    for i, a in enumerate(args):
        for flag in ("-C", "-f"):
            value = None
            if a == flag and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(flag) and len(a) > 2:
                value = a[2:]
            if value is not None and flag == "-C":
                folder = os.path.join(folder, value)
            elif value is not None:
                name = value
    return os.path.join(folder, name)


def _tokens(line: str) -> list[str]:
    """A ``build`` line's words, ninja's ``$`` escapes read; ``:`` (the end of the
    outputs) as a word of its own."""
    out, cur, i = [], "", 0
    while i < len(line):
        c = line[i]
        if c == "$" and i + 1 < len(line):
            nxt = line[i + 1]
            cur += nxt if nxt in " :$" else "$" + nxt  # a variable: kept, then skipped
            i += 2
            continue
        if c in " \t\n":
            if cur:
                out.append(cur)
            cur = ""
        elif c == ":":
            if cur:
                out.append(cur)
            out.append(":")
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        out.append(cur)
    return out


def first_input(statement: str) -> str | None:
    """The first explicit input of a ``build`` statement (None: phony, none, a variable)."""
    logical = statement.replace("$\n", " ").split("\n", 1)[0]
    words = _tokens(logical[len("build ") :])
    if ":" not in words:
        return None
    after = words[words.index(":") + 1 :]
    if len(after) < 2 or after[0] == "phony" or after[1].startswith("|") or "$" in after[1]:
        return None
    return after[1]


def _statements(text: str) -> list[str]:
    """The file cut into statements: a ``build`` line with its ``$``-continued lines and
    its indented bindings, or any other line alone."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        chunk = lines[i]
        i += 1
        while chunk.rstrip("\n").endswith("$") and i < len(lines):  # a continued line
            chunk += lines[i]
            i += 1
        if chunk.startswith("build "):
            while i < len(lines) and lines[i][:1] in (" ", "\t") and lines[i].strip():
                chunk += lines[i]
                i += 1
        out.append(chunk)
    return out


def _unit(part: str, folder: str, tree: str) -> str | None:
    """The unit a ``build`` statement compiles, as a path in ``tree`` (None: not one)."""
    source = first_input(part) if part.startswith("build ") else None
    if source is None:
        return None  # a link or phony statement
    path = os.path.realpath(os.path.join(folder, source))
    return os.path.relpath(path, tree) if compileflags.inside(path, tree) else None


def units(text: str, folder: str, tree: str) -> list[str]:
    """Every unit the build file compiles, in its order (paths in ``tree``)."""
    found = (_unit(part, folder, tree) for part in _statements(text))
    return [unit for unit in found if unit is not None]


def reorder(text: str, folder: str, tree: str, priority: Callable[[str], float]) -> str:
    """``text`` with each run of consecutive unit ``build`` statements longest first
    (``priority`` of the unit's path in ``tree``); blank lines and comments inside a run
    stay where they are, anything else ends the run."""
    parts = _statements(text)
    runs: list[list[int]] = [[]]
    keys: dict[int, float] = {}
    for i, part in enumerate(parts):
        if part.startswith("build "):
            unit = _unit(part, folder, tree)
            if unit is None:
                continue  # a link or phony statement: stays, the run goes on around it
            keys[i] = priority(unit)
            runs[-1].append(i)
        elif part.strip() and not part.lstrip().startswith("#"):
            runs.append([])
    out = list(parts)
    for run in runs:
        ranked = sorted(run, key=lambda i: -keys[i])  # stable: equal ones keep their order
        for place, i in zip(run, ranked, strict=True):
            out[place] = parts[i] if parts[i].endswith("\n") else parts[i] + "\n"
    if out and not parts[-1].endswith("\n"):
        out[-1] = out[-1].rstrip("\n")
    return "".join(out)


def order_build_file(path: str) -> bool:
    """Reorder ``path`` in place, by learned figures where they name units, else by
    the estimate from the upstream's code (True: it changed)."""
    tree = dict(compileflags.env_roots()).get("TREE")
    if not tree or not os.path.isfile(path):
        return False
    tree = os.path.realpath(tree)
    with open(path) as fh:
        text = fh.read()
    folder = os.path.dirname(os.path.abspath(path))
    estimates: dict[str, int] = {}
    priority: Callable[[str], float]
    if compilegate.learned_hints().get("units"):
        priority = compilegate.hinted_priority
    else:
        closure = unitsize.Closure(unitsize.include_dirs(text, tree), unitsize.libraries(tree))
        listed = units(text, folder, tree)
        ranks = closure.estimates([os.path.join(tree, unit) for unit in listed])
        estimates.update({unit: ranks[os.path.join(tree, unit)] for unit in listed})

        def estimate(unit: str) -> float:
            return float(estimates.get(unit, 0))

        priority = estimate

    ordered = reorder(text, folder, tree, priority)
    if not compilegate.learned_hints().get("units"):
        # The gate ranks compiles that wait together by the same estimate: ninja starts
        # them in this order, but they reach the gate in whatever order they happen to.
        compilegate.write_estimates(tree, estimates)
    if ordered == text:
        return False
    tmp = f"{path}.kiln-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(ordered)
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
    os.replace(tmp, path)
    return True


def main(argv: list[str]) -> int:
    own = os.path.join(os.path.dirname(os.path.abspath(__file__)), ORDER_DIR)
    ninja = real_ninja(os.environ.get("PATH", ""), own)
    if ninja is None:
        print("kiln: no ninja on PATH behind kiln's (.kiln/order/ninja)", file=sys.stderr)
        return 127
    try:
        order_build_file(build_file(argv[1:]))
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # the order is a nicety
        print(f"kiln: build file left in its own order: {exc!r}", file=sys.stderr)
    os.execv(ninja, [ninja, *argv[1:]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
