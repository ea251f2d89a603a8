"""verify-release.py: check this release against its signature, with Python's standard
library alone (no kiln, nothing installed): install.sh runs it first when given the
signer's public key (KILN_RELEASE_PUBKEY, or --pubkey).

    python3 verify-release.py RELEASE_DIR PUBKEY.pem

Checks the DSSE envelope provenance.intoto.dsse.json: its signature by the Ed25519 key
PUBKEY.pem (RFC 8032's verification, written out below), each signed file's sha256,
that the statement's recipes are the manifest's, and that no file in the folder is
unsigned (but the Hub client's: .gitattributes, .cache/huggingface/). Exit 0 when all
hold; else one line naming the file and what is wrong, exit 19
(kiln's SignatureError). Other key types: `kiln verify-release` checks them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ENVELOPE = "provenance.intoto.dsse.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
# An Ed25519 SubjectPublicKeyInfo is this DER prefix and the 32-byte key (RFC 8410).
ED25519_SPKI = bytes.fromhex("302a300506032b6570032100")
# Files a release downloaded from the Hub holds that no release has (the Hub repository's
# own, and `hf download --local-dir`'s records): passed by name, as kiln passes them.
HUB_CLIENT_FILES = (".gitattributes",)
HUB_CLIENT_FOLDER = ".cache/huggingface"

# Ed25519 (RFC 8032, section 5.1): the curve, its base point, and verification in
# extended coordinates.
P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)
Point = tuple[int, int, int, int]


def _add(a: Point, b: Point) -> Point:
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa = (y1 - x1) * (y2 - x2) % P
    bb = (y1 + x1) * (y2 + x2) % P
    cc = t1 * 2 * D * t2 % P
    dd = z1 * 2 * z2 % P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _mul(s: int, point: Point) -> Point:
    out: Point = (0, 1, 1, 0)
    while s:
        if s & 1:
            out = _add(out, point)
        point = _add(point, point)
        s >>= 1
    return out


def _equal(a: Point, b: Point) -> bool:
    return (a[0] * b[2] - b[0] * a[2]) % P == 0 and (a[1] * b[2] - b[1] * a[2]) % P == 0


def _x(y: int, sign: int) -> int | None:
    if y >= P:
        return None
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P:
        return None
    return P - x if (x & 1) != sign else x


def _point(data: bytes) -> Point | None:
    if len(data) != 32:
        return None
    y = int.from_bytes(data, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _x(y, sign)
    return None if x is None else (x, y, 1, x * y % P)


_GY = 4 * pow(5, P - 2, P) % P
_BASE: Point = (_x(_GY, 0) or 0, _GY, 1, (_x(_GY, 0) or 0) * _GY % P)


def ed25519_verify(public: bytes, message: bytes, signature: bytes) -> bool:
    a = _point(public)
    r = _point(signature[:32]) if len(signature) == 64 else None
    if a is None or r is None:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= L:
        return False
    h = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little") % L
    return _equal(_mul(s, _BASE), _add(r, _mul(h, a)))


class Refused(Exception):
    """One line: the file and what is wrong."""


def _public_key(path: Path) -> bytes:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"{path}: cannot read the public key: {exc}") from None
    body = "".join(line for line in text.splitlines() if line and not line.startswith("-----"))
    try:
        der = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        der = b""
    if "BEGIN PUBLIC KEY" not in text or len(der) != 44 or not der.startswith(ED25519_SPKI):
        raise Refused(
            f"{path}: not an Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----): this "
            "check reads Ed25519 keys; `kiln verify-release` checks the others"
        )
    return der[len(ED25519_SPKI) :]


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature signs."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _sha256(path: Path) -> str:
    # kiln.fsutil.sha256_file's twin: this script runs where no kiln is installed
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check(folder: Path, pubkey: Path) -> int:
    """The files the signature vouches for (all of the folder's but the envelope)."""
    key = _public_key(pubkey)
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in sorted(dirs + files):
            if os.path.islink(os.path.join(top, name)):
                raise Refused(
                    f"{Path(top) / name}: a symbolic link in the release folder: a release "
                    f"holds none: remove it, or download the release again"
                )
    path = folder / ENVELOPE
    if not path.is_file():
        raise Refused(f"{path}: no signature envelope: this release is unsigned")
    try:
        envelope: dict[str, Any] = json.loads(path.read_text())
        payload = base64.b64decode(envelope["payload"])
        payload_type = str(envelope["payloadType"])
        signatures = [base64.b64decode(s["sig"]) for s in envelope["signatures"]]
    except (OSError, ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise Refused(f"{path}: not a DSSE envelope: {exc}") from None
    message = _pae(payload_type, payload)
    if not any(ed25519_verify(key, message, sig) for sig in signatures):
        raise Refused(
            f"{path}: not signed by the key {pubkey}, or its payload was changed after signing"
        )
    if payload_type != PAYLOAD_TYPE:
        raise Refused(f"{path}: payload type {payload_type!r}, not in-toto")
    statement = json.loads(payload)
    named = set()
    for subject in statement.get("subject") or []:
        rel = str(subject.get("name", ""))
        target = folder / rel
        if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts or not target.is_file():
            raise Refused(f"{target}: signed, but missing from the release folder")
        if _sha256(target) != (subject.get("digest") or {}).get("sha256"):
            raise Refused(f"{target}: changed after signing: do not install it")
        named.add(rel)
    manifest = json.loads((folder / "manifest.json").read_text())
    recipes = {n: v.get("recipe") for n, v in (manifest.get("vendors") or {}).items()}
    signed = statement.get("predicate", {}).get("buildDefinition", {})
    if signed.get("internalParameters", {}).get("recipes") != recipes:
        raise Refused(f"{folder / 'manifest.json'}: its recipes are not the signed statement's")
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    unnamed = sorted(
        rel
        for rel in present - named - {ENVELOPE}
        if rel not in HUB_CLIENT_FILES and not rel.startswith(HUB_CLIENT_FOLDER + "/")
    )
    if unnamed:
        raise Refused(f"{folder / unnamed[0]}: in the release folder but not signed")
    return len(named)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: python3 verify-release.py RELEASE_DIR PUBKEY.pem\n")
        return 2
    try:
        count = check(Path(argv[1]), Path(argv[2]))
    except Refused as exc:
        sys.stderr.write(f"verify-release: {exc}\n")
        return 19
    sys.stdout.write(f"verify-release: {count} files checked against {ENVELOPE}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
