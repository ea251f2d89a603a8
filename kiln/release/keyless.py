"""Sigstore's keyless signing (``--sign sigstore:``), where the CI gives an identity token.

No key is kept anywhere: the release workflow's job (GitHub Actions, with
``permissions: id-token: write``) gets an OIDC identity token, Fulcio certifies a
short-lived key for that identity, and the signature is logged in Rekor. What the
receiver checks is therefore an *identity*, not a key file: the workflow that signed
(``https://github.com/OWNER/REPO/.github/workflows/release.yml@refs/heads/main``) and
the token's issuer. securesystemslib models it as a ``SigstoreKey`` whose keyid is the
hash of that identity and issuer, so the envelope, the manifest's ``signed_by`` and the
checks are those of any other key.

The token is taken when the signer is loaded (the build's first stage), so a job
without one stops before it compiles. Signing and checking a keyless signature need the
``sigstore`` library (``pip install 'kiln[sigstore]'``) and Sigstore's public services;
neither is reachable from kiln's test machines, which check everything up to Fulcio
(docs/signing.md says what is and is not tested).
"""

from __future__ import annotations

import os

from securesystemslib.exceptions import UnsupportedLibraryError
from securesystemslib.signer import Key, Signer, SigstoreSigner

from kiln.errors import SignatureError
from kiln.inside.kit import contract

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
IDENTITY_ENV = contract.SIGN_IDENTITY
ISSUER_ENV = contract.SIGN_ISSUER
EXAMPLE = "https://github.com/OWNER/REPO/.github/workflows/release.yml@refs/heads/main"


def identity_key(identity: str, issuer: str = GITHUB_ISSUER) -> Key:
    """The key a keyless signature by ``identity`` is checked with (no network)."""
    return SigstoreSigner.import_(identity, issuer)[1]


def described(key: Key) -> str:
    """``identity (issuer)`` of a keyless key, for the README and the manifest."""
    return f"{key.keyval['identity']} ({key.keyval['issuer']})"


def signer_identity(uri: str) -> tuple[str, str]:
    """(identity, issuer) this job signs as: ``$KILN_SIGN_IDENTITY``, else on GitHub
    Actions the running workflow (``$GITHUB_WORKFLOW_REF``)."""
    identity = os.environ.get(IDENTITY_ENV)
    if not identity and os.environ.get("GITHUB_WORKFLOW_REF"):
        identity = f"https://github.com/{os.environ['GITHUB_WORKFLOW_REF']}"
    if not identity:
        raise SignatureError(
            f"--sign {uri}: whose keyless signature is it? set ${IDENTITY_ENV} to the "
            f"signing workflow's identity ({EXAMPLE}); on GitHub Actions it is the running "
            "workflow's"
        )
    return identity, os.environ.get(ISSUER_ENV) or GITHUB_ISSUER


def load(uri: str) -> Signer:
    """The keyless signer, its identity token taken now; one line naming the fix."""
    identity, issuer = signer_identity(uri)
    try:
        return SigstoreSigner.from_priv_key_uri(uri, identity_key(identity, issuer))
    except UnsupportedLibraryError:
        raise SignatureError(
            f"--sign {uri}: keyless signing needs the sigstore library: pip install "
            "'kiln[sigstore]'"
        ) from None
    except Exception as exc:  # id's and sigstore's own: no token, another issuer
        name = type(exc).__name__
        if "insufficient OIDC token permissions" in str(exc):  # id's, through sigstore
            fix = "give the job `permissions: id-token: write` (ci/release.yml's release job)"
        elif "Failed to detect Sigstore credentials" in str(exc):
            fix = (
                "no identity token here: keyless signing runs where the CI gives one "
                "(GitHub Actions with id-token: write); elsewhere sign with a key "
                "(--sign file:KEY.pem)"
            )
        else:
            fix = f"{name}: {exc}"
        raise SignatureError(f"--sign {uri}: {fix}") from None
