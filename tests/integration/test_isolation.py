"""A build step of the local runner cannot reach the network (issue 41), as the Docker
runner's cannot: the step is a real in-place build that fetches a "prebuilt" file from an
HTTP server on this machine's loopback (which this test's own process reaches). Through
kiln, the download fails in the step's network namespace, the build is refused with the
URL on its first screen, nothing is published, and a build that does not download records
its steps as isolated in the manifest and the release README."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import urllib.request
from pathlib import Path

import pytest

from kiln.errors import BuildError
from kiln.inside import proc
from kiln.runners import isolation
from kiln.runners.local import LocalRunner
from kiln.runners.protocol import Command
from tests.conftest import artifacts_files, build_args, run_kiln, shared_cache
from tests.integration.test_import_proof import PROFILE_NO_TORCH, _build
from tests.require import missing
from tests.upstreams import Upstreams
from tests.workspace import plain_vendor, write

# A machine without bubblewrap (issue 55 (1)): util-linux's unshare isolates the steps.
NO_BWRAP = {"KILN_BWRAP": "none"}
METHODS = pytest.mark.parametrize("env", [{}, NO_BWRAP], ids=["bwrap", "no-bwrap-unshare"])


def _needs(env: dict[str, str]) -> None:
    if env and os.geteuid() != 0:
        missing("ROOT", "unshare makes mount and network namespaces as root only")
    if not env and isolation.bwrap() is None:
        missing("FLEET", "bubblewrap cannot make a network namespace here")


@METHODS
@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
def test_a_local_step_that_downloads_is_refused_with_the_url(
    tmp_path: Path,
    upstreams: Upstreams,
    server: str,
    build_python: Path,
    offline: bool,
    env: dict[str, str],
) -> None:
    """With --offline and without: the step's network namespace is the same (sources are
    fetched before any step; --offline only keeps that fetch to the mirrors)."""
    _needs(env)
    assert urllib.request.urlopen(server, timeout=5).read()  # reachable from here
    fetch = f"import urllib.request; urllib.request.urlretrieve({server!r}, 'plain_prebuilt.so')"
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["build"].update(kind="inplace", outputs=["*.so"], command=["python3", "-c", fetch])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=PROFILE_NO_TORCH)
    res = run_kiln(
        *build_args(
            ws,
            tmp_path,
            "--cuda-home",
            "/usr/local/cuda",
            "--no-compiler-cache",
            mirrors=upstreams.mirrors,
            toolchain="system",
            python=build_python,
            cache=shared_cache(tmp_path / "cache"),
            offline=offline,
        ),
        env=env,
    )
    assert res.returncode == BuildError.exit_code, res.stderr[-3000:]
    assert artifacts_files(tmp_path / "artifacts") == []
    assert f"the upstream's build tried to download {server}" in res.stderr, res.stderr[-3000:]
    assert "and builds are offline" in res.stderr
    log = (tmp_path / "artifacts/logs/test-release/plain-build.log").read_text()
    assert "Connection refused" in log or "URLError" in log, log[-2000:]


def test_the_manifest_and_readme_record_the_steps_isolation(
    tmp_path: Path, upstreams: Upstreams, build_python: Path
) -> None:
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, upstreams.mirrors, build_python)
    assert res.returncode == 0, res.stderr[-3000:]
    release = tmp_path / "artifacts" / "test-release"
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["runner"]["network"] == isolation.state()
    assert manifest["vendors"]["plain"]["runner"]["network"] == isolation.state()
    readme = (release / "README.md").read_text()
    assert f"- runner: local; build steps' network: {isolation.state()}" in readme


@METHODS
def test_a_local_step_cannot_write_outside_what_it_may(
    tmp_path: Path, upstreams: Upstreams, build_python: Path, env: dict[str, str]
) -> None:
    """The step's file system is read-only but for its tree, its outputs and logs, the
    compiler cache and the temporary folders (issue 41): a build command that writes into
    the user's home fails there, and the file is not made."""
    _needs(env)
    outside = Path.home() / f".kiln-isolation-test-{tmp_path.name}"
    outside.unlink(missing_ok=True)
    # kiln's own cache lies under /tmp here, which steps may write: it stays read-only
    # (issue 55 (1): a step wrote into kiln's venv, a mirror and the shared caches)
    cached = shared_cache(tmp_path / "cache") / "kiln-isolation-intruder"
    write_it = (
        f"import pathlib\n"
        f"for p in ({str(cached)!r}, {str(outside)!r}):\n"
        f"    try:\n"
        f"        pathlib.Path(p).write_text('escaped')\n"
        f"    except OSError as e:\n"
        f"        print(p, e)\n"
        f"raise SystemExit(1)\n"
    )
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["build"].update(kind="inplace", outputs=["*.so"], command=["python3", "-c", write_it])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, upstreams.mirrors, build_python, env=env)
    assert res.returncode == BuildError.exit_code, res.stderr[-3000:]
    assert not outside.exists() and not cached.exists()
    log = (tmp_path / "artifacts/logs/test-release/plain-build.log").read_text()
    assert f"{outside} [Errno 30] Read-only file system" in log, log[-2000:]
    assert f"{cached} [Errno 30] Read-only file system" in log, log[-2000:]


