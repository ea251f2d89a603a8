"""Prove what a wheel holds: SASS/PTX archs per shared object, tags, auditwheel.

cuobjdump's exit codes lie (a host-only ``.so`` is rc 255, some empty results
rc 0), so its output is parsed, never its return code trusted.
"""

from __future__ import annotations

import re
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from variantlib.constants import VALIDATION_WHEEL_NAME_REGEX

from kiln.config.models import Profile
from kiln.errors import VerifyError
from kiln.inside import proc
from kiln.toolchain.checks import cuobjdump


@dataclass(frozen=True)
class SharedObject:
    path: str
    sass: list[str]
    ptx: list[str]
    # What the dynamic linker will look for (DT_NEEDED) and where (DT_RUNPATH/DT_RPATH)
    needed: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)


# kiln's own link-time folders (kiln/inside/kit/pipcuda.py): nothing built may point there.
KILN_HOST_MARK = "/.kiln/host/"


def linkage(path: Path) -> tuple[list[str], list[str]]:
    """(DT_NEEDED, DT_RUNPATH + DT_RPATH entries) of an ELF shared object."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    needed: list[str] = []
    paths: list[str] = []
    try:
        with path.open("rb") as fh:
            for section in ELFFile(fh).iter_sections():
                if not isinstance(section, DynamicSection):
                    continue
                # pyelftools names a tag's string (needed, runpath, rpath) at run time
                tags: Iterable[Any] = section.iter_tags()
                for tag in tags:
                    if tag.entry.d_tag == "DT_NEEDED":
                        needed.append(tag.needed)
                    elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                        text = tag.runpath if tag.entry.d_tag == "DT_RUNPATH" else tag.rpath
                        paths.extend(p for p in text.split(":") if p)
    except ELFError as exc:
        raise VerifyError(f"{path.name}: not a readable ELF file: {exc}") from None
    return needed, paths


def check_linkage(
    report_name: str, objects: list[SharedObject], build_site: str | None = None
) -> None:
    """Nothing kiln put in place at link time (the link-names folder, the libcuda stub)
    may become a run-time dependency: no NEEDED entry that is a path or names the stub
    file itself, no RUNPATH into kiln's folders; and no RUNPATH into the build venv's
    site-packages (it exists on the build machine only; kiln's wrapper makes such rpaths
    ``$ORIGIN``-relative)."""
    for o in objects:
        bad = [n for n in o.needed if "/" in n or n == "libcuda.so"]
        bad += [p for p in o.runpath if KILN_HOST_MARK in p.rstrip("/") + "/"]
        if bad:
            raise VerifyError(
                f"{report_name}: {o.path} depends at run time on {', '.join(bad)}, a link-time "
                f"stand-in of kiln's: the upstream must link by library name "
                f"(e.g. -lcuda gives libcuda.so.1), not by kiln's path"
            )
        site = (build_site or "").rstrip("/")
        leaked = [p for p in o.runpath if site and (p == site or p.startswith(site + "/"))]
        if leaked:
            raise VerifyError(
                f"{report_name}: {o.path} has RUNPATH {', '.join(leaked)}, the build venv's "
                f"site-packages, which exists on the build machine only: link it with an "
                f"$ORIGIN-relative rpath"
            )


@dataclass
class WheelReport:
    file: str
    name: str
    version: str
    tags: list[str]
    shared_objects: list[SharedObject] = field(default_factory=list)
    auditwheel: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def device_archs(path: Path) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) embedded in ``path``; both empty for host-only code."""
    res = proc.run([cuobjdump(), "-symbols", path], check=False, what=f"cuobjdump {path.name}")
    sass: set[str] = set()
    ptx: set[str] = set()
    current: set[str] | None = None
    for line in res.output.splitlines():
        text = line.strip()
        if text.startswith("Fatbin elf code"):
            current = sass
        elif text.startswith("Fatbin ptx code"):
            current = ptx
        elif text.startswith("arch =") and current is not None:
            current.add(text.split("=", 1)[1].strip())
            current = None
    if (
        not sass
        and not ptx
        and "does not contain device code" not in res.output
        and res.returncode not in (0, 255)
    ):
        raise VerifyError(f"cuobjdump could not read {path}: {res.output.strip()[-300:]}")
    return sorted(sass), sorted(ptx)


def check_archs(report_name: str, objects: list[SharedObject], expected: list[str]) -> None:
    """SASS per shared object must equal the recipe's arch set (as a set: nvcc may add empties)."""
    with_device = [o for o in objects if o.sass or o.ptx]
    want = set(expected)
    if not want:
        if with_device:
            o = with_device[0]
            raise VerifyError(
                f"{report_name}: {o.path} holds device code ({', '.join(o.sass + o.ptx)}) but "
                f"the recipe builds none (arch_control = 'none')"
            )
        return
    if not with_device:
        raise VerifyError(
            f"{report_name}: no shared object holds device code, the recipe asks for "
            f"{', '.join(sorted(want))}"
        )
    wrong = []
    for o in with_device:
        have = set(o.sass)
        missing, extra = sorted(want - have), sorted(have - want)
        if missing or extra:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unexpected {', '.join(extra)}"] if extra else []
            )
            wrong.append(
                f"{o.path} has SASS for {', '.join(sorted(have)) or 'nothing'}: {'; '.join(parts)}"
            )
    if wrong:
        # every shared object that is wrong, not the first one of them
        others = "".join(f"\n    also {w}" for w in wrong[1:])
        raise VerifyError(
            f"{report_name}: {wrong[0]} (the recipe asks for {', '.join(sorted(want))}); "
            f"fix build.archs or the upstream's arch flags{others}"
        )


