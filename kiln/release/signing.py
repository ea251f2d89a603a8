"""A release signed, and checked by whoever receives it (issue 43).

What is signed: the release's provenance statement (an in-toto Statement, SLSA v1
predicate, :mod:`kiln.release.provenance`) whose subjects are *every file* of the release
folder with its sha256 (wheels, variant wheels, tarballs, install.sh, the SBOM, the
manifest, the README...), in a DSSE envelope beside them (:data:`ENVELOPE_FILE`), signed
through securesystemslib's signer interface (one library for every kind of key):

- ``file:PATH`` (or a bare path): a PEM private key file (PKCS#8; Ed25519, ECDSA, RSA);
- ``env:VAR``: the same PEM in an environment variable (a CI secret);
- any other securesystemslib signer URI (``hsm:`` a PKCS#11 token, ``awskms:``,
  ``gcpkms:``, ``azurekms:``, ``file2:``), resolved by ``Signer.from_priv_key_uri``: its
  public key from ``$KILN_SIGN_PUBKEY`` (a PEM file), else asked of the key store
  (``hsm:``, ``awskms:``, ``gcpkms:``); a token's PIN from ``$KILN_SIGN_PIN``. Such a
  key signs a fixed text when it is loaded, so a key that cannot sign stops the build
  before it compiles.

With an Ed25519 key signing is deterministic: the same release and key give the same
envelope, byte for byte. Checking (:func:`verify`): the envelope's signature by the
given public key, every subject's digest against its file, the statement's recipes
against the manifest, and no file in the folder that no subject names.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import (
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib import dsse
from securesystemslib.exceptions import UnsupportedLibraryError, VerificationError
from securesystemslib.signer import (
    AWSSigner,
    CryptoSigner,
    GCPSigner,
    HSMSigner,
    Key,
    Signature,
    Signer,
    SSlibKey,
)

from kiln.errors import SignatureError
from kiln.fsutil import sha256_file
from kiln.inside.kit import contract
from kiln.release import keyless, provenance
from kiln.release.manifest import FILE_NAME as MANIFEST_FILE
from kiln.release.manifest import Manifest

ENVELOPE_FILE = "provenance.intoto.dsse.json"
# A key-signed release also carries its files' digests in coreutils' form and that file's
# signature alone (raw bytes: Ed25519's 64, else DER): what the release README's first
# instruction checks with openssl and sha256sum, tools the receiver already trusts,
# before anything from the release runs (issue 55 (2)). Both are subjects of the envelope.
SUMS_FILE = "SHA256SUMS"
SUMS_SIGNATURE_FILE = "SHA256SUMS.sig"
SIGNATURE_FILES = (ENVELOPE_FILE, SUMS_FILE, SUMS_SIGNATURE_FILE)
# What a release folder downloaded from the Hub holds that no release has, passed by name
# by every check: the Hub repository's own .gitattributes, and the Hub client's records
# (`hf download --local-dir` writes .cache/huggingface/...). install.sh reads neither.
HUB_CLIENT_FILES = (".gitattributes",)
HUB_CLIENT_FOLDER = ".cache/huggingface"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PUBKEY_ENV = contract.SIGN_PUBKEY  # the public key of a signer kiln cannot derive it from
PIN_ENV = contract.SIGN_PIN  # the PIN of a PKCS#11 token (hsm:)


@dataclass(frozen=True)
class SigningKey:
    """A signer and what the README says of it."""

    signer: Signer
    keyid: str
    scheme: str
    identity: str | None = None  # a keyless signer's: "identity (issuer)"
    uri: str | None = None  # a keyless signer's, to take a fresh identity token at signing


def signer_now(key: SigningKey) -> Signer:
    """The signer to sign with now. A keyless one takes a fresh identity token: the one
    taken when the build began (to fail before the compiles) lives minutes, and a build
    can take longer."""
    return keyless.load(key.uri) if key.identity and key.uri else key.signer


def public_key(path: Path) -> SSlibKey:
    """A PEM public key file as securesystemslib's key (its keyid: the key's own hash)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SignatureError(f"{path}: cannot read the public key: {exc.strerror}") from None
    try:
        return SSlibKey.from_crypto(load_pem_public_key(data))
    except (ValueError, TypeError) as exc:
        raise SignatureError(
            f"{path}: not a PEM public key kiln can check with ({exc}): give the "
            "release's public key (-----BEGIN PUBLIC KEY-----)"
        ) from None


