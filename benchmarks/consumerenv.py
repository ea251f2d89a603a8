"""What the import proof's consumer environment costs (issue 40, item 5): pip against
kiln's uv, side by side in one run, from the same hash-pinned lock, through kiln's own
commands (``kiln.toolchain.consumerenv``: a venv, then the lock installed).

Runs, each into a fresh cache folder under ``--root`` (nothing shared with kiln's cache):

1. ``pip``: as install.sh and kiln before uv (``pip install --require-hashes -r``), pip's
   own wheel cache left as it is on this machine (a warm one: its best case);
2. ``uv, cold``: kiln's uv with an empty uv cache (every distribution unpacked once);
3. ``uv, warm``: a second environment of the same lock in the same cache (another
   workspace's, a rebuild's, the build venv's torch already there);

Printed per run: wall seconds, CPU seconds (the commands' children), and the disk it
added (bytes of inodes new under ``--root``: a file hard-linked from uv's cache counts
once, where it lies first). pip's settings (indexes, find-links) are this machine's, for
all three.

    python benchmarks/consumerenv.py [--requirements examples/demo/runtime-requirements.lock]
        [--root build/bench-consumerenv]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kiln.toolchain import consumerenv, uvtool  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _inodes(root: Path) -> dict[int, int]:
    """inode -> size of every regular file under ``root``."""
    out: dict[int, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if not os.path.islink(os.path.join(dirpath, name)):
                out[st.st_ino] = st.st_blocks * 512
    return out


def make(cache: Path, requirements: str, uv: str | None, tag: str) -> consumerenv.ConsumerEnv:
    env = consumerenv.plan(cache, "bench", sys.executable, requirements, None, tag, uv)
    settings = uvtool.host_settings()
    for i, (argv, _what) in enumerate(env.commands(settings)):
        if i == 1:
            (env.root / consumerenv.REQUIREMENTS_FILE).write_text(requirements)
        subprocess.run(argv, check=True, env={**os.environ, **settings.env})
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--requirements", type=Path, default=REPO / "examples/demo/runtime-requirements.lock"
    )
    ap.add_argument("--root", type=Path, default=REPO / "build" / "bench-consumerenv")
    args = ap.parse_args()
    uv = uvtool.binary()
    if uv is None:
        sys.exit("kiln's uv is not installed (pip install -e .)")
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    text = args.requirements.read_text()
    runs = [
        ("pip", root / "pip", None, "pip"),
        ("uv, cold", root / "uv", uv, "uv-a"),
        ("uv, warm", root / "uv", uv, "uv-b"),
    ]
    rows = []
    for name, cache, binary, tag in runs:
        before = _inodes(root)
        cpu, t0 = _children_cpu(), time.monotonic()
        env = make(cache, text, binary, tag)
        wall, used = time.monotonic() - t0, _children_cpu() - cpu
        added = sum(size for ino, size in _inodes(root).items() if ino not in before)
        check = [str(env.python), "-c", "import torch; print(torch.__version__)"]
        torch = subprocess.run(check, capture_output=True, text=True, check=True).stdout.strip()
        rows.append((name, wall, used, added / 2**30, torch))
        print(
            f"{name}: {wall:.1f} s wall, {used:.1f} CPU-s, {added / 2**30:.2f} GiB added",
            flush=True,
        )
    print(f"\nlock: {args.requirements} ({uvtool.installer(uv)}; {os.cpu_count()} CPUs)\n")
    print("| run | wall (s) | CPU (s) | disk added (GiB) | torch imported |")
    print("|---|---|---|---|---|")
    for name, wall, used, gib, torch in rows:
        print(f"| {name} | {wall:.1f} | {used:.1f} | {gib:.2f} | {torch} |")


if __name__ == "__main__":
    main()
