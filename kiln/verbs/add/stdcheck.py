"""The drafted C++ standard flag, tried before the recipe is written.

Where the draft appends ``-std=c++NN`` for the units that reach torch's headers
(``cxx_append_flags`` for C++ units, ``nvcc_append_flags`` for CUDA ones), ``add`` runs the
compiler that unit will meet (nvcc, or the host C++ compiler) in preprocessing only, on the
torch header the unit includes, with the upstream's hard-coded ``-std`` first and the
drafted flags after it, as kiln's wrapper orders them: torch's ``#error C++20 or later``
fires there or not. One unit per compiler; about a second each (issue 35, item 8)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import ConfigError, KilnError
from kiln.inside import proc
from kiln.verbs.add.scan import Environment, Findings

log = logging.getLogger(__name__)

KEYS = {"cxx_append_flags": "C++", "nvcc_append_flags": "CUDA"}


@dataclass(frozen=True)
class Tried:
    key: str
    unit: str
    compiler: str
    flags: list[str]  # the upstream's, then the drafted
    header: str
    seconds: float

    def said(self) -> str:
        return (
            f"checked {self.key}: {Path(self.compiler).name} -E {' '.join(self.flags)} of "
            f"{self.header} passes torch's guard ({self.seconds:.1f} s), as {self.unit} "
            f"will meet it"
        )


def _include_dirs(env: Environment) -> list[str]:
    dirs: list[Path] = []
    if env.site_packages is not None:
        torch = env.site_packages / "torch" / "include"
        dirs += [torch, torch / "torch" / "csrc" / "api" / "include"]
    if env.python_include is not None:
        dirs.append(env.python_include)
    if env.cuda_home is not None:
        dirs.append(env.cuda_home / "include")
    return [f"-I{d}" for d in dirs if d.is_dir()]


def _compiler(key: str, env: Environment) -> list[str]:
    if key == "nvcc_append_flags":
        nvcc = env.cuda_home / "bin" / "nvcc" if env.cuda_home is not None else Path("nvcc")
        return [str(nvcc), "-E", "-x", "cu"]
    return [os.environ.get("CXX", "g++"), "-E", "-x", "c++"]


def check(name: str, build: Mapping[str, object], f: Findings, env: Environment) -> list[Tried]:
    """Each drafted standard flag, preprocessed once; a flag that does not get torch's
    headers through stops ``add`` before anything is written (ConfigError)."""
    header = f.torch_header()
    upstream = sorted({f"-std=c++{n}" for m in f.setup for n, _ in m.std_flags})
    units = f.torch_units()
    tried: list[Tried] = []
    for key, kind in KEYS.items():
        drafted = build.get(key)
        listed = drafted if isinstance(drafted, list) else []
        flags = [str(x) for x in listed if str(x).startswith("-std=")]
        if not flags or header is None:
            continue
        unit = next((u for u in units if u.endswith(".cu") == (kind == "CUDA")), "a unit")
        with tempfile.TemporaryDirectory(prefix="kiln-add-std-") as tmp:
            src = Path(tmp) / ("unit.cu" if kind == "CUDA" else "unit.cpp")
            src.write_text(f"#include <{header.header}>\n")
            given = [*upstream[:1], *flags]
            cmd = [*_compiler(key, env), *given, *_include_dirs(env), str(src), "-o", os.devnull]
            start = time.monotonic()
            try:
                res = proc.run(cmd, check=False, what=f"{kind} preprocessing of {header.header}")
            except KilnError as exc:  # no such compiler here: add only reads, so it goes on
                log.warning("%s: %s not checked: %s", name, key, str(exc).splitlines()[0])
                continue
        if res.returncode != 0:
            first = next(
                (ln.strip() for ln in res.output.splitlines() if "error" in ln),
                f"exit code {res.returncode}",
            )
            raise ConfigError(
                f"vendors/{name}.toml (not written): the drafted {key} = {flags} does not get "
                f"{unit}'s torch headers through the {kind} compiler ({first}); set the "
                f"standard torch needs by hand and report the tree to kiln"
            )
        tried.append(Tried(key, unit, cmd[0], given, header.header, time.monotonic() - start))
        log.info("%s: %s", name, tried[-1].said())
    return tried
