"""The headers a build's sources reach, and who provides each.

From each source file the build compiles, kiln follows ``#include`` lines (every one,
whatever ``#if`` surrounds it: a header behind a switch the build may turn on counts)
and resolves each header in this order: the file's own folder (for ``"..."``), the tree
and its submodules (any file whose path ends with the header's), CUDA (the CUDA home and
the CUDA runtime's pip wheels), torch's headers, the other packages of the build venv
(the profile's ``build_tools``: NVSHMEM, NCCL, ...) and the build Python's own headers.
It reads on into the tree's headers and the build venv's packages, not into CUDA's,
torch's or Python's (those are complete as shipped: torch was built against them). What
none of them provides is the build machine's to provide: ``missing``.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kiln.verbs.add.pysetup import Seen

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)


@dataclass(frozen=True)
class Root:
    """A folder headers are found in, who provides it, and whether kiln reads on there."""

    path: Path
    provider: str  # "CUDA", "torch", "the build venv (<name>)", "Python"
    follow: bool
    label: str  # how its files are shown: "<site-packages>/nvidia/nccl/include/..."


@dataclass(frozen=True)
class Include:
    header: str
    seen: Seen  # the #include line
    source: str  # the compiled source it was reached from


@dataclass
class Closure:
    missing: list[Include] = field(default_factory=list)  # provided by nobody kiln knows
    provided: dict[str, str] = field(default_factory=dict)  # header -> provider
    reaches: dict[str, set[str]] = field(default_factory=dict)  # source -> headers it reaches
    first: dict[str, Include] = field(default_factory=dict)  # header -> where first included


class TreeIndex:
    """Every file of a tree by each tail of its path (``a/b/c.h``: ``c.h``, ``b/c.h``...)."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.by_tail: dict[str, list[str]] = {}
        for path in sorted(tree.rglob("*")):
            if ".git" in path.parts or not path.is_file():
                continue
            rel = path.relative_to(tree)
            parts = rel.parts
            for i in range(len(parts)):
                self.by_tail.setdefault("/".join(parts[i:]), []).append(str(rel))

    def find(self, header: str) -> Path | None:
        hits = self.by_tail.get(header.lstrip("./"))
        if not hits:
            return None
        # An include folder's file over any other, then the shortest path.
        best = min(hits, key=lambda r: ("/include/" not in f"/{r}", len(r), r))
        return self.tree / best


def external_roots(
    cuda_home: Path | None, site_packages: Path | None, python_include: Path | None
) -> list[Root]:
    roots: list[Root] = []
    if cuda_home is not None:
        roots.append(Root(cuda_home / "include", "CUDA", False, "$CUDA_HOME/include"))
        roots.append(Root(cuda_home / "include" / "cccl", "CUDA", False, "$CUDA_HOME/include/cccl"))
    if site_packages is not None:
        site = site_packages

        def root(path: Path, provider: str, follow: bool) -> Root:
            return Root(path, provider, follow, f"<site-packages>/{path.relative_to(site)}")

        nvidia = site / "nvidia"
        for d in sorted(nvidia.glob("cu[0-9]*/include")):  # the CUDA runtime's wheels
            roots += [root(d, "CUDA", False), root(d / "cccl", "CUDA", False)]
        torch = site / "torch" / "include"
        roots += [
            root(torch, "torch", False),
            root(torch / "torch" / "csrc" / "api" / "include", "torch", False),
        ]
        for d in sorted(nvidia.glob("*/include")):
            if not re.match(r"cu\d", d.parent.name):
                roots.append(root(d, f"the build venv (nvidia/{d.parent.name})", True))
        for d in sorted(site.glob("*/include")):
            if d.parent.name not in ("torch", "nvidia"):
                roots.append(root(d, f"the build venv ({d.parent.name})", True))
    if python_include is not None:
        roots.append(Root(python_include, "Python", False, "<Python's include>"))
    return [r for r in roots if r.path.is_dir()]


def _includes(path: Path) -> list[tuple[str, str, int, str]]:
    """(kind < or ", header, line, the line's text) of each #include in ``path``."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for m in _INCLUDE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append((m.group(1), m.group(2).strip(), line, m.group(0).strip()))
    return out


def closure(tree: Path, sources: Sequence[str], roots: Iterable[Root]) -> Closure:
    """Follow the includes of ``sources`` (paths relative to ``tree``)."""
    index = TreeIndex(tree)
    roots = list(roots)
    parsed: dict[Path, list[tuple[str, str, int, str]]] = {}
    resolved: dict[tuple[Path, str, str], tuple[Path | None, str]] = {}
    missing: set[str] = set()
    out = Closure()

    def shown(path: Path) -> str:
        if path.is_relative_to(tree):
            return str(path.relative_to(tree))
        for root in roots:
            if path.is_relative_to(root.path):
                return f"{root.label}/{path.relative_to(root.path)}"
        return str(path)

    for source in sources:
        start = tree / source
        done, queue, reached = {start}, deque([start]), set()
        while queue:
            current = queue.popleft()
            if current not in parsed:
                parsed[current] = _includes(current)
            for kind, header, line, text in parsed[current]:
                key = (current.parent if kind == '"' else tree, kind, header)
                if key not in resolved:
                    resolved[key] = _resolve(kind, header, current, index, roots)
                target, provider = resolved[key]
                reached.add(header)
                if header not in out.first:
                    out.first[header] = Include(header, Seen(shown(current), line, text), source)
                if target is None:
                    if header not in missing:
                        missing.add(header)
                        out.missing.append(out.first[header])
                    continue
                out.provided.setdefault(header, provider)
                if (provider == "tree" or provider.startswith("the build venv")) and (
                    target not in done
                ):
                    done.add(target)
                    queue.append(target)
        out.reaches[source] = reached
    out.missing = [m for m in out.missing if m.header not in out.provided]
    return out


def _resolve(
    kind: str, header: str, where: Path, index: TreeIndex, roots: list[Root]
) -> tuple[Path | None, str]:
    if kind == '"':
        near = Path(os.path.normpath(where.parent / header))
        if near.is_file():
            inside = near.is_relative_to(index.tree)
            return near, "tree" if inside else _owner(near, roots)
    found = index.find(header)
    if found is not None:
        return found, "tree"
    for root in roots:
        if (root.path / header).is_file():
            return Path(os.path.normpath(root.path / header)), root.provider
    return None, ""


def _owner(path: Path, roots: list[Root]) -> str:
    for root in roots:
        if path.is_relative_to(root.path):
            return root.provider
    return "tree"
