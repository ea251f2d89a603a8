"""Deterministic ``.tar.zst`` archives and safe unpacking.

Packing: members sorted, mtime fixed (``SOURCE_DATE_EPOCH``), owner 0:0 with no
names, modes normalised (0755 for directories and executables, 0644 otherwise), no
``.git``; compressed by the zstandard library, single-threaded (its output then
depends on the bytes alone). Unpacking refuses any member that would land outside
the target folder: absolute paths, ``..``, links pointing out, devices.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import zstandard

from kiln.errors import ArchiveError
from kiln.fsutil import disk_full

# Level 12, not 19: a CUTLASS upstream's built tree (231 MB of tar) takes 7.1 s at 12 and
# 125.9 s at 19, single-threaded, for 36 MiB against 32 (measured here); a build's tarball
# is on its critical path, after its last compile.
ZSTD_LEVEL = 12
ALWAYS_EXCLUDED = (".git", ".git/**")


def _excluded(rel: str, patterns: Iterable[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        bare = pattern.rstrip("/")
        if fnmatch.fnmatchcase(rel, bare) or fnmatch.fnmatchcase(rel, pattern):
            return True
        if "/" not in bare and any(fnmatch.fnmatchcase(p, bare) for p in parts):
            return True  # a bare name matches at any depth (e.g. __pycache__, *.o)
        if rel.startswith(bare + "/"):
            return True
    return False


def members(root: Path, exclude: Iterable[str] = ()) -> list[str]:
    """Relative paths under ``root`` to pack, sorted, directories included."""
    patterns = [*ALWAYS_EXCLUDED, *exclude]
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in list(dirnames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if _excluded(rel, patterns):
                dirnames.remove(name)
            else:
                found.append(rel)
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not _excluded(rel, patterns):
                found.append(rel)
    return sorted(found)


def _tarinfo(path: Path, arcname: str, mtime: int) -> tarfile.TarInfo:
    st = path.lstat()
    info = tarfile.TarInfo(arcname)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    elif stat.S_ISREG(st.st_mode):
        info.size = st.st_size
        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    else:
        raise ArchiveError(f"{path}: not a file, folder or link; cannot pack it")
    return info


def pack(
    sources: list[tuple[Path, str]], dest: Path, mtime: int, exclude: Iterable[str] = ()
) -> Path:
    """Pack each (folder, name-in-archive) of ``sources`` into ``dest`` (.tar.zst).

    Written to a temporary file beside ``dest`` and renamed, so a failure (a full
    disk) leaves no partial archive. A link that points outside its folder is refused
    here, since :func:`unpack` (and install.sh) would refuse the archive.
    """
    exclude = list(exclude)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}-", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=0)
            with (
                cctx.stream_writer(raw, closefd=False) as zw,
                tarfile.open(fileobj=zw, mode="w|", format=tarfile.GNU_FORMAT) as tar,
            ):
                for folder, name in sources:
                    tar.addfile(_tarinfo(folder, name, mtime))
                    landing = Landing()
                    for rel in members(folder, exclude):
                        path = folder / rel
                        info = _tarinfo(path, f"{name}/{rel}", mtime)
                        problem = landing.problem(_tarinfo(path, rel, mtime))
                        if problem:
                            raise ArchiveError(
                                f"{path}: {problem}, outside {folder}; unpacking would refuse "
                                f"it: remove the link (or exclude it) and pack again"
                            )
                        if info.isreg():
                            with path.open("rb") as fh:
                                tar.addfile(info, fh)
                        else:
                            tar.addfile(info)
        os.chmod(tmp, 0o644)  # mkstemp's 0600: another user could not read the release
        os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        full = disk_full(exc, dest)
        if full:
            raise full from None
        raise ArchiveError(f"writing {dest}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


class Landing:
    """Where members of one archive land, following the symbolic links made by the
    members before them (``a -> .`` then ``b -> a/..`` then ``b/x`` leaves the folder,
    although no single member says ``..`` at its top)."""

    MAX_HOPS = 40

    def __init__(self) -> None:
        self.links: dict[str, str] = {}  # resolved member path -> its link text

    def _walk(self, parts: list[str], follow_last: bool, hops: int = 0) -> list[str] | None:
        """``parts`` resolved from the folder's top; None where it leaves the folder."""
        out: list[str] = []
        for i, part in enumerate(parts):
            if part in ("", "."):
                continue
            if part == "..":
                if not out:
                    return None
                out.pop()
                continue
            out.append(part)
            target = self.links.get("/".join(out))
            if target is None or (i == len(parts) - 1 and not follow_last):
                continue
            if target.startswith("/") or hops >= self.MAX_HOPS:
                return None
            found = self._walk(out[:-1] + target.split("/"), True, hops + 1)
            if found is None:
                return None
            out = found
        return out

    def problem(self, info: tarfile.TarInfo) -> str | None:
        """Why ``info`` would land (or point) outside the folder, or None; records links."""
        name = info.name
        if name.startswith("/") or ".." in PurePosixPath(name).parts:
            return "escapes the target folder"
        if info.issym():
            where = self._walk(name.split("/"), follow_last=False)
            points = where is not None and self._walk(
                where[:-1] + info.linkname.split("/"), follow_last=True
            )
            if where is None or points is None or info.linkname.startswith("/"):
                return f"links to {info.linkname!r}"
            self.links["/".join(where)] = info.linkname
            return None
        if self._walk(name.split("/"), follow_last=True) is None:
            return "escapes the target folder through a link"
        if info.islnk():
            if info.linkname.startswith("/") or (
                self._walk(info.linkname.split("/"), follow_last=True) is None
            ):
                return f"links to {info.linkname!r}"
        elif not (info.isreg() or info.isdir()):
            return "is a device or fifo"
        return None


def _check_member(info: tarfile.TarInfo, archive: Path, landing: Landing) -> None:
    problem = landing.problem(info)
    if problem:
        if problem.startswith("links to"):
            problem += ", outside the target folder"
        raise ArchiveError(f"{archive.name}: member {info.name!r} {problem}; refusing to unpack")


def list_members(archive: Path) -> list[tarfile.TarInfo]:
    """Every member's header, streaming (the archive is never held in memory)."""
    with archive.open("rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            return list(tar)


def unpack(archive: Path, dest: Path) -> None:
    """Unpack a ``.tar.zst`` into ``dest``, refusing escaping members (checked before
    anything is written, then again by tarfile's ``data`` filter)."""
    try:
        infos = list_members(archive)
    except (zstandard.ZstdError, tarfile.TarError) as exc:
        raise ArchiveError(f"{archive}: not a readable .tar.zst: {exc}") from None
    landing = Landing()
    for info in infos:
        _check_member(info, archive, landing)
    dest.mkdir(parents=True, exist_ok=True)
    with archive.open("rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            if not hasattr(tarfile, "data_filter"):
                # Python before 3.11.4 (Debian 12's 3.11.2) has no extraction filters:
                # every member was checked above, before anything was written.
                tar.extractall(dest)
                return
            try:
                tar.extractall(dest, filter="data")
            except tarfile.FilterError as exc:
                raise ArchiveError(f"{archive}: {exc}; refusing to unpack") from None
