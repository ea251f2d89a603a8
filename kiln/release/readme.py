"""The release's README.md, written from the manifest (never by hand), in the spirit
of the model card: what is inside, the pinned commits, how it was built, how to install."""

from __future__ import annotations

from kiln.release.manifest import JitCacheInfo, Manifest, Output, ReleaseInfo


def _archs(output: Output) -> str:
    archs = sorted({a for o in output.shared_objects or [] for a in o.sass})
    return ", ".join(archs) or "no device code"


def _contents(m: Manifest) -> list[str]:
    rows = []
    wheels = [o for v in m.vendors.values() for o in v.outputs_of("wheel")]
    if wheels:
        listed = "; ".join(f"{o.name} {o.version} ({_archs(o)})" for o in wheels)
        rows.append(
            f"| wheels/ | {listed}; CUDA {m.profile.cuda}, "
            f"cp{m.profile.python.replace('.', '')}, {m.profile.platform} |"
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


def render(m: Manifest) -> str:
    p, tc, release = m.profile, m.toolchain, m.release
    root = release.install_root or "/opt/kiln"
    lines = [f"# {release.name}", ""]
    if release.description:
        lines += [release.description, ""]
    lines += [
        f"Built by kiln {m.kiln_version} from pinned sources for "
        f"{', '.join(p.archs)} with CUDA {p.cuda}, Python {p.python} and torch "
        f"{p.torch}. `manifest.json` lists every file here with its sha256; "
        f"check them with `python -m kiln manifest check manifest.json`.",
        "",
        "## Contents",
        "",
        *_contents(m),
        "",
        "torch and the NVIDIA libraries are NOT included: install.sh installs them "
        "(requirements.txt).",
        "",
        "## Install",
        "",
        "```sh",
        "# on the GPU node (Python "
        + p.python
        + ", a CUDA "
        + p.cuda.split(".")[0]
        + " toolkit with nvcc, zstd)",
        f"bash install.sh {root}/venv {root}",
        "```",
        "",
        *_jit_caches(release, root),
        "## Pinned sources",
        "",
        "| upstream | repository | commit | submodules |",
        "| --- | --- | --- | --- |",
    ]
    for name, v in m.vendors.items():
        s = v.source
        subs = "; ".join(f"{sub.path} @ {sub.commit[:12]}" for sub in s.submodules) or "none"
        lines.append(f"| {name} | {s.url} | {s.commit} | {subs} |")
    patches = [(name, q) for name, v in m.vendors.items() for q in v.patches]
    if patches:
        lines += ["", "## Patches", "", "| patch | applied to | sha256 |", "| --- | --- | --- |"]
        lines += [f"| {q.file} | {name} | {q.sha256} |" for name, q in patches]
    runner = m.runner
    lines += [
        "",
        "## How it was built",
        "",
        f"- runner: {runner.kind}" + (f", image {runner.image}" if runner.image else ""),
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
        lines.append(f"- {name} ({v.recipe['kind']}): {env}")
    lines += ["", "Licenses: each upstream's own, in `licenses/`.", ""]
    return "\n".join(lines)