def test_a_machine_that_can_isolate_no_step_refuses_the_build_unless_told(
    tmp_path: Path, upstreams: Upstreams, build_python: Path
) -> None:
    """Issue 55 (1): neither bubblewrap nor unshare (an unprivileged container): the build
    stops before its first step, in one line naming the Docker runner and
    --allow-network, nothing fetched or published (it ran each step with the network
    after one warning); --allow-network builds, and the manifest says not isolated."""
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=PROFILE_NO_TORCH)
    none = {"KILN_BWRAP": "none", "KILN_UNSHARE": "none"}
    res = _build(tmp_path, ws, upstreams.mirrors, build_python, env=none)
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "build steps here cannot be kept from the network" in last, last
    assert "--runner docker" in last and "--allow-network" in last
    assert artifacts_files(tmp_path / "artifacts") == []
    res = _build(tmp_path, ws, upstreams.mirrors, build_python, "--allow-network", env=none)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((tmp_path / "artifacts/test-release/manifest.json").read_text())
    assert manifest["runner"]["network"] == "not isolated"


# The URL assembled at run time, so no source line holds it; each client is its own
# program (issue 55 (1): the cause said "tried to download something").
ASSEMBLED = "'ht' + 'tp://dl.example.invalid/pre' + 'built.so'"
FETCHERS = {
    "python": ["python3", "-c", f"import urllib.request as u; u.urlretrieve({ASSEMBLED}, 'x.so')"],
    "curl": ["sh", "-c", 'h=dl.example.invalid; curl -sfo x.so "https://$h/prebuilt.so"'],
    "git": ["sh", "-c", 'h=dl.example.invalid; git clone -q "https://$h/prebuilt.git" x'],
}  # fmt: skip
NAMED = {
    "python": "http://dl.example.invalid/prebuilt.so",
    "curl": "https://dl.example.invalid:443",
    "git": "https://dl.example.invalid:443",
}


@METHODS
@pytest.mark.parametrize("client", sorted(FETCHERS))
def test_a_refused_download_is_named_from_the_attempt_whatever_made_it(
    tmp_path: Path, upstreams: Upstreams, build_python: Path, client: str, env: dict[str, str]
) -> None:
    _needs(env)
    if shutil.which(FETCHERS[client][0] if client == "python" else client) is None:
        missing("FLEET", f"{client} is not installed")
    vendor = plain_vendor(upstreams.plain[0], archs=[])
    vendor["build"].update(kind="inplace", outputs=["*.so"], command=FETCHERS[client])
    ws = write(tmp_path / "ws", {"plain": vendor}, profile=PROFILE_NO_TORCH)
    res = _build(tmp_path, ws, upstreams.mirrors, build_python, env=env)
    assert res.returncode == BuildError.exit_code, res.stderr[-3000:]
    assert artifacts_files(tmp_path / "artifacts") == []
    assert f"the upstream's build tried to download {NAMED[client]}" in res.stderr, res.stderr[
        -3000:
    ]