def _crypto_signer(pem: bytes, where: str) -> CryptoSigner:
    try:
        private = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(
            f"{where}: not an unencrypted PEM private key ({exc}): give a PKCS#8 PEM key "
            "(openssl genpkey -algorithm ed25519 -out key.pem)"
        ) from None
    try:
        return CryptoSigner(private)
    except ValueError as exc:  # a key type securesystemslib does not sign with
        raise SignatureError(f"{where}: {exc}: use an Ed25519, ECDSA or RSA key") from None


def load_signer(uri: str) -> SigningKey:
    """The signer ``uri`` names (``--sign``, ``KILN_SIGN``); refused in one line naming
    the key and the fix, before anything is built."""
    if uri.startswith("env:"):
        var = uri.removeprefix("env:")
        text = os.environ.get(var)
        if not text:
            raise SignatureError(f"--sign {uri}: ${var} is empty or unset: put the PEM key in it")
        signer: Signer = _crypto_signer(text.encode(), f"--sign {uri} (${var})")
    elif uri.startswith("file:") or ":" not in uri.split("/", 1)[0]:
        path = Path(uri.removeprefix("file:"))
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SignatureError(
                f"--sign {uri}: cannot read the key {path}: {exc.strerror}"
            ) from None
        signer = _crypto_signer(data, f"--sign {uri}")
    elif uri.startswith("sigstore:"):  # its identity token taken now, no probe (Rekor)
        signer = keyless.load(uri)
        key = signer.public_key
        return SigningKey(signer, key.keyid, key.scheme, keyless.described(key), uri)
    else:
        signer = _uri_signer(uri)
        _probe(signer, uri)  # a token's wrong PIN or a KMS key not allowed to sign: now
    key = signer.public_key
    return SigningKey(signer, key.keyid, key.scheme)


def _secret(message: str) -> str:
    """The signer's secret (an HSM's PIN): from ``$KILN_SIGN_PIN``, never a prompt."""
    pin = os.environ.get(PIN_ENV)
    if pin is None:
        raise SignatureError(f"the signing key's {message} is needed: set ${PIN_ENV}")
    return pin


def _import_public_key(uri: str) -> SSlibKey | None:
    """The public key of a key store's key, asked of the store itself (a PKCS#11
    token, AWS or GCP KMS); None for a signer that cannot say it."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "hsm":
        label = dict(urllib.parse.parse_qsl(parsed.query)).get("label")
        keyid = int(parsed.path) if parsed.path else None
        return HSMSigner.import_(keyid, label, _secret)[1]
    if parsed.scheme == "awskms":
        return AWSSigner.import_(parsed.path)[1]
    if parsed.scheme == "gcpkms":
        return GCPSigner.import_(parsed.path)[1]
    return None


def _uri_signer(uri: str) -> Signer:
    """A securesystemslib signer URI: its public key from ``$KILN_SIGN_PUBKEY``, else
    from the key store itself; one line naming the URI and the fix on any failure."""
    pub = os.environ.get(PUBKEY_ENV)
    try:
        key = public_key(Path(pub)) if pub else _import_public_key(uri)
        if key is None:
            raise SignatureError(
                f"--sign {uri}: a signer URI needs its public key: set ${PUBKEY_ENV} to "
                "its PEM file"
            )
        return Signer.from_priv_key_uri(uri, key, _secret)
    except SignatureError as exc:
        if str(exc).startswith("--sign "):
            raise
        raise SignatureError(f"--sign {uri}: {exc}") from None
    except Exception as exc:  # the signer library's own, whatever the backend
        raise SignatureError(f"--sign {uri}: {_backend_said(exc)}") from None


def _backend_said(exc: Exception) -> str:
    """A key store's exception in words (a PKCS#11 error's text is often empty)."""
    name = type(exc).__name__
    if isinstance(exc, UnsupportedLibraryError):  # the backend's library is not installed
        return f"{exc}: pip install 'kiln[hsm]' (hsm:) or 'securesystemslib[awskms]' and the like"
    if name.startswith("Pin"):  # python-pkcs11's PinIncorrect, PinLocked, PinExpired...
        return f"{name}: the token refused the PIN in ${PIN_ENV}"
    return f"{name}: {exc}" if str(exc) else name


def _probe(signer: Signer, uri: str) -> None:
    """Sign and check a fixed text before anything is built: a key store that cannot
    sign with this key (a wrong PIN, a key without the permission, another key than the
    public one given) stops the build at its first stage, not after its compiles."""
    probe = b"kiln: can this key sign a release?"
    try:
        signature = signer.sign(probe)
        signer.public_key.verify_signature(signature, probe)
    except SignatureError as exc:  # no PIN to give the token
        raise SignatureError(f"--sign {uri}: {exc}") from None
    except VerificationError:
        raise SignatureError(
            f"--sign {uri}: its signature does not check against the public key given "
            f"(${PUBKEY_ENV}): give the public half of this key"
        ) from None
    except Exception as exc:  # the backend's own (a PKCS#11 PIN error, a KMS refusal)
        raise SignatureError(f"--sign {uri}: the key cannot sign: {_backend_said(exc)}") from None


KEYLESS_KEYTYPE = "sigstore-oidc"  # securesystemslib's key type of a keyless identity


def first_link(folder: Path) -> Path | None:
    """The first symbolic link under ``folder`` (files or folders; none followed)."""
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in sorted(dirs + files):
            if os.path.islink(os.path.join(top, name)):
                return Path(top) / name
    return None


def hub_client_file(rel: str) -> bool:
    """Whether ``rel`` (``/``-relative) is the Hub's or its client's, not the release's."""
    return rel in HUB_CLIENT_FILES or rel.startswith(HUB_CLIENT_FOLDER + "/")


