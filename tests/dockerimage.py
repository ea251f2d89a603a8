"""The tests' builder-like base image, made locally (no registry is reachable):
a ``debootstrap --variant=minbase bookworm`` root imported with docker-py, plus a
layer with Python, a C++ compiler, git and ccache, built with docker-py on the host network.
The CUDA toolkit is not in it: tests bind-mount the host's, read-only. Tagged by a
content hash of this recipe and reused across test runs."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

import docker

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
LAYER = """\
FROM {base}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3 python3-dev python3-pip python3-setuptools python3-wheel g++ git \\
      ca-certificates ccache \\
 && rm -rf /var/lib/apt/lists/*
"""
BASE_KEY = hashlib.sha256(f"{SUITE} {MIRROR} minbase".encode()).hexdigest()[:12]
BASE_TAG = f"kiln-test-base:{BASE_KEY}"
IMAGE_TAG = f"kiln-test-builder:{hashlib.sha256((BASE_KEY + LAYER).encode()).hexdigest()[:12]}"


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _import_rootfs(client: docker.DockerClient) -> None:
    with tempfile.TemporaryDirectory(prefix="kiln-rootfs-") as tmp:
        root = Path(tmp) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", SUITE, str(root), MIRROR],
            check=True,
            capture_output=True,
        )
        tarball = Path(tmp) / "root.tar"
        with tarfile.open(tarball, "w") as tar:
            tar.add(root, arcname=".")
        repo, tag = BASE_TAG.split(":")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=tag)


def digest(text: str) -> str:
    return hashlib.sha256((BASE_KEY + text).encode()).hexdigest()[:12]


def ensure_base(client: docker.DockerClient) -> str:
    """The bare debootstrap root's tag (Debian's packages only), imported once."""
    if not _exists(client, BASE_TAG):
        _import_rootfs(client)
    return BASE_TAG


def ensure(client: docker.DockerClient) -> str:
    """The test builder image's tag, made once per recipe."""
    if _exists(client, IMAGE_TAG):
        return IMAGE_TAG
    ensure_base(client)
    dockerfile = io.BytesIO(LAYER.format(base=BASE_TAG).encode())
    client.images.build(fileobj=dockerfile, tag=IMAGE_TAG, network_mode="host", rm=True, pull=False)
    return IMAGE_TAG


def with_packages(client: docker.DockerClient, packages: list[str]) -> str:
    """The test builder image with Debian's ``packages`` installed on top (a layer of
    ``apt-get install``, as a fix that names the package asks of a builder image), made
    once per list."""
    layer = (
        f"FROM {ensure(client)}\nRUN apt-get update \\\n"
        f" && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        f"{' '.join(sorted(packages))} \\\n && rm -rf /var/lib/apt/lists/*\n"
    )
    tag = f"kiln-test-builder-plus:{digest(layer)}"
    if not _exists(client, tag):
        client.images.build(
            fileobj=io.BytesIO(layer.encode()), tag=tag, network_mode="host", rm=True, pull=False
        )
    return tag
