"""The release's README.md, written from the manifest (never by hand), in the spirit
of the model card: what is inside, the pinned commits, how it was built, how to install."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from kiln.config.workspace import README_MARKER, README_SECTIONS
from kiln.errors import ConfigError
from kiln.release import signing
from kiln.release.manifest import JitCacheInfo, Manifest, Output, ReleaseInfo


def _archs(output: Output) -> str:
    archs = sorted({a for o in output.shared_objects or [] for a in o.sass})
    return ", ".join(archs) or "no device code"


def verified_archs(m: Manifest) -> list[str]:
    """The archs the release's outputs carry, read from their SASS when they were
    verified: what the README says it is for (the profile's list is what was asked; an
    upstream that hard-codes its own archs may build fewer)."""
    return sorted(
        {
            a
            for v in m.vendors.values()
            for o in v.outputs
            for so in o.shared_objects or []
            for a in so.sass
        }
    )


def _built_for(m: Manifest) -> str:
    """The summary's "for ...": the verified archs, and which output has fewer."""
    archs = verified_archs(m)
    if not archs:
        return "no GPU architecture (no output has device code)"
    fewer = [
        f"{o.path.split('/')[-1]}: {_archs(o)}"
        for v in m.vendors.values()
        for o in v.outputs
        if o.shared_objects and _archs(o) != ", ".join(archs) and o.kind in ("wheel", "tarball")
    ]
    said = ", ".join(archs) + " (read from the SASS of every output"
    return said + (f"; not all carry each: {'; '.join(fewer)})" if fewer else ")")


def _contents(m: Manifest) -> list[str]:
    rows = []
    wheels = [o for v in m.vendors.values() for o in v.outputs_of("wheel")]
    if wheels:
        listed = "; ".join(f"{o.name} {o.version} ({_archs(o)})" for o in wheels)
        platforms = sorted({t.split("-")[-1] for o in wheels for t in o.tags or []})
        rows.append(
            f"| wheels/ | {listed}; CUDA {m.profile.cuda}, "
            f"cp{m.profile.python.replace('.', '')}, {', '.join(platforms) or m.profile.platform} |"
        )
    variant_wheels = [f for f in m.files if f.kind == "variant-wheel"]
    if variant_wheels:
        rows.append(
            f"| wheels/*-LABEL.whl | The {len(variant_wheels)} CUDA wheels again as wheel "
            "variants (WheelNext): `nvidia :: sm_arch` the archs verified in their SASS, "
            "`nvidia :: cuda_version_lower_bound` the CUDA they were built with; "
            "`<name>-<version>-variants.json` indexes them |"
        )
    for name, v in m.vendors.items():
        for o in v.outputs_of("tarball"):
            so = ", ".join(s.path for s in o.shared_objects or [])
            n = len(v.patches)
            rows.append(
                f"| {o.path} | {name} {v.source.commit[:7]} built in place "
                f"({so}: {_archs(o)}), with the {n} patch{'es' if n != 1 else ''} "
                f"below applied |"
            )
    if any(v.outputs_of("patch") for v in m.vendors.values()):
        rows.append("| patches/ | The patches applied, also usable on a source checkout |")
    jit = [f for f in m.files if f.kind == "jit-cache"]
    if jit:
        rows.append(
            f"| jit-cache/ | Packed JIT kernel caches: "
            f"{', '.join(f.path.split('/')[-1] for f in jit)} |"
        )
    rows.append(
        "| install.sh | Builds a venv: requirements.txt, the wheels, and the trees built in place |"
    )
    if m.release.signed_by:
        rows.append(
            "| provenance.intoto.dsse.json | The signature: a DSSE envelope over the "
            "provenance statement, whose subjects are every file here |"
        )
        rows.append(
            "| verify-release.py | What install.sh runs to check every file against the "
            "signature (Python's standard library alone) |"
        )
    for f in m.files:
        if f.kind == "rebuild-script":
            rows.append(
                f"| {f.path} | Re-applies a patch to an installed tree and rebuilds "
                f"only its compiled extension (seconds; no GPU needed) |"
            )
        if f.kind == "build-script":
            rows.append(
                f"| {f.path} | The recipe used to build all of this from source on a "
                f"CPU-only machine, and the command that rebuilds it and compares every file |"
            )
    lic = [o.path.split("/")[-1] for v in m.vendors.values() for o in v.outputs_of("license")]
    rows.append(f"| licenses/ | {', '.join(lic)} |")
    rows.append("| manifest.json | Every input, the toolchain, and every file's sha256 |")
    kinds = {f.kind for f in m.files}
    if "provenance" in kinds:
        rows.append(
            "| provenance.intoto.json | in-toto statement, SLSA v1 provenance: the outputs' "
            "digests, the source commits, patches and image they came from |"
        )
    if "sbom" in kinds:
        rows.append(
            "| sbom.cdx.json | CycloneDX SBOM of the upstreams, submodules, patches and outputs |"
        )
    return ["| Path | What |", "| --- | --- |", *rows]


