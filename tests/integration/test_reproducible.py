"""Same inputs, same bytes: fixture upstreams built twice, in different working and
temporary directories, the second at least a second later, give identical wheels and
manifests identical but for what they measure of the run (issue 41: times, memory, the
schedule; auditwheel's lines, once in the order it printed them, included); and
built by two processes that differ in user, umask, TZ, locale, --jobs and folder depth.
The controls show each fix matters: without kiln's compiler wrapper, or keeping
-lineinfo, the two builds differ."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import pwd
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from kiln.config.models import Profile
from kiln.orchestrate import stages
from kiln.release.wheelfix import local_label
from kiln.verbs import rebuild_check as rebuild
from tests import upstreams as fixture_upstreams
from tests.conftest import REPO, build_args, run_kiln
from tests.upstreams import Upstreams
from tests.workspace import PROFILE, plain_vendor, write


def build_twice(
    tmp_path: Path, vendor: dict, options, env: dict[str, str] | None = None
) -> tuple[str, str]:
    digests: list[str] = []
    manifests: list[str] = []
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        for run in ("first", "second"):
            ws = write(tmp_path / f"ws-{run}", {"plain": vendor})
            release = stages.build(
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
            manifests.append((release / "manifest.json").read_text())
            time.sleep(1.1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"\n{vendor['source']['commit'][:7]} {env or ''}: {digests[0]} {digests[1]}")
    # issue 41: the manifests are the same bytes too, once the timings are blanked
    a, b = untimed(manifests[0]), untimed(manifests[1])
    if digests[0] == digests[1]:
        assert a == b, "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm=""))
    else:  # the control: other wheel bytes, and the manifest's comparison sees them
        assert a != b and digests[0] in a and digests[1] in b
    return digests[0], digests[1]


# What a manifest measures of its run, not of its inputs or outputs: times, memory (the
# budget is the machine's free memory then), each step's schedule (its measurements, and
# the estimate it started from: the second build learned from the first) and what the
# step learned (each unit's CPU seconds and memory, the links' CPU seconds).
TIMED = frozenset(
    {"wall_s", "cpu_s", "seconds", "durations", "timings", "rss_gib", "mem_gib"}
    | {"peak_rss_gib", "bound", "schedule", "learned"}
)


def untimed(text: str) -> str:
    """A manifest's text with every timing blanked, key by key, written back as kiln
    writes it (all else as it was: the order of keys and lists too)."""

    def blank(value: object) -> object:
        if isinstance(value, dict):
            return {k: "-" if k in TIMED else blank(v) for k, v in value.items()}
        if isinstance(value, list):
            return [blank(v) for v in value]
        return value

    return json.dumps(blank(json.loads(text)), indent=2)


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
    release = stages.build(options(ws))
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
        release = stages.build(options(ws, artifacts=tmp_path / f"a{index}"))
        wheels.append(next((release / "wheels").glob("*.whl")))
    lines = rebuild.explain(wheels[0], wheels[1])
    text = "\n".join(lines)
    assert "member plainext/_kernels.cpython-311-x86_64-linux-gnu.so: sha256" in text
    assert "SASS sm_100a: " in text and "SASS sm_103a: differs" in text


def _other_user() -> tuple[int, int] | None:
    """A user that is not root (made once), or None where this process cannot make one."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("kilnrepro")
    except KeyError:
        subprocess.run(["useradd", "--create-home", "kilnrepro"], check=True)
        pw = pwd.getpwnam("kilnrepro")
    return pw.pw_uid, pw.pw_gid


