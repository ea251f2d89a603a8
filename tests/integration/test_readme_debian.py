"""The README's first command, as written, in a clean container made from Debian's own
packages (debootstrap bookworm plus exactly the README's ``apt-get install`` line: no
pyenv, the system Python that refuses ``pip install`` outside a venv, PEP 668).

The container reaches PyPI through the host network; this machine's local package index
(``/opt/pypi``, where torch is served from disk) and the CA bundle its pip trusts (a
TLS-intercepting proxy's) are mounted read-only where the host has them, as pip would use
them there. Ubuntu 24.04 cannot be tested here (no image can be
pulled), so only Debian 12 is."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import dockerimage
from tests.conftest import REPO

README = REPO / "README.md"
CA_VARIABLES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
LOCAL_INDEXES = [p for p in ("/opt/pypi", "/opt/pypi-more", "/opt/wheels") if Path(p).is_dir()]


def readme_lines() -> tuple[str, str]:
    """(the apt-get line, the first command) as the README's quick start spells them."""
    text = README.read_text()
    apt = re.search(r"^(apt-get install -y [^#\n]+?)\s*(#.*)?$", text, re.M)
    first = re.search(r"^(python3 -m venv .+?)\s+# set up", text, re.M)
    assert apt and first, "README.md: the quick start's apt-get line or first command is missing"
    return apt.group(1), first.group(1)


def test_readme_names_one_setup_line_and_the_test_command() -> None:
    apt, first = readme_lines()
    assert "python3-venv" in apt and first.startswith("python3 -m venv .venv && ")
    assert re.search(r"^\.venv/bin/nox -s tests\s+# the test suite", README.read_text(), re.M)
    assert ".venv/bin/nox -s tests" in (REPO / ".ci" / "run").read_text()


def _image(client, apt: str) -> str:
    base = dockerimage.ensure_base(client)
    layer = (
        f"FROM {base}\n"
        f"RUN apt-get update && DEBIAN_FRONTEND=noninteractive "
        f"{apt.replace('apt-get install -y', 'apt-get install -y --no-install-recommends')} "
        f"&& rm -rf /var/lib/apt/lists/*\n"
    )
    tag = "kiln-test-readme:" + dockerimage.digest(layer)
    try:
        client.images.get(tag)
    except Exception:  # docker.errors.ImageNotFound
        client.images.build(
            fileobj=io.BytesIO(layer.encode()), tag=tag, network_mode="host", rm=True, pull=False
        )
    return tag


def _tracked_copy(dest: Path) -> None:
    """The checkout as a clone would have it (tracked and untracked-not-ignored files)."""
    files = subprocess.run(
        ["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, files):
        src = REPO / rel.decode()
        if src.is_file():
            target = dest / rel.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
            target.chmod(src.stat().st_mode & 0o777)


# What pip prints when PyPI's connection failed mid-download (no retry for a cut body).
# The container's venvs have Debian 12's pip 23.0.1, which does not notice a body cut
# short: a locked file then fails its hash (tests/unit/test_import_proof.py holds its
# output); the lock is checked on this machine, so there it is the network too.
NETWORK_FLAKE = re.compile(
    r"ReadTimeoutError|IncompleteRead|ProtocolError|Connection (?:reset|aborted|broken)"
    r"|HTTPSConnectionPool|Temporary failure in name resolution|DO NOT MATCH THE HASHES"
)


def _run_once(
    client, image: str, script: str, volumes: dict, env: dict, checkout: Path, deadline: float
) -> tuple[int, str]:
    """One run of the script in a fresh container: (exit code, its output and the tails
    of the logs a failure names, which live in the copy)."""
    # created, then started in the try: a container that cannot start is removed too
    container = client.containers.create(
        image,
        ["bash", "-c", script],
        volumes=volumes,
        environment=env,
        network_mode="host",
        # a fresh machine, not an unprivileged container: there bubblewrap (the README's
        # first command installs it) can make the namespaces that keep steps off the network.
        # Not privileged=True: that asks for every capability, and a host that is itself a
        # container may lack some (runc: "unable to apply caps"); these are what it needs.
        cap_add=["SYS_ADMIN", "NET_ADMIN"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        labels={"kiln": "readme-test"},
    )
    try:
        container.start()
        rc = container.wait(timeout=max(60, deadline - time.monotonic()))["StatusCode"]
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
        # the container ran as root: give the copy back to the test's user for cleanup
        subprocess.run(["chmod", "-R", "u+rwX", str(checkout)], check=False)
    named = dict.fromkeys(re.findall(r"full log: /src/(\S+?\.log)", logs)) if rc else {}
    for rel in named:
        log = checkout / rel
        if log.is_file():
            logs += f"\n--- {rel} (last lines)\n" + log.read_text(errors="replace")[-1500:]
    return rc, logs


@pytest.mark.timeout(1800)  # the containers (one, or two after a network flake) share 1700 s
def test_first_command_passes_in_a_debian_only_container(client, tmp_path: Path) -> None:
    apt, first = readme_lines()
    image = _image(client, apt)
    checkout = tmp_path / "kiln"
    _tracked_copy(checkout)
    volumes = {str(checkout): {"bind": "/src", "mode": "rw"}}
    volumes |= {p: {"bind": p, "mode": "ro"} for p in LOCAL_INDEXES}
    env = {
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_DEFAULT_TIMEOUT": os.environ.get("PIP_DEFAULT_TIMEOUT", "180"),
    }
    if "/opt/pypi" in LOCAL_INDEXES:
        env["PIP_EXTRA_INDEX_URL"] = " ".join(
            f"file://{p}/simple" for p in LOCAL_INDEXES if p != "/opt/wheels"
        )
    if "/opt/wheels" in LOCAL_INDEXES:
        env["PIP_FIND_LINKS"] = "/opt/wheels"
    # a TLS-intercepting proxy's CA, where this machine's pip trusts one: the same there
    for var in CA_VARIABLES:
        bundle = os.environ.get(var)
        if bundle and Path(bundle).is_file():
            env[var] = bundle
            volumes[bundle] = {"bind": bundle, "mode": "ro"}
    script = (
        "set -e; cd /src; "
        # the system Python is externally managed (PEP 668): pip outside a venv is refused
        "ls /usr/lib/python3*/EXTERNALLY-MANAGED >/dev/null; "
        "! command -v pyenv; "
        f"{first}"
    )
    deadline = time.monotonic() + 1700
    rc, logs = _run_once(client, image, script, volumes, env, checkout, deadline)
    if rc and NETWORK_FLAKE.search(logs):
        # PyPI from inside a container dropped a download (pip does not retry a body cut
        # short): the network's failure, not kiln's; once more, on what is already made
        rc, logs = _run_once(client, image, script, volumes, env, checkout, deadline)
    made = (checkout / "artifacts/kiln-demo/manifest.json").is_file()
    # the copy now holds a torch venv and CUDA (gigabytes): not left for the whole run
    shutil.rmtree(checkout, ignore_errors=True)
    assert rc == 0, logs[-8000:]
    assert "release ready" in logs and made