# Each step writes a file named by its pid in its TMPDIR, as nvcc does (tmpxft_<pid>_...),
# waits, and reads it back: another step's file of the same name is a collision.
_PID_NAMED = (
    'f="$TMPDIR/tmpxft_$$"; echo "$STEP" > "$f"; sleep 2; '
    'echo "pid $$ tmp $TMPDIR"; [ "$(cat "$f")" = "$STEP" ]'
)


@METHODS
def test_steps_at_once_with_the_same_pid_have_temporary_folders_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """A step's pid namespace numbers its processes from 1, so two steps at once have the
    same pids, and nvcc names its temporary files by pid: in one /tmp, one step's nvcc
    deleted the other's ("cc1plus: fatal error: /tmp/tmpxft_00000033_00000000-2.cpp: No
    such file or directory"). Each step has a TMPDIR of its own, removed after it; a
    TMPDIR the recipe sets is kept as it is."""
    _needs(env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(isolation, "_found", {})  # probed again, under env
    runner = LocalRunner(None, None, tmp_path / "cache", tmp_path / "logs")
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    results: dict[str, proc.Result] = {}

    def step(name: str, step_env: dict[str, str]) -> None:
        cmd = Command(
            argv=["sh", "-c", _PID_NAMED],
            cwd=tmp_path,
            env={**step_env, "STEP": name},
            what=f"step {name}",
            writable=[tmp_path / name],
            check=False,
        )
        results[name] = runner.run(cmd)

    threads = [threading.Thread(target=step, args=(n, dict(os.environ))) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    step("chosen", {**os.environ, "TMPDIR": str(chosen)})
    said = {n: r.output.strip().splitlines()[-1].split() for n, r in results.items()}
    assert said["a"][1] == said["b"][1], said  # the same pid: the case this is about
    assert said["a"][3] != said["b"][3], said  # but TMPDIRs of their own
    own = [Path(said[n][3]) for n in ("a", "b")]
    assert all(p.parent.parent == Path(tempfile.gettempdir()) for p in own), said
    assert [r.returncode for r in results.values()] == [0, 0, 0], results
    assert not any(p.exists() for p in own)  # removed after
    assert said["chosen"][3] == str(chosen)  # the recipe's, as it is


# Writes /tmp and /var/tmp by name (as a program that ignores TMPDIR does), waits, reads
# them back, and looks for a file the host keeps in /tmp that the step was not given
# (found by a pattern: a path its command or environment names is bound in for it).
_FIXED_NAMES = (
    'for d in /tmp /var/tmp; do echo "$STEP" > "$d/kiln-fixed-name"; done; sleep 2; '
    'for d in /tmp /var/tmp; do [ "$(cat "$d/kiln-fixed-name")" = "$STEP" ] || exit 3; done; '
    'for f in /tmp/kiln-host-only-*/secret; do [ -e "$f" ] && exit 4; done; '
    'for f in /tmp/kiln-given-*/given; do [ "$(cat "$f")" = given ] || exit 5; '
    '(echo x > "$f") 2>/dev/null && exit 6; done; echo private'
)


@METHODS
def test_each_step_has_a_tmp_and_var_tmp_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """A program that writes /tmp or /var/tmp by name (not through TMPDIR) writes a
    folder of the step's own (issue 55 (1)): two steps at once writing the same name each
    read their own back, nothing is left on the machine after them, and what the machine
    keeps in /tmp that the step was not given is not there for it to read; what it was
    given read-only (a wheel to install) it reads and cannot write."""
    _needs(env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(isolation, "_found", {})  # probed again, under env
    for d in ("/tmp", "/var/tmp"):
        Path(d, "kiln-fixed-name").unlink(missing_ok=True)
    hosts = Path(tempfile.mkdtemp(prefix="kiln-host-only-", dir="/tmp")) / "secret"
    hosts.write_text("the machine's")
    given = Path(tempfile.mkdtemp(prefix="kiln-given-", dir="/tmp")) / "given"
    given.write_text("given")  # the command's readonly: seen, not written
    runner = LocalRunner(None, None, tmp_path / "cache", tmp_path / "logs")
    results: dict[str, proc.Result] = {}

    def step(name: str) -> None:
        cmd = Command(
            argv=["sh", "-c", _FIXED_NAMES],  # neither it nor its env names the secret
            cwd=tmp_path / name,
            env={**os.environ, "STEP": name},
            what=f"step {name}",
            writable=[tmp_path / name],
            readonly=[given],
            check=False,
        )
        results[name] = runner.run(cmd)

    try:
        threads = [threading.Thread(target=step, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shutil.rmtree(hosts.parent)
        shutil.rmtree(given.parent)
    assert {n: (r.returncode, r.output.strip()) for n, r in results.items()} == {
        "a": (0, "private"),
        "b": (0, "private"),
    }
    assert not any(Path(d, "kiln-fixed-name").exists() for d in ("/tmp", "/var/tmp"))


# A util-linux unshare that makes its namespaces and binds but never the step's own /tmp:
# the setup's ``tmpfs STAGE`` and ``move STAGE ROOT`` tokens dropped on the way.
NO_PRIVATE_TMP_UNSHARE = """\
#!/usr/bin/env python3
import os, sys
args, out = sys.argv[1:], []
while args:
    if args[0] == "tmpfs":
        args = args[2:]
    elif args[0] == "move":
        args = args[3:]
    else:
        out.append(args.pop(0))
os.execv("UNSHARE", ["unshare", *out])
"""


def test_an_unshare_that_cannot_give_steps_their_own_tmp_is_no_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe runs the steps' own setup, private /tmp and /var/tmp included: an unshare
    that makes the namespaces but not the private folders (a step's /tmp the machine's,
    or read-only) is refused, with why, so the build stops before its first step instead
    of every step failing or writing into the machine's /tmp; the real one passes."""
    real = shutil.which("unshare")
    if real is None or os.geteuid() != 0:
        missing("ROOT", "unshare makes mount and network namespaces as root only")
    fake = tmp_path / "unshare"
    fake.write_text(NO_PRIVATE_TMP_UNSHARE.replace("UNSHARE", real))
    fake.chmod(0o755)
    monkeypatch.setenv("KILN_UNSHARE", str(fake))
    program, why = isolation._probe_unshare()
    assert program is None and why.startswith("unshare cannot make namespaces here ("), why
    assert not list(Path("/tmp").glob(".kiln-isolation-*")), "the probe left a file"
    monkeypatch.setenv("KILN_UNSHARE", real)
    assert isolation._probe_unshare() == (real, "")


def test_a_step_whose_temporary_folder_cannot_be_made_names_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the step's own temporary folder cannot be made (TMPDIR is not a folder, or
    full), the step stops in one line naming the folder and the fix, and the fix applied
    (TMPDIR a writable folder) runs it."""
    if not isolation.isolates():
        missing("FLEET", "no step can be isolated here")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_folder))
    with pytest.raises(BuildError) as info, isolation.isolated(["true"], dict(os.environ)):
        pass
    said = str(info.value)
    assert said.startswith(f"cannot make a build step's temporary folder in {not_a_folder} (")
    assert said.endswith("point TMPDIR at a writable folder with room, and rerun")
    room = tmp_path / "room"
    room.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(room))  # the fix, applied
    with isolation.isolated(["true"], dict(os.environ)) as (argv, env):
        assert subprocess.run(argv, env=env, check=False).returncode == 0
        assert Path(env["TMPDIR"]).parent.parent == room
