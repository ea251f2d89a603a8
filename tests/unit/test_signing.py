"""Signed releases (issue 43), on a small release folder made without a build: signed
with real keys (openssl-made Ed25519, and ECDSA for the check only kiln reads), checked
by ``kiln verify-release``, by the standard-library checker install.sh runs, and by
in-toto's own envelope verification; each bad input refused in one line, exit 19."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from in_toto.models.metadata import Envelope as InTotoEnvelope  # type: ignore[import-untyped]
from securesystemslib.signer import SSlibKey

from kiln.errors import SignatureError
from kiln.release import manifest, readme, signing
from tests.conftest import REPO, artifacts_files, build_args, run_kiln
from tests.keys import keypair
from tests.releases import tiny_release
from tests.require import missing
from tests.workspace import plain_vendor, write

CHECKER = REPO / "kiln" / "templates" / "verify_signature.py"


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(release, private key, public key): a small release signed with an Ed25519 key."""
    private, public = keypair(tmp_path, "signer")
    release = tiny_release(tmp_path / "release")
    (release / "wheels").mkdir()
    (release / "wheels" / "x-1.0-py3-none-any.whl").write_bytes(b"a wheel's bytes")
    signing.sign(
        release, manifest.read(release / "manifest.json"), signing.load_signer(str(private))
    )
    return release, private, public


