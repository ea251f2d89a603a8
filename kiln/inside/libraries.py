"""Where a shared library is and what it defines: read by the cause table's link row
inside the build step (:mod:`kiln.inside.causes`) and by the import proof's facts on the
host (:mod:`kiln.verify.loadfacts`). binutils' ``nm``, where g++ is."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from kiln.inside import proc

# lib<name>.so and its versioned names (libnccl.so.2): the name is what -l takes
_LIBRARY_FILE = re.compile(r"^lib(?P<name>.+?)\.so(?:\.[0-9.]+)?$")


def defined_symbols(library: str) -> list[str]:
    """The dynamic symbols ``library`` defines (version suffixes dropped)."""
    tool = shutil.which("nm")
    if tool is None:
        return []
    res = proc.run([tool, "-D", "--defined-only", "--format=posix", library], check=False)
    out = []
    for line in res.output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] not in ("U", "w", "v"):
            out.append(parts[0].split("@", 1)[0])
    return out


def runpath_to(shared_object: str | None, library: str) -> str | None:
    """``library``'s folder ``$ORIGIN``-relative to ``shared_object`` (a path inside the
    wheel, as it lands in site-packages), where ``library`` is in a site-packages too."""
    if not shared_object or os.path.isabs(shared_object):
        return None
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in library:
            inside = os.path.dirname(library.split(marker, 1)[1])
            return "$ORIGIN/" + os.path.relpath(inside, os.path.dirname(shared_object) or ".")
    return None


def library_name(path: Path) -> str | None:
    """``nccl`` for ``libnccl.so`` and ``libnccl.so.2``."""
    m = _LIBRARY_FILE.match(path.name)
    return m["name"] if m else None


def link_name(path: Path) -> str:
    """What ``-l`` takes to link ``path``: its name where the folder has the unversioned
    ``lib<name>.so`` the linker looks for, else ``:<file name>`` (``-l:libnccl.so.2``)."""
    name = library_name(path)
    if name and (path.parent / f"lib{name}.so").exists():
        return name
    return f":{path.name}"


def shared_libraries(folders: Iterable[str | Path], name: str | None = None) -> list[Path]:
    """The shared libraries in ``folders`` (of ``name`` alone, where given), in order: the
    unversioned name first within a folder."""
    out: list[Path] = []
    for folder in folders:
        pattern = f"lib{name}.so*" if name else "lib*.so*"
        found = [
            p
            for p in Path(folder).glob(pattern)
            if library_name(p) is not None and (name is None or library_name(p) == name)
        ]
        out += sorted(found, key=lambda p: (len(p.name), p.name))
    return list(dict.fromkeys(out))
