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

A header of the upstream's own code that few of the build file's units reach (at most
``PRIVATE_SHARE`` of them; not in a submodule, not torch's) counts as the unit's own
code, ``OWN_WEIGHT`` times: it holds the kernels those units instantiate. A public
upstream's two decode units are 0.2 kB files instantiating one 58 kB kernel header that
only they read (105 CPU-s each on 16 cores, third-longest after two others); counted
once, beside the 13 MB of a submodule's headers that 20 of its 24 units read, they ranked
22nd and 23rd, started at 92 and 97 s of a cold build and ended 20 s after its longest
unit (docs/performance.md). Libraries (a submodule, torch's headers) are never a unit's own:
torch's 14 MB read by one binding unit would rank it above every kernel.
"""

from __future__ import annotations

import os
import re
import shlex

INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^">\n]+)[">]', re.M)
INCLUDE_FLAGS = ("-I", "-isystem", "--include-path")
FRAMEWORK_INCLUDE = os.sep + os.path.join("torch", "include")  # torch's, counted too
OWN_WEIGHT = 10  # a unit's own bytes against those of the headers it reaches
PRIVATE_SHARE = 0.25  # a header reached by at most this share of the units is theirs
SUBMODULE_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.M)  # in .gitmodules


def libraries(tree: str) -> list[str]:
    """The tree's submodule folders (its ``.gitmodules``): code of others, never a
    unit's own."""
    try:
        with open(os.path.join(tree, ".gitmodules")) as fh:
            text = fh.read()
    except OSError:
        return []
    return [os.path.normpath(os.path.join(tree, p)) for p in SUBMODULE_PATH.findall(text)]


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

    def __init__(self, dirs: list[str], libraries: list[str] | None = None) -> None:
        self.dirs = dirs
        self.libraries = [os.path.normpath(p) for p in libraries or []]
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
        """The unit's rank alone: its closure's bytes plus its own, weighted (see above)."""
        return self.size(source) + (OWN_WEIGHT - 1) * self._read(os.path.normpath(source))[0]

    def estimates(self, sources: list[str]) -> dict[str, int]:
        """Each unit's rank among ``sources`` (one build file's): its closure's bytes,
        its own file's and the headers of the upstream's own code that few of them reach
        (``PRIVATE_SHARE``) weighted ``OWN_WEIGHT`` times (see above)."""
        reached = {s: self.files(s) for s in sources}
        units: dict[str, int] = {}
        for found in reached.values():
            for path in found:
                units[path] = units.get(path, 0) + 1
        few = max(1, int(len(sources) * PRIVATE_SHARE))
        out: dict[str, int] = {}
        for source, found in reached.items():
            own = os.path.normpath(source)
            total = 0
            for path in found:
                size = self._read(path)[0]
                mine = path == own or (units[path] <= few and not self._library(path))
                total += size * (OWN_WEIGHT if mine else 1)
            out[source] = total
        return out

    def _library(self, path: str) -> bool:
        """A header of others' code: a submodule's, or torch's."""
        if FRAMEWORK_INCLUDE + os.sep in path:
            return True
        return any(path.startswith(lib + os.sep) for lib in self.libraries)

    def size(self, source: str) -> int:
        """Bytes of ``source`` and of every header it reaches (each counted once)."""
        return sum(self._read(path)[0] for path in self.files(source))

    def files(self, source: str) -> set[str]:
        """``source`` and every header it reaches."""
        seen: set[str] = set()
        stack = [os.path.normpath(source)]
        while stack:
            path = stack.pop()
            if path in seen:
                continue
            seen.add(path)
            here = os.path.dirname(path)
            for name in self._read(path)[1]:
                found = self._resolve(name, here)
                if found is not None and found not in seen:
                    stack.append(found)
        return seen
