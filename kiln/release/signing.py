"""A release signed, and checked by whoever receives it (issue 43).

What is signed: the release's provenance statement (an in-toto Statement, SLSA v1
predicate, :mod:`kiln.release.provenance`) whose subjects are *every file* of the release
folder with its sha256 (wheels, variant wheels, tarballs, install.sh, the SBOM, the
manifest, the README...), in a DSSE envelope beside them (:data:`ENVELOPE_FILE`), signed
through securesystemslib's signer interface (one library for every kind of key):

- ``file:PATH`` (or a bare path): a PEM private key file (PKCS#8; Ed25519, ECDSA, RSA);
- ``env:VAR``: the same PEM in an environment variable (a CI secret);
- any other securesystemslib signer URI (``file2:``, ``gcpkms:``, ``awskms:``,
  ``azurekms:``, ``hsm:``, ``sigstore:``) with its public key in ``$KILN_SIGN_PUBKEY``
  (a PEM file), resolved by ``Signer.from_priv_key_uri``.

With an Ed25519 key signing is deterministic: the same release and key give the same
envelope, byte for byte. Checking (:func:`verify`): the envelope's signature by the
given public key, every subject's digest against its file, the statement's recipes
against the manifest, and no file in the folder that no subject names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import (
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib import dsse
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, Signer, SSlibKey

from kiln.errors import SignatureError
from kiln.fsutil import sha256_file
from kiln.release import provenance
from kiln.release.manifest import FILE_NAME as MANIFEST_FILE
from kiln.release.manifest import Manifest

ENVELOPE_FILE = "provenance.intoto.dsse.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PUBKEY_ENV = "KILN_SIGN_PUBKEY"  # the public key of a signer kiln cannot derive it from


@dataclass(frozen=True)
class SigningKey:
    """A signer and what the README says of it."""

    signer: Signer
    keyid: str
    scheme: str


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
    else:
        pub = os.environ.get(PUBKEY_ENV)
        if not pub:
            raise SignatureError(
                f"--sign {uri}: a signer URI needs its public key: set ${PUBKEY_ENV} to its "
                "PEM file"
            )
        try:
            signer = Signer.from_priv_key_uri(uri, public_key(Path(pub)))
        except SignatureError:
            raise
        except Exception as exc:  # the signer library's own, whatever the backend
            raise SignatureError(f"--sign {uri}: {type(exc).__name__}: {exc}") from None
    key = signer.public_key
    return SigningKey(signer, key.keyid, key.scheme)


def release_files(folder: Path) -> Iterator[str]:
    """Every file of a release folder but the envelope (sorted, ``/``-relative)."""
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != ENVELOPE_FILE:
            yield rel


def statement_bytes(folder: Path, m: Manifest) -> bytes:
    """The statement signed: the provenance statement, its subjects every file."""
    subjects = [{"path": rel, "sha256": sha256_file(folder / rel)} for rel in release_files(folder)]
    statement = provenance.statement(m, subjects)
    return json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()


def sign(folder: Path, m: Manifest, key: SigningKey) -> Path:
    """The DSSE envelope of ``folder`` (every file in it now), written beside them."""
    envelope = dsse.Envelope(statement_bytes(folder, m), PAYLOAD_TYPE, {})
    envelope.sign(key.signer)
    path = folder / ENVELOPE_FILE
    path.write_text(json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def verify(folder: Path, pubkey: Path, required: bool = True) -> list[str]:
    """Check a received release: the envelope signed by ``pubkey``, each subject's
    digest, the recipes against the manifest, nothing unnamed. Returns the files it
    vouches for; raises :class:`SignatureError` naming the file and what is wrong."""
    key = public_key(pubkey)
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
    try:
        envelope.verify([key], 1)
    except VerificationError:
        said = ", ".join(s.keyid[:16] for s in envelope.signatures.values()) or "none"
        raise SignatureError(
            f"{path}: not signed by the key {pubkey} (keyid {key.keyid[:16]}; the "
            f"envelope's signatures: {said}), or its payload was changed after signing"
        ) from None
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