def runtime_packages(m: Manifest) -> dict[str, str]:
    """soname -> system package of every recipe's ``build.runtime_libraries``."""
    return {
        r["soname"]: r["package"]
        for v in m.vendors.values()
        for r in v.recipe.get("runtime_libraries") or []
    }


def _jit_caches(release: ReleaseInfo, root: str) -> list[str]:
    """How to use a packed JIT cache: the caches and variables the workspace names."""
    caches: list[JitCacheInfo] = release.jit_caches
    if not caches:
        return []
    names = " and ".join(f"`{c.variable}`" for c in caches)
    exports = " ".join(f"{c.variable}={root}/jit-cache/{c.name}" for c in caches)
    return [
        "## JIT caches",
        "",
        "Optional, to skip most first-run kernel compilation: unpack a cache from `jit-cache/` "
        f"(`kiln pack-jit-cache` makes them from a GPU run) and point {names} at it:",
        "",
        "```sh",
        f"# tarfile's data filter refuses members that would land outside {root}",
        f"zstd -dc jit-cache/jit-cache-LABEL.tar.zst | {root}/venv/bin/python -c "
        '\'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|")'
        '.extractall(sys.argv[1], filter="data")\' ' + root,
        f"export {exports}",
        "```",
        "",
    ]


# SPDX ids the Hub's model-card `license` field also accepts (lowercased; its list,
# huggingface.co/docs/hub/repositories-licenses, names others its own way). Any other id or
# an expression is written as `license: other` with `license_name`: the Hub refuses a
# README whose `license` it does not know.
HUB_LICENSES = frozenset(
    {
        "afl-3.0",
        "agpl-3.0",
        "apache-2.0",
        "artistic-2.0",
        "bsd-2-clause",
        "bsd-3-clause",
        "bsd-3-clause-clear",
        "bsl-1.0",
        "cc-by-4.0",
        "cc-by-sa-4.0",
        "cc0-1.0",
        "ecl-2.0",
        "epl-1.0",
        "epl-2.0",
        "eupl-1.2",
        "gpl-2.0",
        "gpl-3.0",
        "isc",
        "lgpl-2.1",
        "lgpl-3.0",
        "mit",
        "mpl-2.0",
        "ms-pl",
        "ncsa",
        "ofl-1.1",
        "osl-3.0",
        "postgresql",
        "unlicense",
        "wtfpl",
        "zlib",
    }
)


def _licenses_used(m: Manifest) -> list[str]:
    ids = [v.source.license_id for v in m.vendors.values()]
    ids += [sub.license_id for v in m.vendors.values() for sub in v.source.submodules]
    return sorted({i for i in ids if i})