def release_files(folder: Path) -> Iterator[str]:
    """Every file of a release folder but the envelope and the Hub client's files
    (sorted, ``/``-relative)."""
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != ENVELOPE_FILE and not hub_client_file(rel):
            yield rel


def sums_text(folder: Path) -> str:
    """``SHA256SUMS``: every file of the release but the signature files, as ``sha256sum``
    writes it (the digest, two spaces, the path)."""
    return "".join(
        f"{sha256_file(folder / rel)}  {rel}\n"
        for rel in release_files(folder)
        if rel not in SIGNATURE_FILES
    )


def statement_bytes(folder: Path, m: Manifest) -> bytes:
    """The statement signed: the provenance statement, its subjects every file."""
    subjects = [
        provenance.Subject(path=rel, sha256=sha256_file(folder / rel))
        for rel in release_files(folder)
    ]
    statement = provenance.statement(m, subjects)
    return json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()


@contextlib.contextmanager
def _key_store_said(folder: Path, key: SigningKey) -> Iterator[None]:
    """A signer's own failure, after the probe passed (a token pulled), said in one line;
    a keyless job's fresh token refused is said as loading says it."""
    try:
        yield
    except SignatureError:
        raise
    except Exception as exc:
        raise SignatureError(
            f"{folder / ENVELOPE_FILE}: the key {key.keyid[:16]} could not sign: "
            f"{_backend_said(exc)}"
        ) from None


