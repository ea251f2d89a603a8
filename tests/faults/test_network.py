"""Fault 1, network loss during fetch: the upstream is served by ``git daemon`` on
127.0.0.1 behind a throttling TCP relay (the "network"). While kiln fetches a 24 MiB
pack, the daemon's whole process group is SIGKILLed and the relay drops every
connection. kiln names the upstream and git's reason in one line; the bare clone keeps
no ref (nothing a later run would trust); a rerun with the server back completes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from kiln.sources.checkout import _cache_name
from kiln.sources.git import git, git_out
from tests.conftest import REPO
from tests.faults.conftest import (
    error_lines,
    make_tiny,
    mirrors_file,
    tiny_build_args,
    tiny_workspace,
)
from tests.upstreams import BASE_URL

BLOB = 24 << 20  # incompressible: the pack is at least this big
RATE = 4 << 20  # bytes per second through the relay


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class GitDaemon:
    """``git daemon`` serving ``root`` on a port of its own, in its own process group."""

    def __init__(self, root: Path) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                f"--base-path={root}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                str(root),
            ],
            start_new_session=True,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "git daemon did not start"
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the daemon and the upload-pack it forked for each client."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Relay:
    """A TCP relay that throttles server-to-client bytes and can drop every connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.sent = 0  # server-to-client bytes delivered
        self.down = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            # A small receive buffer: the daemon cannot park the whole pack in the kernel.
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            with self._lock:
                self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        try:
            while not self.down:
                data = src.recv(16384)
                if not data:
                    break
                dst.sendall(data)
                if down:
                    self.sent += len(data)
                    time.sleep(len(data) / RATE)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        """Network loss: every open connection is cut; new ones are refused."""
        self.down = True
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._socks.clear()

    def close(self) -> None:
        self.drop()
        self.listener.close()


def test_server_killed_mid_clone(tmp_path: Path) -> None:
    served = tmp_path / "served"
    commit = make_tiny(served, "big", files={"data/blob.bin": os.urandom(BLOB)})
    daemon = GitDaemon(served)
    relay = Relay(daemon.port)
    try:
        mirrors = mirrors_file(tmp_path / "mirrors.toml", f"git://127.0.0.1:{relay.port}/")
        ws = tiny_workspace(tmp_path / "ws", commit, "big", exclude=["data"])
        # Not --offline: git:// is the network.
        args = [sys.executable, "-m", "kiln", *tiny_build_args(ws, tmp_path, mirrors)]
        kiln = subprocess.Popen(args, cwd=REPO, text=True, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while relay.sent < (2 << 20):  # 2 MiB of the pack have reached kiln
            assert kiln.poll() is None, kiln.communicate()
            assert time.monotonic() < deadline, "the fetch never started"
            time.sleep(0.05)
        daemon.kill()
        relay.drop()
        delivered = relay.sent
        _, stderr = kiln.communicate(timeout=120)

        assert delivered < BLOB, "the kill did not land mid-transfer"
        assert kiln.returncode == 3, stderr
        errors = error_lines(stderr)
        assert len(errors) == 1 and stderr.strip().splitlines()[-1] == errors[0], stderr
        assert errors[0].startswith(
            f"kiln: error: big: fetching {BASE_URL}big.git (mirror git://127.0.0.1:{relay.port}"
            f"/big.git) failed: "
        ), errors[0]
        assert "rerun once the source answers" in errors[0]
        # The bare clone holds no ref and passes fsck: a later run does not trust it.
        bare = tmp_path / "cache" / "git" / _cache_name(f"{BASE_URL}big.git")
        assert git_out("for-each-ref", cwd=bare) == ""
        assert git("fsck", "--no-dangling", cwd=bare, check=False).returncode == 0
        assert not (tmp_path / "artifacts" / "test-release").exists()

        # The server is back: the same command completes.
        daemon = GitDaemon(served)
        relay.upstream_port, relay.down = daemon.port, False
        res = subprocess.run(args, cwd=REPO, text=True, capture_output=True, check=False)
        assert res.returncode == 0, res.stderr[-3000:]
        assert list((tmp_path / "artifacts" / "test-release").glob("big-*.tar.zst"))
        assert commit in git_out("for-each-ref", "--format=%(objectname)", cwd=bare).split()
        # The tree that was built is whole (a commit from the cut fetch lacks the blob).
        blobs = list((tmp_path / "work").rglob("data/blob.bin"))
        assert [b.stat().st_size for b in blobs] == [BLOB]
    finally:
        relay.close()
        daemon.kill()