def front_matter(m: Manifest) -> dict[str, object]:
    """The Hub model card's metadata (its spec: huggingface.co/docs/hub/model-cards):
    license, tags."""
    p = m.profile
    used = _licenses_used(m)
    # No library_name: the Hub's card spec takes only libraries it knows (kiln is none).
    meta: dict[str, object] = {}
    one = used[0].lower() if len(used) == 1 else None
    if one in HUB_LICENSES and all(v.source.license_id for v in m.vendors.values()):
        meta["license"] = one
    else:
        # The Hub's spec: `license: other`, an id of the license (`license_name`: a slug,
        # not an SPDX expression) and `license_link` to a file of the repository.
        meta["license"] = "other"
        parts = [f"({u})" if " " in u and len(used) > 1 else u for u in used]
        expression = " AND ".join(parts) if used else "see-licenses"
        meta["license_name"] = re.sub(r"[^a-z0-9.]+", "-", expression.lower()).strip("-")
        files = sorted(o.path for v in m.vendors.values() for o in v.outputs_of("license"))
        # one license file: it; several: the README, whose Licenses section names each
        meta["license_link"] = files[0] if len(files) == 1 else "README.md"
    tags = ["kiln", "cuda", "kernels", "cu" + p.cuda.replace(".", "")]
    tags += verified_archs(m)
    if p.torch:
        tags.append("torch" + ".".join(p.torch.split("+")[0].split(".")[:2]))
    tags += [f"python{p.python}", *m.vendors]
    meta["tags"] = tags
    return meta


# The Hub's own pattern for a card's front matter (huggingface_hub.repocard).
FRONT_MATTER = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")


def template_parts(template: str) -> tuple[dict[str, object], str]:
    """A template's front matter (as the Hub's ``ModelCard`` reads it, metadata errors
    ignored) and the text after it. Not through ``ModelCard`` itself: importing
    ``huggingface_hub.repocard`` pulls in the Hub client (0.3-0.6 s, a quarter of a no-op
    build); its card data class alone is light."""
    from huggingface_hub.repocard_data import ModelCardData

    match = FRONT_MATTER.search(template)
    if not match:
        return {}, template
    data = yaml.safe_load(match.group(2)) or {}
    if not isinstance(data, dict):
        raise ConfigError("the README template's front matter is not a YAML mapping")
    card = ModelCardData(**data, ignore_metadata_errors=True)
    read: dict[str, object] = card.to_dict()
    return read, template[match.end() :]


def _yaml(meta: dict[str, object]) -> str:
    from huggingface_hub.repocard_data import ModelCardData

    # the card's keyword arguments are typed per key; the keys here are the card's own
    # (front_matter's, or a template's as ModelCardData read them)
    fields: Mapping[str, Any] = meta
    return ModelCardData(**fields).to_yaml()


def _sections(m: Manifest) -> dict[str, list[str]]:
    p, tc, release = m.profile, m.toolchain, m.release
    root = release.install_root or "/opt/kiln"
    repo = release.hub_repo or "ORG/NAME"
    sections: dict[str, list[str]] = {}
    proven = [o for v in m.vendors.values() for o in v.outputs if o.import_proof is not None]
    sections["summary"] = [
        f"Built by kiln {m.kiln_version} from pinned sources for "
        f"{_built_for(m)} with CUDA {p.cuda}, Python {p.python} and torch "
        f"{p.torch}. `manifest.json` lists every file here with its sha256; "
        f"check them with `python -m kiln manifest check manifest.json`."
        + (
            " Every wheel and tree was installed as install.sh installs it and each of "
            "its modules imported there before release (`import_proof` in the manifest)."
            if proven
            else ""
        ),
        "",
    ]
    sections["contents"] = [
        "## Contents",
        "",
        *_contents(m),
        "",
        "torch and the NVIDIA libraries are NOT included: install.sh installs them "
        "(requirements.txt).",
        "",
    ]
    system = runtime_packages(m)
    sections["install"] = [
        "## Install",
        "",
        "```sh",
        "# on the GPU node (Python "
        + p.python
        + ", a CUDA "
        + p.cuda.split(".")[0]
        + " toolkit with nvcc, zstd"
        + "".join(f", {pkg} ({soname})" for soname, pkg in system.items())
        + ")",
        f"hf download {repo} --local-dir {root}/release"
        + ("" if release.hub_repo else "   # ORG/NAME: the Hub repository it was published to"),
        *_install_lines(release, root),
        "```",
        "",
        *([_signed(release), ""] if release.signed_by else []),
    ]
    sections["jit-caches"] = _jit_caches(release, root)
    rows = ["## Pinned sources", "", "| upstream | repository | commit | submodules |"]
    rows.append("| --- | --- | --- | --- |")
    for name, v in m.vendors.items():
        s = v.source
        subs = "; ".join(f"{sub.path} @ {sub.commit[:12]}" for sub in s.submodules) or "none"
        rows.append(f"| {name} | {s.url} | {s.commit} | {subs} |")
    sections["sources"] = [*rows, ""]
    patches = [(name, q) for name, v in m.vendors.items() for q in v.patches]
    sections["patches"] = (
        ["## Patches", "", "| patch | applied to | sha256 |", "| --- | --- | --- |"]
        + [f"| {q.file} | {name} | {q.sha256} |" for name, q in patches]
        + [""]
        if patches
        else []
    )
    runner = m.runner
    build = [
        "## How it was built",
        "",
        f"- runner: {runner.kind}"
        + (f", image {runner.image}" if runner.image else "")
        + (f"; build steps' network: {runner.network}" if runner.network else ""),
        f"- nvcc {tc.nvcc_version}, gcc {tc.gcc_version}, Python {tc.python_version}, "
        f"torch {tc.torch_version} (CUDA {tc.torch_cuda}, C++11 ABI "
        f"{'on' if tc.torch_cxx11_abi else 'off'})",
    ]
    for name, v in m.vendors.items():
        env = " ".join(
            f"{k}={val}"
            for k, val in sorted(v.environment.items())
            if k not in ("CUDA_HOME", "PYTHONNOUSERSITE", "PIP_DISABLE_PIP_VERSION_CHECK")
        )
        build.append(f"- {name} ({v.recipe['kind']}): {env}")
    sections["build"] = [*build, ""]
    lic = []
    for name, v in m.vendors.items():
        lic.append(f"- {name}: {v.source.license_id or 'see its file'} (`licenses/`)")
        lic += [
            f"  - submodule {sub.path}: {sub.license_id or 'see its file'} (`{sub.license_file}`)"
            for sub in v.source.submodules
            if sub.license_file
        ]
    sections["licenses"] = [
        "## Licenses",
        "",
        "Each upstream's own, and its submodules':",
        *lic,
        "",
    ]
    return sections


