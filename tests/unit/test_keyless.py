"""Sigstore keyless signing (kiln/release/keyless.py), as far as it goes without
Sigstore's services: GitHub Actions' token endpoint is a local mock (GitHub cannot be
reached from here), and what Fulcio and Rekor would do next is not run. Checked: the
signer's identity, the token taken when the key is loaded (the build's first stage),
each missing piece refused in one line naming the fix, and verify-release's --identity
refusing a release some other key signed."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.errors import SignatureError
from kiln.release import keyless, manifest, signing
from tests.conftest import artifacts_files, build_args, run_kiln
from tests.keys import keypair
from tests.releases import tiny_release
from tests.workspace import plain_vendor, write

WORKFLOW = "kiln-org/kiln/.github/workflows/release.yml@refs/heads/main"
IDENTITY = f"https://github.com/{WORKFLOW}"
GITHUB_ENV = ("GITHUB_ACTIONS", "GITHUB_WORKFLOW_REF", "ACTIONS_ID_TOKEN_REQUEST_URL")


@pytest.fixture(autouse=True)
def _no_ci_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever CI runs these tests, its own identity settings are not theirs."""
    for name in (*GITHUB_ENV, "ACTIONS_ID_TOKEN_REQUEST_TOKEN", keyless.IDENTITY_ENV):
        monkeypatch.delenv(name, raising=False)


def _jwt(claims: dict[str, object]) -> str:
    """An unsigned JWT of these claims: what the token endpoint hands out, as far as
    the signer reads it before Fulcio (which would check its signature) is asked."""

    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


@pytest.fixture
def github_oidc_mock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A local stand-in for GitHub Actions' OIDC token endpoint (the job's environment
    with ``permissions: id-token: write``); yields the audiences it was asked for."""
    asked: list[str] = []
    now = int(time.time())
    token = _jwt(
        {
            "iss": keyless.GITHUB_ISSUER,
            "aud": "sigstore",
            "sub": "repo:kiln-org/kiln:ref:refs/heads/main",
            "job_workflow_ref": WORKFLOW,
            "iat": now,
            "nbf": now,
            "exp": now + 600,
        }
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps({"value": token}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/token?api-version=2.0"
    for name, value in {
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKFLOW_REF": WORKFLOW,
        "ACTIONS_ID_TOKEN_REQUEST_URL": url,
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "runner-request-token",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }.items():
        monkeypatch.setenv(name, value)
    try:
        yield asked
    finally:
        server.shutdown()


def test_a_job_with_an_identity_token_loads_the_keyless_signer_mock_github_oidc(
    github_oidc_mock: list[str],
) -> None:
    """On GitHub Actions: the identity is the running workflow's, the token is taken
    when the signer is loaded, and the key is that identity's (its keyid, as
    verify-release --identity makes it)."""
    key = signing.load_signer("sigstore:?ambient=true")
    assert [p for p in github_oidc_mock if "audience=sigstore" in p], github_oidc_mock
    assert key.scheme == "Fulcio"
    assert key.identity == f"{IDENTITY} ({keyless.GITHUB_ISSUER})"
    assert key.keyid == keyless.identity_key(IDENTITY).keyid
    # signing takes a fresh token (the first lives minutes; a build can take longer)
    asked = len(github_oidc_mock)
    assert signing.signer_now(key) is not key.signer
    assert len(github_oidc_mock) == asked + 1


def test_a_github_job_without_id_token_permission_is_refused_before_the_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The workflow's job lacks ``permissions: id-token: write``: ``kiln build`` stops
    at its first stage, exit 19, the fix named, nothing written."""
    env = {"GITHUB_ACTIONS": "true", "GITHUB_WORKFLOW_REF": WORKFLOW}
    ws = write(tmp_path / "ws", {"plain": plain_vendor("a" * 40)})
    res = run_kiln(*build_args(ws, tmp_path, "--sign", "sigstore:", runner=None), env=env)
    assert res.returncode == SignatureError.exit_code, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line == (
        "kiln: error: --sign sigstore:: give the job `permissions: id-token: write` "
        "(ci/release.yml's release job)"
    ), line
    assert artifacts_files(tmp_path / "artifacts") == []


def test_keyless_signing_off_ci_names_what_is_missing() -> None:
    with pytest.raises(SignatureError, match=r"set \$KILN_SIGN_IDENTITY to the signing"):
        signing.load_signer("sigstore:")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(keyless.IDENTITY_ENV, IDENTITY)
        with pytest.raises(SignatureError, match="no identity token here: keyless signing"):
            signing.load_signer("sigstore:")


def test_verify_release_by_identity_refuses_a_release_another_key_signed(
    tmp_path: Path,
) -> None:
    """--identity checks the envelope against that identity's key: a release signed by
    a key file is not signed by the workflow, and is refused without asking Sigstore."""
    private, _public = keypair(tmp_path, "signer")
    release = tiny_release(tmp_path / "release")
    signing.sign(
        release, manifest.read(release / "manifest.json"), signing.load_signer(str(private))
    )
    res = run_kiln("verify-release", release, "--identity", IDENTITY)
    assert res.returncode == SignatureError.exit_code, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert f"provenance.intoto.dsse.json: not signed by the identity {IDENTITY} (" in line
    both = run_kiln("verify-release", release, "--identity", IDENTITY, "--key", _public)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_verify_release_by_identity_without_the_sigstore_library_says_to_install_it(
    tmp_path: Path,
) -> None:
    """Issue 55 (2): without the sigstore extra, --identity said "not signed by the
    identity": a genuine keyless release looked forged. Run with a ``sigstore`` package
    that fails to import (as where it is not installed): the line names the extra to
    install; with the library (this venv's), the same check goes on to the signature."""
    private, _public = keypair(tmp_path, "signer")
    release = tiny_release(tmp_path / "release")
    signing.sign(
        release, manifest.read(release / "manifest.json"), signing.load_signer(str(private))
    )
    absent = tmp_path / "absent" / "sigstore"
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text("raise ImportError('sigstore is not installed')\n")
    env = {"PYTHONPATH": str(absent.parent)}
    res = run_kiln("verify-release", release, "--identity", IDENTITY, env=env)
    assert res.returncode == SignatureError.exit_code, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "needs the sigstore library, which is not installed: pip install 'kiln[sigstore]'" in (
        line
    )
    with_it = run_kiln("verify-release", release, "--identity", IDENTITY)
    assert "not signed by the identity" in with_it.stderr


def test_a_keyless_release_readme_names_the_identity_and_how_to_check_it(
    tmp_path: Path,
) -> None:
    """The README says who signed (the workflow, its issuer) and the command that checks
    it; install.sh is shown without --pubkey, since no key file exists."""
    from kiln.release import readme

    m = manifest.read(tiny_release(tmp_path / "release") / "manifest.json")
    key = keyless.identity_key(IDENTITY)
    signed = m.model_copy(
        update={
            "release": m.release.model_copy(
                update={"signed_by": key.keyid, "signer_identity": keyless.described(key)}
            )
        }
    )
    text = readme.render(signed)
    assert f"keyless with Sigstore by `{IDENTITY}` (OIDC issuer `{keyless.GITHUB_ISSUER}`" in text
    assert f"`python -m kiln verify-release . --identity {IDENTITY}`" in text
    assert "--pubkey" not in text and "SHA256SUMS" not in text  # openssl cannot check it
    keyed = m.model_copy(update={"release": m.release.model_copy(update={"signed_by": key.keyid})})
    assert '--pubkey "$KEY"' in readme.render(keyed)
