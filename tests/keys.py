"""Real signing keys for tests, made by openssl (issue 43): never committed."""

from __future__ import annotations

import subprocess
from pathlib import Path


def keypair(folder: Path, name: str, algorithm: str = "ed25519") -> tuple[Path, Path]:
    """(private PEM, public PEM) of a new key: Ed25519, ``ec`` (ECDSA P-256) or ``rsa``
    (RSA 3072)."""
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    args = ["-algorithm", "ed25519"]
    if algorithm == "ec":
        args = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    if algorithm == "rsa":
        args = ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:3072"]
    subprocess.run(
        ["openssl", "genpkey", *args, "-out", str(private)], check=True, capture_output=True
    )
    subprocess.run(
        ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)],
        check=True,
        capture_output=True,
    )
    return private, public
