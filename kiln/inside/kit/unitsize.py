"""A compile's cost before anything is learned, from the upstream's own code (standard
library only: it runs inside build containers, in kiln's ``ninja``).

Why: with nothing learned (a first build of a recipe: a CI runner, a new pod), the order
in which ninja offers units is the upstream's, and a long unit listed late starts late
and runs on alone while the other cores idle (an upstream's two longest units, 150 s
each on 16 cores, were 17th and 18th of 24 in its list). A unit costs what its front end
reads and what it instantiates; the estimate is the bytes of the unit's include closure
inside the upstream's tree (its submodules included) plus ``OWN_WEIGHT`` times its own
file's bytes (the kernels a unit defines are all compiled; a header's templates only
where used). It is rough and only ranks; checked against learned CPU times on the public
upstreams in docs/performance.md.

How: ``#include "x"`` and ``#include <x>`` are followed through the including file's
folder and the build file's ``-I``/``-isystem`` folders inside the tree (an estimate, not
the compiler's search), and torch's own include folders (``.../torch/include``): a unit
that includes torch's extension headers reads 14 MB of them (torch 2.14's
``torch/extension.h``), as much as a CUTLASS kernel reads of CUTLASS, and takes as long
(an upstream's torch binding, 0.5 MB of its own code, 29 CPU-s: third of its 24 units;
ranked last without torch's, it ran alone at the end of a cold build:
docs/performance.md). They are read once per build file (0.2 s). Other headers outside
the tree (CUDA's, the C++ library's) are not counted: every unit reads them alike. An
``#include`` under an ``#if`` counts as if taken. Each header is read once.
"""

from __future__ import annotations

import os
import re
import shlex

INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^">\n]+)[">]', re.M)
INCLUDE_FLAGS = ("-I", "-isystem", "--include-path")
FRAMEWORK_INCLUDE = os.sep + os.path.join("torch", "include")  # torch's, counted too
OWN_WEIGHT = 10  # a unit's own bytes against those of the headers it reaches


def include_dirs(build_text: str, tree: str) -> list[str]:
    """Every include folder inside ``tree`` (or of torch's) a ninja build file's
    variables name, in order, once."""
    out: list[str] = []
    for line in build_text.splitlines():
        name, eq, value = line.partition(" = ")
        if not eq or not name or name[0] in " \t" or " " in name.strip():
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
        for i, word in enumerate(words):
            for flag in INCLUDE_FLAGS:
                folder = None
                if word == flag and i + 1 < len(words):
                    folder = words[i + 1]
                elif word.startswith(flag) and len(word) > len(flag) and flag == "-I":
                    folder = word[len(flag) :]
                elif word.startswith(flag + "="):
                    folder = word[len(flag) + 1 :]
                real = os.path.realpath(folder) if folder else ""
                inside = real == tree or real.startswith(tree + os.sep)
                torch = FRAMEWORK_INCLUDE in real + os.sep
                if folder and (inside or torch) and os.path.isdir(folder) and folder not in out:
                    out.append(folder)
    return out


class Closure:
    """Include-closure sizes of units sharing one build file's include folders."""

    def __init__(self, dirs: list[str]) -> None:
        self.dirs = dirs
        self._includes: dict[str, tuple[int, list[str]]] = {}
        self._found: dict[tuple[str, str], str | None] = {}

    def _read(self, path: str) -> tuple[int, list[str]]:
        """A file's size and the names it includes (read once)."""
        known = self._includes.get(path)
        if known is None:
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                data = b""
            names = [m.decode("utf-8", "replace") for m in INCLUDE.findall(data)]
            known = self._includes[path] = (len(data), names)
        return known

    def _resolve(self, name: str, here: str) -> str | None:
        key = (name, here)
        if key not in self._found:
            found = None
            for folder in (here, *self.dirs):
                candidate = os.path.normpath(os.path.join(folder, name))
                if os.path.isfile(candidate):
                    found = candidate
                    break
            self._found[key] = found
        return self._found[key]

    def estimate(self, source: str) -> int:
        """The unit's rank: its closure's bytes plus its own, weighted (see above)."""
        return self.size(source) + (OWN_WEIGHT - 1) * self._read(os.path.normpath(source))[0]

    def size(self, source: str) -> int:
        """Bytes of ``source`` and of every header it reaches (each counted once)."""
        seen: set[str] = set()
        stack = [os.path.normpath(source)]
        total = 0
        while stack:
            path = stack.pop()
            if path in seen:
                continue
            seen.add(path)
            size, names = self._read(path)
            total += size
            here = os.path.dirname(path)
            for name in names:
                found = self._resolve(name, here)
                if found is not None and found not in seen:
                    stack.append(found)
        return total
