"""The network row names what a build step tried to download. The step's proxy
(kiln.inside.netrefuse) sees an HTTPS request as ``https://HOST:443`` only; setup.py's URL on
that host, with its line, says more and is the one named (a full HTTP URL is kept)."""

from __future__ import annotations

from pathlib import Path

from kiln.inside import diagnose, netrefuse

_URL = "https://downloads.invalid/pkg/pkg-0.1.0-cp311-linux.whl"
_SETUP = f'import urllib.request\n\n\nurllib.request.urlopen("{_URL}")\n'
_ERROR = "urllib.error.URLError: <urlopen error Tunnel connection failed: 403 Forbidden>\n"


def _cause(tmp_path: Path, refused: str) -> str:
    (tmp_path / "setup.py").write_text(_SETUP)
    output = f"{netrefuse.MARK}{refused} (the build step has no network)\n{_ERROR}"
    d = diagnose.diagnose(output, tmp_path, {}, "v")
    assert d.cause is not None and d.cause.row == "network-download", d
    return d.cause.cause


def test_an_https_request_is_named_by_setup_pys_url_on_its_host(tmp_path: Path) -> None:
    cause = _cause(tmp_path, "https://downloads.invalid:443")
    assert f"tried to download {_URL} (setup.py:4), and builds are offline" in cause


def test_a_request_to_another_host_is_named_as_the_proxy_saw_it(tmp_path: Path) -> None:
    cause = _cause(tmp_path, "https://elsewhere.invalid:443")
    assert "tried to download https://elsewhere.invalid:443, and" in cause


def test_a_full_http_url_is_named_as_requested(tmp_path: Path) -> None:
    cause = _cause(tmp_path, "http://downloads.invalid/other.tar.gz")
    assert "tried to download http://downloads.invalid/other.tar.gz, and" in cause