def render(m: Manifest) -> str:
    """The README: YAML front matter for the Hub, then the workspace's template (its
    prose, the sections at its markers, the unplaced ones after it) or, without one,
    the title, the description and every section in order."""
    sections = _sections(m)
    meta = front_matter(m)
    template = m.release.readme_template_text
    if template is None:
        head = [f"# {m.release.name}", ""]
        if m.release.description:
            head += [m.release.description, ""]
        body = "\n".join(head + [ln for name in README_SECTIONS for ln in sections[name]])
    else:
        own, text = template_parts(template) if template.startswith("---") else ({}, template)
        if own.get("license", "other") != "other":  # the template names one license
            meta.pop("license_name", None)
            meta.pop("license_link", None)
        meta.update(own)
        placed = set(README_MARKER.findall(text))
        body = README_MARKER.sub(lambda x: "\n".join(sections[x.group(1)]).rstrip("\n"), text)
        rest = [ln for name in README_SECTIONS if name not in placed for ln in sections[name]]
        body = body.rstrip("\n") + "\n\n" + "\n".join(rest) if rest else body
    return f"---\n{_yaml(meta)}\n---\n\n" + body.rstrip("\n") + "\n"


# The openssl command that checks SHA256SUMS.sig by the key in "$KEY", per key scheme
# (securesystemslib's names; its signers' padding and digests).
_OPENSSL_CHECKS = {
    "ed25519": 'openssl pkeyutl -verify -pubin -inkey "$KEY" -rawin -in {sums} -sigfile {sig}',
    "ecdsa-sha2-nistp256": 'openssl dgst -sha256 -verify "$KEY" -signature {sig} {sums}',
    "ecdsa-sha2-nistp384": 'openssl dgst -sha384 -verify "$KEY" -signature {sig} {sums}',
    **{
        f"rsassa-pss-sha{n}": f"openssl dgst -sha{n} -sigopt rsa_padding_mode:pss -sigopt "
        f'rsa_pss_saltlen:digest -verify "$KEY" -signature {{sig}} {{sums}}'
        for n in (256, 384, 512)
    },
    **{
        f"rsa-pkcs1v15-sha{n}": f'openssl dgst -sha{n} -verify "$KEY" -signature {{sig}} {{sums}}'
        for n in (256, 384, 512)
    },
}