def sign(folder: Path, m: Manifest, key: SigningKey) -> Path:
    """The DSSE envelope of ``folder`` (every file in it now), written beside them; for a
    key (not keyless: openssl cannot check a Sigstore identity) first ``SHA256SUMS`` and
    its signature alone (raw bytes), which the envelope then vouches for too. Only the
    signer's calls are said as the key's failure (a full disk is the disk's)."""
    with _key_store_said(folder, key):
        signer = signer_now(key)
    if not key.identity:
        sums = sums_text(folder).encode()
        with _key_store_said(folder, key):
            signature = signer.sign(sums)
        (folder / SUMS_FILE).write_bytes(sums)
        (folder / SUMS_SIGNATURE_FILE).write_bytes(bytes.fromhex(signature.signature))
    envelope = dsse.Envelope(statement_bytes(folder, m), PAYLOAD_TYPE, {})
    with _key_store_said(folder, key):
        envelope.sign(signer)
    path = folder / ENVELOPE_FILE
    path.write_text(json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def verify(folder: Path, key: Key, signer: str) -> list[str]:
    """Check a received release: the envelope signed by ``key`` (a public key file's,
    or a keyless identity's: :mod:`kiln.release.keyless`; ``signer`` names it), each
    subject's digest, the recipes against the manifest, nothing unnamed. Returns the
    files it vouches for; raises :class:`SignatureError` naming the file and what is
    wrong."""
    link = first_link(folder)
    if link is not None:
        raise SignatureError(
            f"{link}: a symbolic link in the release folder: a release holds none (what it "
            f"points at is not signed, and may be anywhere): remove it, or download the "
            f"release again"
        )
    path = folder / ENVELOPE_FILE
    if not path.is_file():
        raise SignatureError(
            f"{path}: no signature envelope: this release is unsigned (build it with "
            "--sign KEY-URI), or the envelope was not copied with it"
        )
    try:
        envelope = dsse.Envelope.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"{path}: not a DSSE envelope: {exc}") from None
    if key.keytype == KEYLESS_KEYTYPE:
        try:
            import sigstore.verify  # noqa: F401  (what checks a keyless signature)
        except ImportError:
            raise SignatureError(
                f"{path}: checking a keyless signature ({signer}) needs the sigstore "
                f"library, which is not installed: pip install 'kiln[sigstore]', then "
                f"check again (without it no keyless signature can be told from a forgery)"
            ) from None
    if not _signed_by(envelope, key):
        said = ", ".join(s.keyid[:16] for s in envelope.signatures.values()) or "none"
        raise SignatureError(
            f"{path}: not signed by {signer} (keyid {key.keyid[:16]}; the "
            f"envelope's signatures: {said}), or its payload was changed after signing"
        )
    if envelope.payload_type != PAYLOAD_TYPE:
        raise SignatureError(f"{path}: payload type {envelope.payload_type!r}, not in-toto")
    statement: dict[str, Any] = json.loads(envelope.payload)
    named = _check_subjects(folder, statement)
    _check_recipes(folder, statement)
    unnamed = sorted(set(release_files(folder)) - named)
    if unnamed:
        raise SignatureError(
            f"{folder / unnamed[0]}: in the release folder but not signed (no subject of "
            f"{ENVELOPE_FILE} names it){_more(unnamed)}: remove it, or sign the release again"
        )
    return sorted(named)


def _signed_by(envelope: dsse.Envelope, key: Key) -> bool:
    """Whether a signature of ``envelope`` checks against ``key``, whatever keyid it
    names: the keyid is an unsigned hint (outside DSSE's signed bytes), so a changed
    one decides nothing, as for the shipped standard-library checker (the two
    disagreed: one refused a changed hint, the other passed it). A keyless identity's
    keyid is its own (the identity's hash): a signature naming another is not its, and
    is not sent to Sigstore to be checked."""
    if key.keytype == KEYLESS_KEYTYPE:
        try:
            envelope.verify([key], 1)
            return True
        except VerificationError:
            return False
    for sig in list(envelope.signatures.values()):
        one = dsse.Envelope(
            envelope.payload,
            envelope.payload_type,
            {key.keyid: Signature(key.keyid, sig.signature, dict(sig.unrecognized_fields))},
        )
        try:
            one.verify([key], 1)
            return True
        except VerificationError:
            continue
    return False


def _more(items: list[str]) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _check_subjects(folder: Path, statement: dict[str, Any]) -> set[str]:
    named: set[str] = set()
    for subject in statement.get("subject") or []:
        rel = str(subject.get("name", ""))
        want = (subject.get("digest") or {}).get("sha256")
        target = folder / rel
        if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts or not target.is_file():
            raise SignatureError(f"{target}: signed, but missing from the release folder")
        have = sha256_file(target)
        if have != want:
            raise SignatureError(
                f"{target}: changed after signing (sha256 {have[:16]}..., the signature "
                f"vouches for {str(want)[:16]}...): do not install it"
            )
        named.add(rel)
    return named


def _check_recipes(folder: Path, statement: dict[str, Any]) -> None:
    """The statement's recipes are the manifest's (the manifest is a subject too: this
    says the signed statement and the manifest describe one build)."""
    manifest_file = folder / MANIFEST_FILE
    try:
        data = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as exc:
        raise SignatureError(f"{manifest_file}: unreadable: {exc}") from None
    recipes = {n: v.get("recipe") for n, v in (data.get("vendors") or {}).items()}
    params = statement.get("predicate", {}).get("buildDefinition", {})
    signed = params.get("internalParameters", {}).get("recipes")
    if signed != recipes:
        raise SignatureError(
            f"{manifest_file}: its recipes are not the signed statement's: the manifest "
            "and the envelope describe different builds"
        )
