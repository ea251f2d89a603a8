"""Wheel variants (WheelNext; the PEP 817/825 drafts): each CUDA wheel of a release
written again as a variant wheel whose properties say what kiln verified, and the
index file of each distribution beside them (``[release] variant_wheels = true``).

The properties are the NVIDIA provider's (``nvidia-variant-provider``, the plugin
``nvidia_variant_provider.plugin:NvidiaVariantPlugin`` that variant-aware installers
run; uv's prototype and PyTorch's variant wheels use the same names):

- ``nvidia :: sm_arch :: <NN>_real`` for each SASS arch of the wheel's shared objects,
  ``<NN>_virtual`` for each PTX arch: all of them and only them, as cuobjdump read them
  (the manifest's ``shared_objects``). The provider's values are CMake's
  ``CUDA_ARCHITECTURES`` numbers and have no ``a``/``f`` suffix: ``sm_100a``,
  ``sm_100f`` and ``sm_100`` are all ``100_real`` (docs/variants.md says what that
  loses);
- ``nvidia :: cuda_version_lower_bound :: <major.minor>`` of the toolkit that compiled it
  (the manifest's ``toolchain.nvcc_version``): the CUDA the driver must offer at least.

variantlib (the WheelNext reference library) makes the ``variant.json`` and the index,
validates the properties' form and reads both back; kiln only packs the wheel (its own
deterministic writer, :func:`kiln.release.wheelfix.write_wheel`, so a variant wheel is the
same bytes on every rebuild). The plain wheel stays what ``install.sh`` installs.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from variantlib.api import VariantDescription, VariantProperty, make_variant_dist_info
from variantlib.constants import VALIDATION_WHEEL_NAME_REGEX, VARIANT_DIST_INFO_FILENAME
from variantlib.errors import ValidationError
from variantlib.models.variant_info import ProviderInfo, VariantInfo
from variantlib.variant_dist_info import VariantDistInfo
from variantlib.variants_json import VariantsJson

from kiln.errors import VerifyError
from kiln.release import wheelfix

NAMESPACE = "nvidia"
ARCH_FEATURE = "sm_arch"
CUDA_FEATURE = "cuda_version_lower_bound"
PROVIDER_REQUIRES = "nvidia-variant-provider>=0.0.1,<1.0.0"
PLUGIN_API = "nvidia_variant_provider.plugin:NvidiaVariantPlugin"
INDEX_SUFFIX = "-variants.json"
_ARCH = re.compile(r"^(?P<kind>sm|compute)_(?P<num>\d{2,3})[af]?$")


def arch_value(arch: str) -> str:
    """``sm_100a`` -> ``100_real``, ``compute_90`` -> ``90_virtual``."""
    m = _ARCH.match(arch)
    if not m:
        raise VerifyError(f"{arch}: not an arch kiln can name as a wheel-variant property")
    return f"{m['num']}_{'real' if m['kind'] == 'sm' else 'virtual'}"


def properties(sass: list[str], ptx: list[str], cuda: str) -> list[VariantProperty]:
    """The variant properties of a wheel whose shared objects hold ``sass`` and ``ptx``,
    compiled by CUDA ``cuda`` (``13.2.86``: its major.minor is the lower bound)."""
    values = sorted({arch_value(a) for a in sass} | {arch_value(a) for a in ptx})
    major_minor = ".".join(cuda.split(".")[:2])
    return [
        *(VariantProperty(NAMESPACE, ARCH_FEATURE, v) for v in values),
        VariantProperty(NAMESPACE, CUDA_FEATURE, major_minor),
    ]


def variant_info() -> VariantInfo:
    """The provider the variant wheels name (installers install and run it)."""
    return VariantInfo(
        namespace_priorities=[NAMESPACE],
        providers={NAMESPACE: ProviderInfo(requires=[PROVIDER_REQUIRES], plugin_api=PLUGIN_API)},
    )


def make_variant(
    wheel: Path, sass: list[str], ptx: list[str], cuda: str, epoch: int, dest_dir: Path
) -> Path:
    """``wheel`` again as a variant wheel in ``dest_dir``: its members, plus
    ``<dist-info>/variant.json``, under ``<wheel name>-<label>.whl``."""
    m = VALIDATION_WHEEL_NAME_REGEX.fullmatch(wheel.name)
    if m is None or m["variant_label"]:
        raise VerifyError(f"{wheel.name}: not a plain wheel to make a variant of")
    try:
        desc = VariantDescription(properties=properties(sass, ptx, cuda))
        text = make_variant_dist_info(desc, variant_info=variant_info())
    except ValidationError as exc:
        raise VerifyError(f"{wheel.name}: variant properties refused: {exc}") from None
    members = wheelfix.read_members(wheel)
    infos = sorted({k.split("/")[0] for k in members if k.split("/")[0].endswith(".dist-info")})
    if len(infos) != 1:
        raise VerifyError(f"{wheel.name}: expected one .dist-info folder, found {infos}")
    members[f"{infos[0]}/{VARIANT_DIST_INFO_FILENAME}"] = (text.encode(), False)
    dest = dest_dir / f"{m['base_wheel_name']}-{desc.label}.whl"
    return wheelfix.write_wheel(members, infos[0], dest, epoch)


def is_variant(name: str) -> bool:
    """Whether a wheel's file name carries a variant label."""
    m = VALIDATION_WHEEL_NAME_REGEX.fullmatch(name)
    return m is not None and bool(m["variant_label"])


def read_variant(wheel: Path) -> VariantDescription:
    """The variant description a variant wheel carries, validated by variantlib (its
    ``variant.json`` against the label in its name)."""
    m = VALIDATION_WHEEL_NAME_REGEX.fullmatch(wheel.name)
    if m is None or not m["variant_label"]:
        raise VerifyError(f"{wheel.name}: not a variant wheel name")
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n
            for n in zf.namelist()
            if n.count("/") == 1 and n.endswith(f".dist-info/{VARIANT_DIST_INFO_FILENAME}")
        ]
        if len(names) != 1:
            raise VerifyError(f"{wheel.name}: no {VARIANT_DIST_INFO_FILENAME} in its .dist-info")
        data = zf.read(names[0])
    try:
        return VariantDistInfo(data, m["variant_label"]).variant_desc
    except ValidationError as exc:
        raise VerifyError(f"{wheel.name}: {VARIANT_DIST_INFO_FILENAME}: {exc}") from None


def index_text(variant_wheels: list[Path]) -> str:
    """The ``<name>-<version>-variants.json`` of variant wheels of one distribution:
    every variant's properties and the providers, merged by variantlib."""
    if not variant_wheels:
        raise VerifyError("no variant wheels to index")
    merged = VariantsJson(variant_info())  # the providers, no variant yet
    for wheel in sorted(variant_wheels):
        desc = read_variant(wheel)
        with zipfile.ZipFile(wheel) as zf:
            name = next(
                n for n in zf.namelist() if n.endswith(f".dist-info/{VARIANT_DIST_INFO_FILENAME}")
            )
            info = VariantDistInfo(zf.read(name), desc.label)
        try:
            merged.merge(info)
        except ValidationError as exc:
            raise VerifyError(f"{wheel.name}: cannot be indexed with the others: {exc}") from None
    return str(merged.to_str()) + "\n"


def index_name(variant_wheel: Path) -> str:
    m = VALIDATION_WHEEL_NAME_REGEX.fullmatch(variant_wheel.name)
    if m is None:
        raise VerifyError(f"{variant_wheel.name}: not a wheel name")
    return f"{m['namever']}{INDEX_SUFFIX}"
