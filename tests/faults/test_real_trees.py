"""Bad input on the real upstreams (issue 12): the public DeepGEMM, DeepEP and FlashMLA
from their git bundles, reached through mirrors. Each fault is a one-line error that
names the thing and the fix, a non-zero exit, nothing in artifacts/, and none compiles
anything first (each stops in preflight or before the build command)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import tomlkit

from kiln.config.mirrors import Mirrors
from kiln.config.workspace import Workspace
from kiln.sources.checkout import GitCache, checkout
from kiln.sources.git import git, git_out
from tests import public
from tests.conftest import (
    BEFORE_ANY_COMPILE_S,
    artifacts_files,
    build_args,
    compiled_units,
    run_kiln,
    shared_cache,
)
from tests.faults.conftest import error_lines
from tests.faults.test_network import GitDaemon


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return public.mirrors(tmp_path_factory.mktemp("public-mirrors"))


def _build(ws: Path, tmp: Path, mirrors: Path, python: Path, *vendors: str, offline: bool = True):
    cache = shared_cache(tmp / "cache")
    args = build_args(
        ws, tmp, *vendors, mirrors=mirrors, offline=offline, python=python, cache=cache
    )
    return run_kiln(*args, env={"KILN_FETCH_STALL_S": "5"})


def _one_error(res: subprocess.CompletedProcess[str]) -> str:
    lines = error_lines(res.stderr)
    assert lines, res.stderr[-2000:]
    return lines[0]


def test_unknown_commit_is_named_in_preflight(
    tmp_path: Path, mirrors: Path, public_python: Path
) -> None:
    ws = public.copy_workspace(tmp_path / "ws")
    public.edit_vendor(ws, "deepep", source__commit="0123456789abcdef0123456789abcdef01234567")
    started = time.monotonic()
    res = _build(ws, tmp_path, mirrors, public_python, "deepep")
    # a source error (3), one line: nothing about this machine, caches or builder images
    assert res.returncode == 3, res.stderr[-2000:]
    (line,) = error_lines(res.stderr)
    assert line.startswith(
        "kiln: error: deepep: commit 0123456789abcdef0123456789abcdef01234567 is not in mirror "
    )
    assert line.endswith(
        "; check the pinned SHA (vendors/deepep.toml source.commit) or update the mirror"
    )
    assert "kiln lock" not in res.stderr and "builder image" not in res.stderr
    assert time.monotonic() - started < BEFORE_ANY_COMPILE_S
    assert compiled_units(tmp_path / "artifacts") == []
    assert artifacts_files(tmp_path / "artifacts") == []


def test_a_patch_that_conflicts_with_flashmla_stops_before_building(
    tmp_path: Path, mirrors: Path, public_python: Path
) -> None:
    ws = public.copy_workspace(tmp_path / "ws")
    (ws / "patches" / "flashmla-conflict.patch").write_text(
        # written against another FlashMLA: neither it nor its reverse applies
        "--- a/setup.py\n+++ b/setup.py\n@@ -1,3 +1,3 @@\n import os\n"
        "-from pathlib import PurePath\n+from pathlib import PosixPath\n"
        " from datetime import datetime\n"
    )
    (ws / "patches" / "series.toml").write_text(
        '[[patch]]\nfile = "flashmla-conflict.patch"\ntarget = "flashmla"\n'
    )
    res = _build(ws, tmp_path, mirrors, public_python, "flashmla")
    assert res.returncode == 4, res.stderr[-2000:]
    line = _one_error(res)
    assert "flashmla-conflict.patch" in line and "setup.py" in line
    assert artifacts_files(tmp_path / "artifacts") == []
    assert not (
        tmp_path / "artifacts" / "logs" / "public-upstreams" / "flashmla-build.log"
    ).exists()


def test_a_missing_system_header_is_found_in_seconds_with_its_package(
    tmp_path: Path, mirrors: Path, public_python: Path
) -> None:
    ws = public.copy_workspace(tmp_path / "ws")
    doc = tomlkit.parse((ws / "vendors" / "deepep.toml").read_text())
    doc["build"]["system"][0]["header"] = "kiln-test/absent-verbs.h"
    doc["build"]["system"][0]["package"] = "libkiln-absent-dev"
    (ws / "vendors" / "deepep.toml").write_text(tomlkit.dumps(doc))
    started = time.monotonic()
    res = _build(ws, tmp_path, mirrors, public_python, "deepep")
    took = time.monotonic() - started
    assert res.returncode == 9, res.stderr[-2000:]
    assert (
        "vendors/deepep.toml: build.system.0: header <kiln-test/absent-verbs.h> not found on "
        "this machine: install it (apt-get install libkiln-absent-dev)"
    ) in res.stderr
    assert took < BEFORE_ANY_COMPILE_S, took  # preflight: no fetch, no compile
    assert compiled_units(tmp_path / "artifacts") == []
    assert artifacts_files(tmp_path / "artifacts") == []


def test_a_shallow_mirror_is_supported_with_a_warning(tmp_path: Path, mirrors: Path) -> None:
    """CI checkouts are shallow by default. git drops a shallow source's refs with exit
    code 0 unless told --update-shallow; kiln takes them, warns, and the checkout is the
    pinned commit's full tree."""
    full = Path(Mirrors.load(mirrors).map("https://github.com/deepseek-ai/DeepGEMM"))
    shallow = tmp_path / "DeepGEMM-shallow.git"
    git("clone", "--quiet", "--mirror", "--depth", "1", f"file://{full}", shallow)
    assert (shallow / "shallow").is_file()
    rules = tmp_path / "mirrors.toml"
    text = mirrors.read_text().replace(f'"{full}"', f'"{shallow}"')
    rules.write_text(text)
    ws = Workspace(public.WORKSPACE)
    source = ws.vendors["deepgemm"].source
    cache = GitCache(tmp_path / "cache", Mirrors.load(rules), offline=True)
    co = checkout(cache, source, tmp_path / "tree", "deepgemm")
    assert co.commit == source.commit
    tree = git_out("rev-parse", f"{source.commit}^{{tree}}", cwd=full)
    assert git_out("rev-parse", "HEAD^{tree}", cwd=tmp_path / "tree") == tree
    assert {s.path for s in co.submodules} == {"third-party/cutlass", "third-party/fmt"}