def test_builds_in_other_processes_users_and_environments_give_the_same_bytes(
    tmp_path: Path,
) -> None:
    """The same release built by two `kiln build` processes that differ in everything a
    build machine does: user (root, and another uid where root can make one), umask, TZ,
    locale, --jobs and the depth of every folder. Every file of the release is the same
    (`kiln verify --rebuilt`), and a difference planted in one wheel is explained member
    by member, with the SASS of each arch compared."""
    root = Path(tempfile.mkdtemp(prefix="kiln-repro-", dir="/tmp"))  # readable by both users
    try:
        shutil.copytree(REPO / "kiln", root / "src" / "kiln")
        site_dir = Path(next(p for p in site.getsitepackages() if "site-packages" in p))
        shutil.copytree(site_dir, root / "site", ignore=shutil.ignore_patterns("torch*"))
        up = fixture_upstreams.make(root / "upstreams")
        profile = {**{k: v for k, v in PROFILE.items() if k != "torch"}, "cuda": "13.0"}
        ws = write(root / "ws", {"plain": plain_vendor(up.plain[2])}, profile=profile)
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        other = _other_user()

        def build(where: Path, jobs: str, env: dict[str, str], user: tuple[int, int] | None):
            where.mkdir(parents=True)
            # the upstreams as this build's user's own (git refuses repositories of others)
            shutil.copytree(up.root, where / "upstreams", symlinks=True)
            mirrors = where / "upstreams" / "mirrors.toml"
            mirrors.write_text(up.mirrors.read_text().replace(str(up.root), str(mirrors.parent)))
            if user:
                subprocess.run(["chown", "-R", f"{user[0]}:{user[1]}", str(where)], check=True)
            umask = env.pop("UMASK")
            argv = [
                "/usr/bin/python3",
                *("-m", "kiln"),
                *build_args(
                    ws,
                    where,
                    *("--cuda-home", "/usr/local/cuda", "--jobs", jobs),
                    *("--no-compiler-cache", "--no-artifact-cache"),
                    mirrors=mirrors,
                    python="/usr/bin/python3",
                ),
            ]
            as_user = (
                ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]
                if user
                else []
            )
            shell = ["sh", "-c", f'umask {umask} && exec "$@"', "sh"]
            res = subprocess.run(
                [*as_user, *shell, *map(str, argv)],
                cwd=where,
                env={
                    "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
                    "PYTHONPATH": f"{root / 'src'}:{root / 'site'}",
                    **env,
                },
                capture_output=True,
                text=True,
                check=False,
            )
            assert res.returncode == 0, res.stderr[-3000:]
            return where / "artifacts" / "test-release"

        first = build(
            root / "a",
            "2",
            {"UMASK": "022", "TZ": "UTC", "LANG": "C.UTF-8", "HOME": "/root"},
            None,
        )
        second = build(
            root / "b" / "much" / "deeper" / "down" / "here",
            "1",
            {
                "UMASK": "077",
                "TZ": "Pacific/Chatham",
                "LANG": "fr_FR.UTF-8",
                "LC_ALL": "fr_FR.UTF-8",
                "HOME": "/home/kilnrepro" if other else "/tmp",
            },
            other,
        )
        if other:
            assert (second / "manifest.json").stat().st_uid == other[0]
        verify = run_kiln("verify", first / "manifest.json", "--rebuilt", second)
        assert verify.returncode == 0, verify.stderr
        assert "is reproduced bit for bit" in verify.stdout

        # a planted difference: one member of the wheel changed, one .so with bytes added
        planted = root / "planted"
        shutil.copytree(second, planted)
        (wheel,) = (planted / "wheels").glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            members = {i.filename: zf.read(i) for i in zf.infolist()}
        kernels = next(n for n in members if "_kernels" in n)
        members["plainext/__init__.py"] += b"# planted\n"
        members[kernels] += b"\0planted"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        told = run_kiln("verify", first / "manifest.json", "--rebuilt", planted)
        assert told.returncode == 8, told.stderr  # NotReproduced
        assert f"wheels/{wheel.name}: sha256 " in told.stderr
        assert "  member plainext/__init__.py: sha256 " in told.stderr
        assert f"  member {kernels}: sha256 " in told.stderr
        assert "    SASS sm_100a: identical" in told.stderr  # the device code is not what differs
        assert "    SASS sm_103a: identical" in told.stderr
        assert "is NOT reproduced by" in told.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