def _checker(release: Path, key: Path) -> subprocess.CompletedProcess[str]:
    """What install.sh runs: the standard-library checker, by a Python without kiln."""
    return subprocess.run(
        [sys.executable, "-I", str(CHECKER), str(release), str(key)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_signed_release_is_checked_by_kiln_the_stdlib_checker_and_in_toto(
    signed: tuple[Path, Path, Path],
) -> None:
    release, _private, public = signed
    res = run_kiln("verify-release", release, "--key", public)
    assert res.returncode == 0, res.stderr
    assert "5 files checked against provenance.intoto.dsse.json" in res.stdout
    assert _checker(release, public).returncode == 0
    # in-toto's own verification of the same envelope, and the digests by this test
    data = json.loads((release / signing.ENVELOPE_FILE).read_text())
    envelope = InTotoEnvelope.from_dict(data)
    key = SSlibKey.from_crypto(load_pem_public_key(public.read_bytes()))
    assert set(envelope.verify([key], 1)) == {key.keyid}
    statement = json.loads(base64.b64decode(data["payload"]))
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    for subject in statement["subject"]:
        digest = hashlib.sha256((release / subject["name"]).read_bytes()).hexdigest()
        assert digest == subject["digest"]["sha256"], subject["name"]
    assert {s["name"] for s in statement["subject"]} == {
        "README.md",
        "manifest.json",
        "wheels/x-1.0-py3-none-any.whl",
        signing.SUMS_FILE,
        signing.SUMS_SIGNATURE_FILE,
    }
    assert (release / signing.SUMS_FILE).read_text() == signing.sums_text(release)


def test_signing_is_deterministic(signed: tuple[Path, Path, Path]) -> None:
    """The same release and Ed25519 key give the same envelope, byte for byte."""
    release, private, _public = signed
    first = (release / signing.ENVELOPE_FILE).read_bytes()
    m = manifest.read(release / "manifest.json")
    key = signing.load_signer(f"file:{private}")
    assert signing.signer_now(key) is key.signer  # a key file's signer: loaded once
    signing.sign(release, m, key)
    assert (release / signing.ENVELOPE_FILE).read_bytes() == first


def _tamper_wheel(release: Path) -> str:
    (release / "wheels" / "x-1.0-py3-none-any.whl").write_bytes(b"another wheel")
    return "wheels/x-1.0-py3-none-any.whl: changed after signing"


def _tamper_payload(release: Path) -> str:
    path = release / signing.ENVELOPE_FILE
    data = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(data["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "0" * 64
    data["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(data))
    return "provenance.intoto.dsse.json: not signed by the key"


def _add_file(release: Path) -> str:
    (release / "wheels" / "evil-1.0-py3-none-any.whl").write_bytes(b"not signed")
    return "wheels/evil-1.0-py3-none-any.whl: in the release folder but not signed"


def _drop_envelope(release: Path) -> str:
    (release / signing.ENVELOPE_FILE).unlink()
    return "provenance.intoto.dsse.json: no signature envelope"


def _link_folder(release: Path) -> str:
    """An unsigned folder linked into the release (issue 55 (2): it passed both checks)."""
    outside = release.parent / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text("print('pwned')\n")
    (release / "extra").symlink_to(outside, target_is_directory=True)
    return "extra: a symbolic link in the release folder: a release holds none"


def _link_file(release: Path) -> str:
    (release / "notes.md").symlink_to(release / "README.md")
    return "notes.md: a symbolic link in the release folder"


@pytest.mark.parametrize(
    "tamper",
    [_tamper_wheel, _tamper_payload, _add_file, _drop_envelope, _link_folder, _link_file],
    ids=lambda f: f.__name__,
)
def test_a_release_changed_after_signing_is_refused(
    signed: tuple[Path, Path, Path], tamper
) -> None:
    release, _private, public = signed
    said = tamper(release)
    res = run_kiln("verify-release", release, "--key", public)
    assert res.returncode == 19, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"kiln: error: {release}/") and said in line, line
    own = _checker(release, public)
    assert own.returncode == 19 and said in own.stderr, own.stderr


def test_both_checkers_read_the_same_fields_a_changed_keyid_hint_decides_nothing(
    signed: tuple[Path, Path, Path],
) -> None:
    """Issue 55 (2): the keyid of a DSSE signature is a hint outside the signed bytes;
    the shipped checker ignored it and kiln's refused a changed one. Both now check the
    signature whatever it names, and both refuse a changed signature."""
    release, _private, public = signed
    path = release / signing.ENVELOPE_FILE
    data = json.loads(path.read_text())
    data["signatures"][0]["keyid"] = "0" * 64
    path.write_text(json.dumps(data))
    res = run_kiln("verify-release", release, "--key", public)
    assert res.returncode == 0, res.stderr
    assert _checker(release, public).returncode == 0
    sig = bytearray(base64.b64decode(data["signatures"][0]["sig"]))
    sig[0] ^= 1
    data["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    path.write_text(json.dumps(data))
    assert run_kiln("verify-release", release, "--key", public).returncode == 19
    assert _checker(release, public).returncode == 19


def test_a_signature_by_another_key_is_refused(
    signed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    release, _private, _public = signed
    _other, other_public = keypair(tmp_path, "other")
    res = run_kiln("verify-release", release, "--key", other_public)
    assert res.returncode == 19
    assert f"not signed by the key {other_public} (keyid " in res.stderr
    assert _checker(release, other_public).returncode == 19


def test_a_key_that_cannot_be_read_or_is_of_the_wrong_type_is_refused(
    signed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    release, private, _public = signed
    missing = run_kiln("verify-release", release, "--key", tmp_path / "nope.pub")
    assert missing.returncode == 19 and "nope.pub: cannot read the public key" in missing.stderr
    wrong = run_kiln("verify-release", release, "--key", private)  # a private key
    assert wrong.returncode == 19 and "not a PEM public key" in wrong.stderr
    assert _checker(release, private).returncode == 19
    with pytest.raises(SignatureError, match="cannot read the key"):
        signing.load_signer(str(tmp_path / "nope.pem"))
    with pytest.raises(SignatureError, match="not an unencrypted PEM private key"):
        signing.load_signer(str(_public))
    with pytest.raises(SignatureError, match=r"\$KILN_TEST_NO_SUCH_KEY is empty or unset"):
        signing.load_signer("env:KILN_TEST_NO_SUCH_KEY")


def test_an_ecdsa_key_signs_and_kiln_checks_it(tmp_path: Path) -> None:
    """Any key securesystemslib signs with; the standard-library checker reads Ed25519
    alone and says so."""
    private, public = keypair(tmp_path, "ec", "ec")
    release = tiny_release(tmp_path / "release")
    key = signing.load_signer(str(private))
    assert key.scheme.startswith("ecdsa")
    signing.sign(release, manifest.read(release / "manifest.json"), key)
    assert run_kiln("verify-release", release, "--key", public).returncode == 0
    own = _checker(release, public)
    assert own.returncode == 19 and "not an Ed25519 public key" in own.stderr


def test_a_key_in_an_environment_variable_signs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private, public = keypair(tmp_path, "ci")
    monkeypatch.setenv("KILN_TEST_SIGNING_KEY", private.read_text())
    release = tiny_release(tmp_path / "release")
    key = signing.load_signer("env:KILN_TEST_SIGNING_KEY")
    signing.sign(release, manifest.read(release / "manifest.json"), key)
    shutil.copytree(release, tmp_path / "copy")
    assert run_kiln("verify-release", tmp_path / "copy", "--key", public).returncode == 0


def test_publish_carries_the_envelope(tmp_path: Path) -> None:
    """A folder target receives the signature with the files it vouches for, and the
    release checks there as it did here."""
    private, public = keypair(tmp_path, "signer")
    release = tiny_release(tmp_path / "release")
    signing.sign(
        release, manifest.read(release / "manifest.json"), signing.load_signer(str(private))
    )
    res = run_kiln("publish", release, "--to", tmp_path / "published")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "published" / signing.ENVELOPE_FILE).is_file()
    assert run_kiln("verify-release", tmp_path / "published", "--key", public).returncode == 0


def test_verify_rebuilds_a_signed_release_unsigned_as_its_files_are(tmp_path: Path) -> None:
    """``kiln verify`` has no key: its rebuild's workspace drops the signing settings
    (a required signature would refuse it) and the rebuild writes the files a signed
    release has from the keyid the manifest names (Options.signed_by)."""
    from kiln.config.models import Release
    from kiln.verbs.rebuild_check import workspace_from_manifest

    release = tiny_release(tmp_path / "release")
    (release / "requirements.txt").write_text("")
    m = manifest.read(release / "manifest.json")
    signed = m.model_copy(
        update={
            "release": m.release.model_copy(
                update={"signed_by": "ab" * 32, "require_signature": True}
            )
        }
    )
    ws = workspace_from_manifest(signed, release, tmp_path / "ws")
    table = tomllib.loads((ws / "kiln.toml").read_text())["release"]
    assert not Release.model_validate(table).require_signature  # a config key, and off
    assert "signed_by" not in table


def test_a_signed_subject_outside_the_folder_is_refused(tmp_path: Path) -> None:
    """A statement naming a file outside the release (an absolute path) is never read
    there, even signed by the right key."""
    from securesystemslib import dsse

    private, public = keypair(tmp_path, "signer")
    release = tiny_release(tmp_path / "release")
    m = manifest.read(release / "manifest.json")
    statement = json.loads(signing.statement_bytes(release, m))
    statement["subject"].append({"name": "/etc/hostname", "digest": {"sha256": "0" * 64}})
    envelope = dsse.Envelope(json.dumps(statement).encode(), signing.PAYLOAD_TYPE, {})
    envelope.sign(signing.load_signer(str(private)).signer)
    (release / signing.ENVELOPE_FILE).write_text(json.dumps(envelope.to_dict()))
    res = run_kiln("verify-release", release, "--key", public)
    assert (
        res.returncode == 19 and "/etc/hostname: signed, but missing from the release" in res.stderr
    )
    own = _checker(release, public)
    assert own.returncode == 19 and "/etc/hostname" in own.stderr


def test_verify_compares_the_manifest_and_a_signed_rebuilds_envelope(
    signed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """``kiln verify``'s comparison: the manifest itself, and the envelope of a rebuild
    signed too (``--sign``); each difference named with the JSON key that differs."""
    from kiln.verbs.rebuild_check import builder_note, compare
    from tests.releases import edit_manifest

    release, _private, _public = signed
    again = tmp_path / "again"
    shutil.copytree(release, again)
    m = manifest.read(release / "manifest.json")
    assert compare(m, release, again) == []
    other, _ = keypair(tmp_path, "other")
    signing.sign(again, m, signing.load_signer(str(other)))
    report = compare(m, release, again)
    assert report[0].startswith(f"{signing.ENVELOPE_FILE}: sha256 "), report
    assert any(line.startswith("  signatures.0.keyid: ") for line in report), report
    # another kiln rebuilt it: the manifest differs in kiln_commit alone, said, no failure
    edit_manifest(again, lambda d: d.update(kiln_commit="0123456789ab"))
    assert compare(m, release, again) == []
    note = builder_note(release, again)
    assert note is not None and "kiln_commit None != 0123456789ab" in note, note
    edit_manifest(again, lambda d: d["release"].update(name="other"))
    report = compare(m, release, again)
    assert builder_note(release, again) is None
    assert report[0].startswith("manifest.json: sha256 "), report
    assert '  release.name: "tiny" != "other"' in report, report


SOFTHSM_LIBS = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
)
HSM_URI = "hsm:2?label=kiln-test"


# The key pair made in a process of its own: a PKCS#11 library is initialized once per
# process, with the SOFTHSM2_CONF of its first use, so this process's library still
# reads the first test's token folder (kept for the session, below).
_KEYPAIR = """
import os, pkcs11
from pkcs11.util.ec import encode_named_curve_parameters
token = pkcs11.lib(os.environ["PYKCS11LIB"]).get_token(token_label="kiln-test")
with token.open(rw=True, user_pin="1234") as session:
    curve = {pkcs11.Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1")}
    params = session.create_domain_parameters(pkcs11.KeyType.EC, curve, local=True)
    params.generate_keypair(store=True, id=b"\\x02", label="kiln-release")
"""


@pytest.fixture
def softhsm(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """A real PKCS#11 token (SoftHSM, Debian's softhsm2) holding an ECDSA P-256 key of
    id 2, PIN 1234: what a team's HSM or YubiKey is to kiln. The environment that
    reaches it (also set in this process). Its folder lasts the session: this process's
    PKCS#11 library keeps reading the token folder it first read."""
    lib = next((p for p in SOFTHSM_LIBS if Path(p).is_file()), None)
    if lib is None or shutil.which("softhsm2-util") is None:
        missing("SOFTHSM", "no SoftHSM here (apt-get install softhsm2)")
    pytest.importorskip("pkcs11")
    where = tmp_path_factory.mktemp("softhsm")
    (where / "tokens").mkdir()
    conf = where / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {where / 'tokens'}\nlog.level = ERROR\n")
    env = {"SOFTHSM2_CONF": str(conf), "PYKCS11LIB": lib, "KILN_SIGN_PIN": "1234"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(signing.PUBKEY_ENV, raising=False)
    subprocess.run(
        [
            *("softhsm2-util", "--init-token", "--free", "--label", "kiln-test"),
            *("--pin", "1234", "--so-pin", "5678"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run([sys.executable, "-c", _KEYPAIR], check=True, env={**os.environ, **env})
    return env


def test_a_key_in_a_pkcs11_token_signs_by_its_uri_softhsm(
    softhsm: dict[str, str], tmp_path: Path
) -> None:
    """``--sign hsm:2?label=...``: the public key asked of the token, the PIN from
    $KILN_SIGN_PIN; the release checks with that public key (kiln and in-toto)."""
    release = tiny_release(tmp_path / "release")
    key = signing.load_signer(HSM_URI)
    assert key.scheme == "ecdsa-sha2-nistp256"
    signing.sign(release, manifest.read(release / "manifest.json"), key)
    public = tmp_path / "hsm.pub"
    public.write_text(key.signer.public_key.keyval["public"])
    res = run_kiln("verify-release", release, "--key", public)
    assert res.returncode == 0, res.stderr
    data = json.loads((release / signing.ENVELOPE_FILE).read_text())
    ssl_key = SSlibKey.from_crypto(load_pem_public_key(public.read_bytes()))
    assert set(InTotoEnvelope.from_dict(data).verify([ssl_key], 1)) == {key.keyid}


# python-pkcs11 leaves a search generator open when the token refuses the PIN; its
# finalizer's SessionHandleInvalid is printed as an unraisable exception, not ours
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_token_key_that_cannot_sign_stops_the_build_before_anything_softhsm(
    softhsm: dict[str, str], tmp_path: Path
) -> None:
    """A wrong PIN, or none, is found when the key is loaded (it signs a fixed text
    then), so ``kiln build`` stops at its first stage: exit 19, nothing written."""
    ws = write(tmp_path / "ws", {"plain": plain_vendor("a" * 40)})
    res = run_kiln(
        *build_args(ws, tmp_path, "--sign", HSM_URI, runner=None),
        env={**softhsm, "KILN_SIGN_PIN": "4321"},
    )
    assert res.returncode == SignatureError.exit_code, res.stderr
    (line,) = res.stderr.strip().splitlines()
    # the public key is read without the PIN; the probe's signature is refused
    assert line == (
        f"kiln: error: --sign {HSM_URI}: the key cannot sign: PinIncorrect: the token refused "
        "the PIN in $KILN_SIGN_PIN"
    ), line
    assert artifacts_files(tmp_path / "artifacts") == []
    os.environ.pop("KILN_SIGN_PIN")
    with pytest.raises(SignatureError, match=r"pin is needed: set \$KILN_SIGN_PIN$"):
        signing.load_signer(HSM_URI)
    with pytest.raises(SignatureError, match=r"^--sign hsm:7\?label=kiln-test: "):
        signing.load_signer("hsm:7?label=kiln-test")  # no such key on the token


# The release README's first instruction (issue 55 (2)): the receiver's own openssl and
# sha256sum check a key-signed release before anything from it runs.
def _receiver_check(release: Path, public: Path, scheme: str) -> subprocess.CompletedProcess[str]:
    """The README's check lines for ``scheme``, run by bash as a receiver runs them."""
    lines = readme.receiver_check(scheme, str(release))
    script = "\n".join([f"KEY={public}", *lines[:-1], f"{lines[-1]} && echo CHECKED"])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)


def _hub_download(release: Path) -> str:
    """What `hf download --local-dir` and the Hub repository add: passes by name."""
    (release / ".gitattributes").write_text("*.whl filter=lfs diff=lfs merge=lfs -text\n")
    records = release / ".cache" / "huggingface" / "download" / "wheels"
    records.mkdir(parents=True)
    (records / "x-1.0-py3-none-any.whl.metadata").write_text("abc\n0123\n1.0\n")
    return ""


def _checker_and_wheel_changed(release: Path) -> str:
    """The attack of the issue: the shipped checker stubbed and a wheel changed."""
    (release / "verify-release.py").write_text("print('verify-release: 9 files checked')\n")
    _tamper_wheel(release)
    return "FAILED"


def _sums_rewritten(release: Path) -> str:
    """A wheel changed and SHA256SUMS rewritten to match it: the signature refuses."""
    _tamper_wheel(release)
    sums = release / signing.SUMS_FILE
    sums.write_text(signing.sums_text(release))
    return "erif"  # openssl: "Signature Verification Failure" / "Verification failure"


def _extra_file(release: Path) -> str:
    _add_file(release)
    return "> wheels/evil-1.0-py3-none-any.whl"


def _symlink(release: Path) -> str:
    _link_file(release)
    return "./notes.md"


def _sums_dropped(release: Path) -> str:
    (release / signing.SUMS_FILE).unlink()
    return "SHA256SUMS"


@pytest.mark.parametrize("algorithm", ["ed25519", "ec", "rsa"])
@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: "",
        _hub_download,
        _checker_and_wheel_changed,
        _sums_rewritten,
        _extra_file,
        _symlink,
        _sums_dropped,
    ],
    ids=["as-signed", "hub-download", "checker-and-wheel", "sums-rewritten", "extra-file",
         "symlink", "sums-dropped"],
)  # fmt: skip
def test_the_readme_check_by_openssl_and_sha256sum(
    tmp_path: Path, algorithm: str, tamper: Callable[[Path], str]
) -> None:
    """A release signed by an Ed25519, ECDSA or RSA key: the README's check passes it as
    signed and as the Hub's client downloads it, and refuses it changed in any way (the
    shipped checker and a wheel both changed, SHA256SUMS rewritten to match, a file
    added, a symbolic link, SHA256SUMS gone), with nothing from the release run."""
    private, public = keypair(tmp_path, "signer", algorithm)
    release = tiny_release(tmp_path / "release")
    (release / "wheels").mkdir()
    (release / "wheels" / "x-1.0-py3-none-any.whl").write_bytes(b"a wheel's bytes")
    (release / "verify-release.py").write_text("# the shipped checker\n")
    key = signing.load_signer(str(private))
    signing.sign(release, manifest.read(release / "manifest.json"), key)
    assert (release / signing.SUMS_SIGNATURE_FILE).is_file()
    passed = _receiver_check(release, public, key.scheme)
    assert passed.returncode == 0 and passed.stdout.strip().endswith("CHECKED"), passed
    said = tamper(release)
    res = _receiver_check(release, public, key.scheme)
    if said == "":
        assert res.returncode == 0 and "CHECKED" in res.stdout, res
        assert run_kiln("verify-release", release, "--key", public).returncode == 0
        return
    assert res.returncode != 0 and "CHECKED" not in res.stdout, res
    assert said in res.stdout + res.stderr, res


def test_the_readme_names_its_check_first_and_the_scheme_install_sh_reads(
    tmp_path: Path,
) -> None:
    """The install block: download, the receiver's check, then install.sh (told
    --pubkey for Ed25519, which its own checker reads; --no-verify after openssl for
    the others, which it cannot); a keyless release keeps kiln's Sigstore check."""
    m = manifest.read(tiny_release(tmp_path / "r") / "manifest.json")
    for scheme, again in [("ed25519", '--pubkey "$KEY"'), ("ecdsa-sha2-nistp256", "--no-verify")]:
        release = m.release.model_copy(update={"signed_by": "k" * 64, "signer_scheme": scheme})
        text = readme.render(m.model_copy(update={"release": release}))
        block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
        assert block[1].startswith("hf download ")
        check = readme.receiver_check(scheme, "/opt/kiln/release")
        at = block.index(check[0])
        assert block[at : at + len(check) - 1] == check[:-1]
        assert block[-1].startswith("bash /opt/kiln/release/install.sh") and block[-1].endswith(
            again
        ), block
