"""Provenance beside the manifest: an in-toto Statement with a SLSA v1 provenance
predicate (subjects: every output's digest; resolved dependencies: source commits,
submodules, patches, the image) and a CycloneDX SBOM of what went into the outputs.
Both are made by maintained libraries (in-toto-attestation, cyclonedx-python-lib) and
deterministic (no clock, serial number derived from the manifest), so ``verify``
compares them like any other file."""

from __future__ import annotations

import datetime
import hashlib
import json
import uuid
from typing import Any, TypedDict

from cyclonedx.model import (
    ExternalReference,
    ExternalReferenceType,
    HashAlgorithm,
    HashType,
    Property,
    XsUri,
)
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import LicenseExpression
from cyclonedx.output import make_outputter
from cyclonedx.schema import OutputFormat, SchemaVersion
from google.protobuf.json_format import MessageToDict
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from kiln import __version__
from kiln.release.manifest import Manifest

SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/kiln-build/kiln/buildtypes/release/v1"
PROVENANCE_FILE = "provenance.intoto.json"
SBOM_FILE = "sbom.cdx.json"


class Subject(TypedDict):
    """A file the statement vouches for, by its path in the release."""

    path: str
    sha256: str


def _rd(**kw: Any) -> dict[str, object]:
    rd: dict[str, object] = MessageToDict(ResourceDescriptor(**kw).pb)
    return rd


def _materials(m: Manifest) -> list[dict[str, object]]:
    out = []
    for name, v in m.vendors.items():
        src = v.source
        out.append(
            _rd(name=name, uri=f"git+{src.url}@{src.commit}", digest={"gitCommit": src.commit})
        )
        for sub in src.submodules:
            out.append(
                _rd(
                    name=f"{name}/{sub.path}",
                    uri=f"git+{sub.url}@{sub.commit}",
                    digest={"gitCommit": sub.commit},
                )
            )
        for p in v.patches:
            out.append(_rd(name=f"patches/{p.file}", digest={"sha256": p.sha256}))
    image = m.runner.image
    if image and "@sha256:" in image:
        out.append(
            _rd(name="builder-base-image", uri=image, digest={"sha256": image.split("@sha256:")[1]})
        )
    return out


def statement(m: Manifest, subjects: list[Subject]) -> dict[str, object]:
    tc = m.toolchain.data()
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"release": m.release.name, "profile": m.profile.data()},
            "internalParameters": {
                "runner": m.runner.kind,
                "toolchain": {
                    k: tc[k]
                    for k in (
                        "nvcc_version",
                        "gcc_version",
                        "python_version",
                        "torch_version",
                        "torch_cuda",
                        "torch_cxx11_abi",
                    )
                },
                "recipes": {n: v.recipe for n, v in m.vendors.items()},
            },
            "resolvedDependencies": _materials(m),
        },
        "runDetails": {"builder": {"id": f"kiln/{__version__}"}},
    }
    subj = [ResourceDescriptor(name=s["path"], digest={"sha256": s["sha256"]}).pb for s in subjects]
    st = Statement(subj, SLSA_PROVENANCE, predicate)
    st.validate()
    statement: dict[str, object] = MessageToDict(st.pb)
    return statement


def sbom(m: Manifest, subjects: list[Subject]) -> str:
    components = []
    for name, v in m.vendors.items():
        src = v.source
        lic = [LicenseExpression(src.license_id)] if src.license_id else []
        subs = [
            Component(
                name=f"{name}/{s.path}",
                version=s.commit,
                type=ComponentType.LIBRARY,
                bom_ref=f"{name}/{s.path}",
                licenses=[LicenseExpression(s.license_id)] if s.license_id else [],
                properties=[Property(name="kiln:license-file", value=s.license_file)]
                if s.license_file
                else [],
                external_references=[
                    ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(s.url))
                ],
            )
            for s in src.submodules
        ]
        components.append(
            Component(
                name=name,
                version=src.commit,
                type=ComponentType.LIBRARY,
                bom_ref=name,
                licenses=lic,
                components=subs,
                external_references=[
                    ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(src.url))
                ],
                properties=[
                    Property(name=f"kiln:patch:{p.file}", value=p.sha256) for p in v.patches
                ],
            )
        )
    for s in subjects:
        components.append(
            Component(
                name=s["path"],
                type=ComponentType.FILE,
                bom_ref=f"file:{s['path']}",
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=s["sha256"])],
            )
        )
    epoch = max((v.source.commit_time for v in m.vendors.values()), default=0)
    serial = uuid.uuid5(
        uuid.NAMESPACE_URL,
        hashlib.sha256(json.dumps(subjects, sort_keys=True).encode()).hexdigest(),
    )
    # Every bom-ref is given: the library would otherwise make random ones.
    root = Component(
        name=m.release.name,
        type=ComponentType.APPLICATION,
        bom_ref=f"release:{m.release.name}",
    )
    bom = Bom(
        components=components,
        serial_number=serial,
        metadata=BomMetaData(
            timestamp=datetime.datetime.fromtimestamp(epoch, datetime.UTC), component=root
        ),
    )
    bom.register_dependency(root, components)
    text = make_outputter(bom, OutputFormat.JSON, SchemaVersion.V1_6).output_as_string(indent=2)
    return text + "\n"


def subjects_of(m: Manifest) -> list[Subject]:
    """The outputs the statements cover: wheels and tarballs (the things users run)."""
    return [
        Subject(path=o.path, sha256=o.sha256)
        for v in m.vendors.values()
        for o in v.outputs_of("wheel", "tarball")
    ]