def base_wheel_name(name: str) -> str:
    """A wheel file's name without its variant label (WheelNext: ``NAME-...-TAG-LABEL.whl``
    is the wheel ``NAME-...-TAG.whl`` with a ``variant.json``); a plain wheel's as it is."""
    m = VALIDATION_WHEEL_NAME_REGEX.fullmatch(name)
    return f"{m['base_wheel_name']}.whl" if m and m["variant_label"] else name


def check_tags(wheel: Path, profile: Profile) -> tuple[str, str, list[str]]:
    try:
        name, version, _build, tags = parse_wheel_filename(base_wheel_name(wheel.name))
    except InvalidWheelFilename as exc:
        raise VerifyError(f"{wheel.name}: not a valid wheel file name: {exc}") from None
    py = profile.python_tag
    machine = profile.platform.split("_", 1)[1]
    for tag in tags:
        plat_ok = tag.platform == profile.platform or (
            tag.platform.startswith("manylinux") and tag.platform.endswith("_" + machine)
        )
        if tag.interpreter != py or tag.abi != py or not plat_ok:
            raise VerifyError(
                f"{wheel.name}: tag {tag} does not match the profile ({py}-{py}-"
                f"{profile.platform} or manylinux_*_{machine}); build with Python {profile.python}"
            )
    return str(name), str(version), sorted(str(t) for t in tags)


def check_repaired(wheel: Path, tags: list[str], objects: list[SharedObject]) -> None:
    """A wheel with shared objects carries a manylinux tag (auditwheel repair ran): a
    plain ``linux_*`` tag lets pip install it where its glibc symbols do not exist."""
    if objects and not any(t.split("-")[-1].startswith("manylinux") for t in tags):
        raise VerifyError(
            f"{wheel.name}: has shared objects but a {tags[0].split('-')[-1]} tag, not "
            f"manylinux_2_X: it was not repaired (auditwheel repair with torch, CUDA, NCCL "
            f"and NVSHMEM excluded; kiln build does it)"
        )


def check_requires(wheel: Path, metadata: str, pin: str | None) -> None:
    """METADATA pins the torch the extension was compiled against."""
    if pin and f"\nRequires-Dist: {pin}\n" not in "\n" + metadata.split("\n\n")[0] + "\n":
        found = [ln for ln in metadata.splitlines() if ln.startswith("Requires-Dist: torch")]
        raise VerifyError(
            f"{wheel.name}: METADATA does not pin {pin} (has {', '.join(found) or 'no torch'}):"
            f" pip could pair it with another torch; kiln build writes the pin"
        )


def _metadata(zf: zipfile.ZipFile) -> str:
    names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    return zf.read(names[0]).decode() if len(names) == 1 else ""


def auditwheel_show(wheel: Path) -> dict[str, object]:
    """``auditwheel show``'s answer, stable between identical builds (the manifest keeps
    it): a variant wheel is shown under its plain name (auditwheel does not read variant
    labels), and the output is unwrapped, each ``{...}`` set sorted (auditwheel prints
    Python sets, whose order changes from one process to the next)."""
    with tempfile.TemporaryDirectory(prefix="kiln-auditwheel-") as tmp:
        shown = wheel
        if base_wheel_name(wheel.name) != wheel.name:
            shown = Path(tmp) / base_wheel_name(wheel.name)
            shown.symlink_to(wheel.resolve())
        res = proc.run(
            [sys.executable, "-m", "auditwheel", "show", shown],
            check=False,
            what="auditwheel show",
        )
    return {"returncode": res.returncode, "output": stable_auditwheel(res.output)}


def stable_auditwheel(text: str) -> str:
    """auditwheel's text with its paragraphs unwrapped and every ``{...}`` set sorted."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n") if p.strip()]

    def ordered(m: re.Match[str]) -> str:
        return "{" + ", ".join(sorted(x.strip() for x in m[1].split(",") if x.strip())) + "}"

    return "\n\n".join(re.sub(r"\{([^{}]*)\}", ordered, p) for p in paragraphs)


def verify_wheel(
    wheel: Path,
    expected: list[str],
    profile: Profile,
    build_site: str | None = None,
    torch_pin: bool = True,
) -> WheelReport:
    """``torch_pin``: METADATA must pin the profile's torch (kiln's own wheels; a wheel
    cibuildwheel made carries what its upstream declares)."""
    name, version, tags = check_tags(wheel, profile)
    report = WheelReport(wheel.name, name, version, tags)
    # auditwheel show and each cuobjdump are processes of their own: run at once, they
    # cost the wall of the slowest, not the sum (after a step's last compile, this is on
    # the build's critical path).
    with (
        ThreadPoolExecutor(max_workers=4, thread_name_prefix="verify") as pool,
        tempfile.TemporaryDirectory(prefix="kiln-verify-") as tmp,
        zipfile.ZipFile(wheel) as zf,
    ):
        shown = pool.submit(auditwheel_show, wheel)
        members = sorted(m for m in zf.namelist() if m.endswith(".so") or ".so." in m)
        archs = []
        for member in members:
            target = Path(tmp) / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(member))
            archs.append(pool.submit(device_archs, target))
        for member, found in zip(members, archs, strict=True):
            sass, ptx = found.result()
            needed, runpath = linkage(Path(tmp) / member)
            report.shared_objects.append(SharedObject(member, sass, ptx, needed, runpath))
        metadata = _metadata(zf)
        report.auditwheel = shown.result()
    check_archs(wheel.name, report.shared_objects, expected)
    check_repaired(wheel, tags, report.shared_objects)
    if torch_pin:
        check_requires(wheel, metadata, profile.torch_pin)
    check_linkage(wheel.name, report.shared_objects, build_site)
    return report
