"""Same inputs, same bytes: fixture upstreams built twice, in different working and
temporary directories, the second at least a second later, give identical wheels.
The controls show each fix matters: without kiln's compiler wrapper, or keeping
-lineinfo, the two builds differ."""

from __future__ import annotations

import hashlib
import os
import re
import time
import zipfile
from pathlib import Path

import pytest

from kiln import reproduce as reverify
from kiln.build import pipeline
from kiln.config.models import Profile
from kiln.release.wheelfix import local_label
from tests.upstreams import Upstreams
from tests.workspace import PROFILE, plain_vendor, write


def build_twice(
    tmp_path: Path, vendor: dict, options, env: dict[str, str] | None = None
) -> tuple[str, str]:
    digests = []
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        for run in ("first", "second"):
            ws = write(tmp_path / f"ws-{run}", {"plain": vendor})
            release = pipeline.build(
                options(
                    ws,
                    artifacts=tmp_path / f"{run}/artifacts",
                    work=tmp_path / f"{run}/deeper/work",
                    # each build compiles: a cache hit would prove nothing here
                    no_compiler_cache=True,
                    artifact_cache=False,
                )
            )
            (wheel,) = (release / "wheels").glob("*.whl")
            digests.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
            time.sleep(1.1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"\n{vendor['source']['commit'][:7]} {env or ''}: {digests[0]} {digests[1]}")
    return digests[0], digests[1]


@pytest.mark.parametrize("index,what", [(2, "plain CUDA extension"), (4, "-rdc=true")])
def test_two_builds_give_identical_wheels(
    tmp_path: Path, upstreams: Upstreams, options, index: int, what: str
) -> None:
    first, second = build_twice(tmp_path, plain_vendor(upstreams.plain[index]), options)
    assert first == second, what


def test_lineinfo_is_reproducible_once_dropped(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    vendor = plain_vendor(upstreams.plain[3])
    vendor["build"]["nvcc_drop_flags"] = ["-lineinfo"]
    first, second = build_twice(tmp_path, vendor, options)
    assert first == second


def test_lineinfo_kept_differs_across_build_paths(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    """The control: -lineinfo records the build directory in the device code."""
    first, second = build_twice(tmp_path, plain_vendor(upstreams.plain[3]), options)
    assert first != second


def test_without_the_compiler_wrapper_builds_differ(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    """The control: nvcc's temp-file names (tmpxft_<pid>) and build paths leak in."""
    first, second = build_twice(
        tmp_path, plain_vendor(upstreams.plain[2]), options, env={"KILN_DETERMINISTIC": "0"}
    )
    assert first != second


def test_version_label_is_consistent_everywhere(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    ws = write(tmp_path / "ws", {"plain": plain_vendor(upstreams.plain[0], archs=[])})
    release = pipeline.build(options(ws))
    (wheel,) = (release / "wheels").glob("*.whl")
    label = local_label(Profile.model_validate(PROFILE), upstreams.plain[0], [])
    assert label == f"cu132.torch2.14.g{upstreams.plain[0][:7]}"
    version = f"1.2.0+{label}"
    assert re.fullmatch(
        rf"plainext-{re.escape(version)}-cp311-cp311-manylinux[\w.]*_x86_64\.whl", wheel.name
    ), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"plainext-{version}.dist-info"
        assert names[-1] == f"{info}/RECORD" and all(
            n.startswith((f"{info}/", "plainext/")) for n in names
        )
        assert f"Version: {version}\n" in zf.read(f"{info}/METADATA").decode()
        record = zf.read(f"{info}/RECORD").decode()
        assert all(n in record for n in names)
        assert {i.date_time for i in zf.infolist()} == {(2026, 1, 1, 0, 0, 0)}
        assert {(i.external_attr >> 16) & 0o777 for i in zf.infolist()} <= {0o644, 0o755}


def test_verify_names_the_arch_whose_sass_differs(
    tmp_path: Path, upstreams: Upstreams, options
) -> None:
    """plain@1 has sm_100a only, plain@2 sm_100a and sm_103a: the report goes arch by arch
    (the sm_100a code differs too: nvcc's module id covers the compile's options)."""
    wheels = []
    for index in (1, 2):
        vendor = plain_vendor(upstreams.plain[index], archs=["sm_100a"] if index == 1 else None)
        ws = write(tmp_path / f"ws{index}", {"plain": vendor})
        release = pipeline.build(options(ws, artifacts=tmp_path / f"a{index}"))
        wheels.append(next((release / "wheels").glob("*.whl")))
    lines = reverify.explain(wheels[0], wheels[1])
    text = "\n".join(lines)
    assert "member plainext/_kernels.cpython-311-x86_64-linux-gnu.so: sha256" in text
    assert "SASS sm_100a: " in text and "SASS sm_103a: differs" in text