def test_a_shallow_mirror_without_the_commit_says_it_is_shallow(
    tmp_path: Path, mirrors: Path
) -> None:
    full = Path(Mirrors.load(mirrors).map("https://github.com/deepseek-ai/DeepGEMM"))
    shallow = tmp_path / "DeepGEMM-shallow.git"
    git("clone", "--quiet", "--mirror", "--depth", "1", f"file://{full}", shallow)
    rules = tmp_path / "mirrors.toml"
    rules.write_text(mirrors.read_text().replace(f'"{full}"', f'"{shallow}"'))
    cache = GitCache(tmp_path / "cache", Mirrors.load(rules), offline=True)
    old = git_out("rev-parse", "main~3", cwd=full)  # history a depth-1 mirror lacks
    from kiln.errors import SourceError

    with pytest.raises(SourceError, match="a shallow mirror"):
        cache.resolve("https://github.com/deepseek-ai/DeepGEMM", old, "deepgemm")


def test_a_submodule_whose_mirror_is_missing_is_named(
    tmp_path: Path, mirrors: Path, public_python: Path
) -> None:
    rules = tmp_path / "mirrors.toml"
    gone = tmp_path / "no-such-mirror" / "cutlass.git"
    lines = [
        f'"https://github.com/NVIDIA/cutlass.git" = "{gone}"' if "cutlass" in ln else ln
        for ln in mirrors.read_text().splitlines()
    ]
    rules.write_text("\n".join(lines) + "\n")
    ws = public.copy_workspace(tmp_path / "ws")
    res = _build(ws, tmp_path, rules, public_python, "flashmla")
    assert res.returncode == 3, res.stderr[-2000:]
    line = _one_error(res)
    assert "submodule csrc/cutlass" in line and str(gone) in line and "does not exist" in line
    assert "fix the mirrors file" in line
    assert artifacts_files(tmp_path / "artifacts") == []


class StallingRelay:
    """Passes the first ``limit`` bytes a server sends, then nothing, keeping the
    connection open: a mirror that accepted the connection and went silent."""

    def __init__(self, upstream_port: int, limit: int) -> None:
        self.upstream_port, self.limit = upstream_port, limit
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._socks += [client, server]
            self.connections += 1
            # The ref advertisement passes (preflight's ls-remote answers); the pack stalls.
            budget = self.limit if self.connections > 1 else 1 << 30
            threading.Thread(target=self._pump, args=(client, server, 1 << 30), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, budget), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, budget: int) -> None:
        with contextlib.suppress(OSError):
            while budget > 0:
                data = src.recv(min(16384, budget))
                if not data:
                    break
                dst.sendall(data)
                budget -= len(data)
            while True:  # silent from here on, the connection left open
                time.sleep(1)

    def close(self) -> None:
        self.listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()


def test_a_mirror_that_stalls_mid_fetch_is_stopped_and_named(
    tmp_path: Path, mirrors: Path, public_python: Path
) -> None:
    full = Path(Mirrors.load(mirrors).map("https://github.com/deepseek-ai/DeepGEMM"))
    served = tmp_path / "served"
    served.mkdir()
    os.symlink(full, served / "DeepGEMM.git")
    daemon = GitDaemon(served)
    relay = StallingRelay(daemon.port, limit=256 << 10)
    try:
        rules = tmp_path / "mirrors.toml"
        rules.write_text(
            "[mirrors]\n"
            f'"https://github.com/deepseek-ai/DeepGEMM" = '
            f'"git://127.0.0.1:{relay.port}/DeepGEMM.git"\n'
        )
        ws = public.copy_workspace(tmp_path / "ws")
        started = time.monotonic()
        res = _build(ws, tmp_path, rules, public_python, "deepgemm", offline=False)
        took = time.monotonic() - started
    finally:
        relay.close()
        daemon.kill()
    assert res.returncode == 3, res.stderr[-2000:]
    line = _one_error(res)
    assert "deepgemm: fetching https://github.com/deepseek-ai/DeepGEMM" in line
    assert "stalled: no data for 5 s" in line and "KILN_FETCH_STALL_S" in line
    # the stall limit (5 s here), not a hang to the test's own limit, stopped it
    assert took < BEFORE_ANY_COMPILE_S, took
    assert compiled_units(tmp_path / "artifacts") == []
    assert artifacts_files(tmp_path / "artifacts") == []