def receiver_check(scheme: str | None, folder: str) -> list[str]:
    """The shell lines (bash) that check a key-signed release in ``folder`` with tools
    the receiver already trusts, before anything from the release runs (issue 55 (2)):
    SHA256SUMS's signature by the key in ``$KEY`` (openssl), every file's digest
    (sha256sum), no symbolic link, and no file SHA256SUMS does not list but the
    signature files and the Hub client's (.gitattributes, .cache/huggingface/). A scheme
    openssl has no line for here: kiln's own checker, from a kiln the receiver installed."""
    sums, sig = signing.SUMS_FILE, signing.SUMS_SIGNATURE_FILE
    command = _OPENSSL_CHECKS.get(scheme or "")
    if command is None:
        return [f'python -m kiln verify-release {folder} --key "$KEY"']
    passing = (*signing.SIGNATURE_FILES, *signing.HUB_CLIENT_FILES)
    passed = " ".join(f"-e {name}" for name in passing)
    # one && chain (set -e is not kept inside a list the caller's && tests)
    return [
        f"(cd {folder} &&",
        " " + command.format(sums=sums, sig=sig) + " &&",
        f" sha256sum --check --strict --quiet {sums} &&",
        " ! find . -type l | grep . &&   # no symbolic link (named), no file unlisted:",
        f" find . -path ./{signing.HUB_CLIENT_FOLDER} -prune -o -type f -printf '%P\\n' "
        f"| grep -vxF {passed} | sort | diff <(cut -c67- {sums} | sort) -)",
    ]


def _install_lines(release: ReleaseInfo, root: str) -> list[str]:
    """The install block's lines after the download: for a key-signed release, first its
    check by the receiver's own tools, then install.sh (which checks an Ed25519 signature
    again with its own checker; told --no-verify for the other schemes it cannot read)."""
    install = f"bash {root}/release/install.sh {root}/venv {root}"
    if not release.signed_by or release.signer_identity:
        return [install]
    scheme = release.signer_scheme
    again = ' --pubkey "$KEY"' if scheme in (None, "ed25519") else " --no-verify"
    *check, last = receiver_check(scheme, f"{root}/release")
    return [
        "# check it before anything from it runs, with openssl and coreutils (bash): KEY is",
        "# the signer's public key, had from the signer (never from the release)",
        "KEY=$PWD/SIGNER.pub",
        *check,
        f"{last} && echo 'release checked: every file signed' &&",
        f"{install}{again}",
    ]


def _signed(release: ReleaseInfo) -> str:
    """Who signed the release, and how to check it."""
    vouches = (
        "Signed: `provenance.intoto.dsse.json` (a DSSE envelope over the in-toto "
        "provenance statement) vouches for every file here by its sha256, signed "
    )
    if release.signer_identity:
        identity, _, issuer = release.signer_identity.partition(" (")
        return (
            vouches + f"keyless with Sigstore by `{identity}` (OIDC issuer "
            f"`{issuer.rstrip(')')}`; keyid `{release.signed_by}`). Check it with "
            f"`python -m kiln verify-release . --identity {identity}` (`pip install "
            "'kiln[sigstore]'`; it asks Sigstore's public services). install.sh checks "
            "key signatures alone: it refuses this one with a public key, and says it "
            "installs unchecked without one."
        )
    return (
        vouches + f"by the key with keyid `{release.signed_by}`, and so is `SHA256SUMS` "
        "(every other file's sha256, signed alone in `SHA256SUMS.sig`). The commands "
        "above check it with openssl and sha256sum before anything from the release runs: "
        "a file changed, added or missing is refused (the Hub's `.gitattributes` and "
        "`hf download`'s `.cache/huggingface/` pass by name). install.sh checks an "
        "Ed25519 signature again with its own checker (`--pubkey`, or "
        "`KILN_RELEASE_PUBKEY`), and refuses a signed release without a key unless told "
        "`--no-verify`; `python -m kiln verify-release . --key SIGNER.pub` checks the "
        "envelope with kiln."
    )
