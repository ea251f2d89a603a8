"""A small fixture upstream built by ninja (kind ``inplace``): three light C units and
one heavy one (``src/big.c``), linked into one shared library. The scheduling tests
(learned data, the timings report) build it with the real compiler."""

from __future__ import annotations

from typing import Any

UNITS = ("a", "b", "c", "big")
HEAVY = """double f{i}(const double* x, int n) {{
  double s = 0;
  for (int a = 0; a < n; ++a) for (int b = 0; b < n; ++b){inner}
    s += x[(a * {i} + b * 7{c}) % n] * (a ^ b) / (1.0 + {d} + {i});
  return s;
}}
"""


def heavy(functions: int, deep: bool = True) -> str:
    """``src/big.c``: ``functions`` loop nests (three loops deep, else two)."""
    inner = " for (int c = 0; c < n; ++c)" if deep else ""
    c, d = (" + c", "c") if deep else ("", "b")
    return "".join(HEAVY.format(i=i + 3, inner=inner, c=c, d=d) for i in range(functions))


def files(
    lib: str, big: str, tag: str, value: int = 1, optimize: str = "-O2", padding: int = 0
) -> dict[str, str]:
    """The tree: build.ninja, build.sh (links ``lib``), a license and the units (the
    light ones' functions named after ``tag``, returning ``value``; ``padding`` bytes of
    comment in ``src/a.c``: a unit that reads long and compiles fast, which a first
    build's estimate from the code (``inside/kit/unitsize.py``) ranks first)."""
    rules = f"rule cc\n  command = $$CC {optimize} -fPIC -c $in -o $out\n"
    builds = "".join(f"build obj/{n}.o: cc src/{n}.c\n" for n in UNITS)
    units = {f"src/{n}.c": f"int {n}_{tag}(void) {{ return {value}; }}\n" for n in "abc"}
    units["src/a.c"] = "// a long comment\n" * (padding // 18) + units["src/a.c"]
    return {
        "build.ninja": rules + builds,
        "build.sh": f'set -e\nninja -j "$MAX_JOBS"\n"$CC" -shared -o {lib} obj/*.o\n',
        "LICENSE": "MIT License\n",
        "src/big.c": big,
        **units,
    }


def vendor(url: str, commit: str, lib: str, mem_per_job_gib: float) -> dict[str, Any]:
    """Its recipe: built in place by ``sh build.sh``, no device code."""
    return {
        "source": {"url": url, "commit": commit},
        "build": {
            "kind": "inplace",
            "archs": [],
            "arch_control": "none",
            "command": ["sh", "build.sh"],
            "outputs": [lib],
            "mem_per_job_gib": mem_per_job_gib,
        },
    }
