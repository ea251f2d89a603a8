"""A machine-wide gate for compile jobs: memory and CPU slots shared by every build
step of one kiln run (stdlib only: it runs inside build containers).

Why a gate and not only ``MAX_JOBS``: ninja's ``MAX_JOBS`` bounds one step; when
several upstreams build at once, and when one step finishes early, a fixed split of
the machine either overcommits memory or leaves cores idle. Every compile goes
through kiln's compiler wrapper, which asks the gate for its memory estimate and
its threads before it starts the real compiler, and gives them back when done. A
step therefore gets ``MAX_JOBS`` as large as its parallelism allows and the gate
keeps the sum of what runs under the run's budget.

The gate is a folder: ``budget.json`` ({"mem_gib", "cpus"}), ``lock`` (flock'ed
while the holders are counted) and ``holders/<id>.json``, each flock'ed by its
live holder. A holder killed with SIGKILL loses its flock, so the next count
drops it: no leaked slots after a crash. flock works across containers that share
the bind-mounted folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

POLL_S = 0.05


def write_budget(gate: Path, mem_gib: float, cpus: int) -> None:
    gate.mkdir(parents=True, exist_ok=True)
    (gate / "holders").mkdir(exist_ok=True)
    (gate / "budget.json").write_text(json.dumps({"mem_gib": mem_gib, "cpus": cpus}))


def _alive_holders(holders: Path) -> list[dict[str, float]]:
    alive = []
    for path in holders.glob("*.json"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its holder is alive and holds it
                with contextlib.suppress(ValueError, OSError):
                    alive.append(json.loads(os.pread(fd, 4096, 0) or b"{}"))
                continue
            path.unlink(missing_ok=True)  # nobody holds it: a dead holder's leftover
        finally:
            os.close(fd)
    return alive


@contextlib.contextmanager
def slot(gate: Path, mem_gib: float, cpus: int) -> Iterator[None]:
    """Wait until ``mem_gib`` and ``cpus`` fit beside the live holders, hold them
    while the body runs. One job alone always runs (the caller checked before the
    build that one job of every step fits the budget)."""
    budget = json.loads((gate / "budget.json").read_text())
    holders = gate / "holders"
    mine = holders / f"{uuid.uuid4().hex}.json"
    while True:
        with open(gate / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            alive = _alive_holders(holders)
            used_mem = sum(h.get("mem_gib", 0.0) for h in alive)
            used_cpu = sum(h.get("cpus", 1) for h in alive)
            fits = used_mem + mem_gib <= budget["mem_gib"] + 1e-9
            fits = fits and used_cpu + cpus <= budget["cpus"]
            if fits or not alive:
                fd = os.open(mine, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, json.dumps({"mem_gib": mem_gib, "cpus": cpus}).encode())
                break
        time.sleep(POLL_S)
    try:
        yield
    finally:
        mine.unlink(missing_ok=True)
        os.close(fd)


def from_environment() -> contextlib.AbstractContextManager[None]:
    """The slot this compile needs, from the step's environment; a no-op outside
    kiln's builds (e.g. ``rebuild.py`` on an installed tree)."""
    gate = os.environ.get("KILN_GATE_DIR")
    if not gate or not (Path(gate) / "budget.json").is_file():
        return contextlib.nullcontext()
    mem = float(os.environ.get("KILN_GATE_MEM_GIB", "0") or 0)
    cpus = int(os.environ.get("KILN_GATE_CPUS", "1") or 1)
    return slot(Path(gate), mem, cpus)
