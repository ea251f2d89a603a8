"""The release's README.md, written from the manifest (never by hand), in the spirit
of the model card: what is inside, the pinned commits, how it was built, how to install."""

from __future__ import annotations

from typing import Any


def _archs(output: dict[str, Any]) -> str:
    archs = sorted({a for o in output.get("shared_objects", []) for a in o["sass"]})
    return ", ".join(archs) or "no device code"


def _contents(data: dict[str, Any]) -> list[str]:
    rows = []
    wheels = [
        (n, o) for n, v in data["vendors"].items() for o in v["outputs"] if o["kind"] == "wheel"
    ]
    if wheels:
        listed = "; ".join(f"{o['name']} {o['version']} ({_archs(o)})" for _, o in wheels)
        rows.append(
            f"| wheels/ | {listed}; CUDA {data['profile']['cuda']}, "
            f"cp{data['profile']['python'].replace('.', '')}, "
            f"{data['profile'].get('platform', 'linux_x86_64')} |"
        )
    for name, v in data["vendors"].items():
        for o in v["outputs"]:
            if o["kind"] == "tarball":
                so = ", ".join(s["path"] for s in o.get("shared_objects", []))
                n = len(v["patches"])
                rows.append(
                    f"| {o['path']} | {name} {v['source']['commit'][:7]} built in place "
                    f"({so}: {_archs(o)}), with the {n} patch{'es' if n != 1 else ''} "
                    f"below applied |"
                )
    if any(o["kind"] == "patch" for v in data["vendors"].values() for o in v["outputs"]):
        rows.append("| patches/ | The patches applied, also usable on a source checkout |")
    jit = [f for f in data.get("files", []) if f["kind"] == "jit-cache"]
    if jit:
        rows.append(
            f"| jit-cache/ | Packed JIT kernel caches: "
            f"{', '.join(f['path'].split('/')[-1] for f in jit)} |"
        )
    rows.append(
        "| install.sh | Builds a venv: requirements.txt, the wheels, and the trees built in place |"
    )
    for f in data.get("files", []):
        if f["kind"] == "rebuild-script":
            rows.append(
                f"| {f['path']} | Re-applies a patch to an installed tree and rebuilds "
                f"only its compiled extension (seconds; no GPU needed) |"
            )
        if f["kind"] == "build-script":
            rows.append(
                f"| {f['path']} | The recipe used to build all of this from source on a "
                f"CPU-only machine, and the command that rebuilds it and compares every file |"
            )
    lic = [
        o["path"].split("/")[-1]
        for v in data["vendors"].values()
        for o in v["outputs"]
        if o["kind"] == "license"
    ]
    rows.append(f"| licenses/ | {', '.join(lic)} |")
    rows.append("| manifest.json | Every input, the toolchain, and every file's sha256 |")
    kinds = {f["kind"] for f in data.get("files", [])}
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


def render(data: dict[str, Any]) -> str:
    p, tc = data["profile"], data["toolchain"]
    release = data["release"]
    lines = [f"# {release['name']}", ""]
    if release.get("description"):
        lines += [release["description"], ""]
    lines += [
        f"Built by kiln {data['kiln_version']} from pinned sources for "
        f"{', '.join(p['archs'])} with CUDA {p['cuda']}, Python {p['python']} and torch "
        f"{p['torch']}. `manifest.json` lists every file here with its sha256; "
        f"check them with `python -m kiln manifest check manifest.json`.",
        "",
        "## Contents",
        "",
        *_contents(data),
        "",
        "torch and the NVIDIA libraries are NOT included: install.sh installs them "
        "(requirements.txt).",
        "",
        "## Install",
        "",
        "```sh",
        "# on the GPU node (Python "
        + p["python"]
        + ", a CUDA "
        + p["cuda"].split(".")[0]
        + " toolkit with nvcc, zstd)",
        "bash install.sh /workspace/venv /workspace",
        "```",
        "",
        "## JIT caches",
        "",
        "Optional, to skip most first-run kernel compilation: unpack a cache from `jit-cache/` "
        "(`nox -s pack_jit_cache` makes them from a GPU run) and point DeepGEMM and TileLang "
        "at it:",
        "",
        "```sh",
        "# tarfile's data filter refuses members that would land outside /workspace",
        "zstd -dc jit-cache/jit-cache-LABEL.tar.zst | /workspace/venv/bin/python -c "
        '\'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|")'
        '.extractall(sys.argv[1], filter="data")\' /workspace',
        "export DG_JIT_CACHE_DIR=/workspace/jit-cache/deep_gemm "
        "TILELANG_CACHE_DIR=/workspace/jit-cache/tilelang",
        "```",
        "",
        "## Pinned sources",
        "",
        "| upstream | repository | commit | submodules |",
        "| --- | --- | --- | --- |",
    ]
    for name, v in data["vendors"].items():
        s = v["source"]
        subs = "; ".join(f"{m['path']} @ {m['commit'][:12]}" for m in s["submodules"]) or "none"
        lines.append(f"| {name} | {s['url']} | {s['commit']} | {subs} |")
    patches = [(name, q) for name, v in data["vendors"].items() for q in v["patches"]]
    if patches:
        lines += ["", "## Patches", "", "| patch | applied to | sha256 |", "| --- | --- | --- |"]
        lines += [f"| {q['file']} | {name} | {q['sha256']} |" for name, q in patches]
    runner = data["runner"]
    lines += [
        "",
        "## How it was built",
        "",
        f"- runner: {runner['kind']}" + (f", image {runner['image']}" if runner["image"] else ""),
        f"- nvcc {tc['nvcc_version']}, gcc {tc['gcc_version']}, Python {tc['python_version']}, "
        f"torch {tc['torch_version']} (CUDA {tc['torch_cuda']}, C++11 ABI "
        f"{'on' if tc['torch_cxx11_abi'] else 'off'})",
    ]
    for name, v in data["vendors"].items():
        env = " ".join(
            f"{k}={val}"
            for k, val in sorted(v["environment"].items())
            if k not in ("CUDA_HOME", "PYTHONNOUSERSITE", "PIP_DISABLE_PIP_VERSION_CHECK")
        )
        lines.append(f"- {name} ({v['recipe']['kind']}): {env}")
    lines += ["", "Licenses: each upstream's own, in `licenses/`.", ""]
    return "\n".join(lines)
