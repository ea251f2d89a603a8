#!/usr/bin/env python3
"""Re-apply a patch to an installed tree and rebuild only its extension (stdlib only).

    python3 .kiln/rebuild.py TREE PATCH [--python PYTHON] [--cuda-home DIR]

The version of PATCH applied last (kept in ``.kiln/applied/``) is reverted and the
new one applied, both first on a scratch copy of the files they touch: if either
step fails, the tree is left exactly as it was. Then the tree's rebuild command
(``.kiln/tree.json``) runs with the compilers behind ``.kiln/objcache.py``, so only
translation units whose inputs changed are compiled again. If that build fails the
patch swap is undone. No GPU is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:  # inside kiln
    from kiln.inside.kit import patchapply, pipcuda
    from kiln.inside.kit.objcache import wrapper_env
except ImportError:  # shipped: the kit's modules sit beside this file in .kiln/
    import patchapply  # type: ignore[no-redef]
    import pipcuda  # type: ignore[no-redef]
    from objcache import wrapper_env  # type: ignore[no-redef]


class RebuildError(Exception):
    pass


def run(
    cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` capturing its output (appended to ``log`` when given)."""
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if log is not None:
        with log.open("a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")
    return res


def swap(tree: Path, old: Path | None, new: Path) -> None:
    """Revert ``old`` (if any) and apply ``new`` with kiln's two-phase patch engine
    (``patchapply.py``, the build's own): ``tree`` is unchanged on any failure."""
    steps = ([patchapply.Step(old, reverse=True)] if old else []) + [patchapply.Step(new)]
    try:
        patchapply.apply(tree, steps)
    except patchapply.Refused as exc:
        if exc.kind in ("invalid", "escape"):
            raise RebuildError(f"{exc}; refusing it (the tree was left unchanged)") from None
        if exc.kind == "changed":
            raise RebuildError(
                f"{exc.step.name} failed on {exc.detail} after its check passed; the tree "
                f"changed during the run"
            ) from None
        what = "reverting the applied version of" if exc.step.reverse else "applying"
        raise RebuildError(
            f"{what} {exc.step.name} fails on {exc.detail}; the tree was left unchanged"
        ) from None


def environment(tree: Path, meta: dict[str, Any], python: Path, cuda_home: str) -> dict[str, str]:
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env = dict(os.environ)
    env.update(meta["env"])
    env["CUDA_HOME"] = cuda_home
    env["PATH"] = f"{cuda_home}/bin:{env.get('PATH', '/usr/bin:/bin')}"
    # What torch's pip CUDA lacks on this machine (headers, link names, a libcuda stub),
    # as kiln's build had it on the build machine.
    env.update(pipcuda.prepare(str(tree), site, cuda_home, env, cc=env.get("CC", "gcc")))
    env.update(wrapper_env(tree, str(python), site, cuda_home, env))
    return env


def rebuild(tree: Path, patch: Path, python: Path, cuda_home: str) -> float:
    """Swap in ``patch`` and rebuild; return the seconds the whole step took."""
    start = time.monotonic()
    tree = tree.resolve()
    meta_file = tree / ".kiln" / "tree.json"
    if not meta_file.is_file():
        raise RebuildError(
            f"{tree} is not a tree built by kiln (no .kiln/tree.json): point "
            f"at the folder install.sh unpacked"
        )
    meta = json.loads(meta_file.read_text())
    if not patch.is_file():
        raise RebuildError(f"patch {patch} not found")
    applied = tree / ".kiln" / "applied" / patch.name
    old = applied if applied.is_file() else None
    same = old is not None and old.read_bytes() == patch.read_bytes()
    if not same:
        swap(tree, old, patch)
    log = tree / ".kiln" / "rebuild.log"
    log.write_text("")
    res = run(
        meta["rebuild_command"], cwd=tree, env=environment(tree, meta, python, cuda_home), log=log
    )
    if res.returncode != 0:
        if not same and old:
            swap(tree, patch, old)
        elif not same:
            with contextlib.suppress(patchapply.Refused):  # undo; the build's error follows
                patchapply.apply(tree, [patchapply.Step(patch, reverse=True)])
        tail = "\n".join(f"    {ln}" for ln in (res.stdout + res.stderr).splitlines()[-20:])
        raise RebuildError(
            f"the rebuild failed (exit {res.returncode}); the patch swap was "
            f"undone; full log: {log}\n{tail}"
        )
    if not same:
        applied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(patch, applied)
        digest = hashlib.sha256(patch.read_bytes()).hexdigest()
        others = [p for p in meta["patches"] if p["file"] != patch.name]
        meta["patches"] = [*others, {"file": patch.name, "sha256": digest}]
        meta_file.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return time.monotonic() - start


def default_python(tree: Path) -> Path:
    recorded = tree / ".kiln" / "python"  # written by install.sh
    if recorded.is_file():
        return Path(recorded.read_text().strip())
    return Path(sys.executable)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("patch", type=Path)
    ap.add_argument("--python", type=Path, default=None)
    ap.add_argument("--cuda-home", default=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    args = ap.parse_args(argv)
    try:
        python = args.python or default_python(args.tree)
        took = rebuild(args.tree, args.patch.resolve(), python, args.cuda_home)
    except RebuildError as exc:
        print(f"rebuild: error: {exc}", file=sys.stderr)
        return 1
    print(f"rebuild: {args.tree} rebuilt with {args.patch.name} in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
