"""pip's own settings, as uv's arguments: the consumer environment is installed by uv
(seconds, its files hard-linked from one cache) from the same indexes and links that
``install.sh``'s pip would read where the build runs.

pip's settings come from ``pip config list`` run there (its configuration files and its
``PIP_*`` variables, already merged by pip); only the ones that choose which files are
installed, and how they are fetched, are carried over. uv reads none of pip's files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# `global.find-links='/opt/wheels'`, `:env:.no-index='1'`, `install.index-url='...'`
LINE = re.compile(r"^(?P<section>:env:|global|install)\.(?P<key>[a-z-]+)='(?P<value>.*)'$")
# pip's precedence: its environment variables over the `install` section over `global`
PRECEDENCE = (":env:", "install", "global")
TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class UvSettings:
    """uv's arguments and environment for pip's settings."""

    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def for_hashed(self) -> UvSettings:
        """Without pip's constraint files: uv's ``--require-hashes`` refuses a
        constraint that is not an exact pin (a machine's ``torch<=2.14.1`` cap), while
        pip applies it; a lock of exact pins with hashes leaves a constraint nothing to
        choose (it could only refuse the lock)."""
        args, kept = list(self.args), []
        while args:
            arg = args.pop(0)
            if arg == "--constraint":
                args.pop(0)
                continue
            kept.append(arg)
        return UvSettings(tuple(kept), dict(self.env))


def parse(listing: str) -> dict[str, str]:
    """``pip config list``'s lines -> key -> the value pip uses (its precedence)."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        m = LINE.match(line.strip())
        if m:
            found[(m["section"], m["key"])] = m["value"]
    out: dict[str, str] = {}
    for section in reversed(PRECEDENCE):
        for (sec, key), value in found.items():
            if sec == section:
                out[key] = value
    return out


def uv_settings(pip: dict[str, str]) -> UvSettings:
    """The uv arguments that fetch what pip would: its index, extra indexes, find-links,
    ``--no-index``, constraints, trusted hosts; its CA bundle and timeout as uv's
    variables. pip takes each distribution from whichever index offers the best match:
    uv's ``unsafe-best-match`` strategy does the same."""
    args = ["--index-strategy", "unsafe-best-match"]
    if pip.get("index-url"):
        args += ["--index-url", pip["index-url"]]
    for url in pip.get("extra-index-url", "").split():
        args += ["--extra-index-url", url]
    for link in pip.get("find-links", "").split():
        args += ["--find-links", link]
    if pip.get("no-index", "").lower() in TRUE:
        args.append("--no-index")
    for constraint in pip.get("constraint", "").split():
        args += ["--constraint", constraint]
    for host in pip.get("trusted-host", "").split():
        args += ["--allow-insecure-host", host]
    env: dict[str, str] = {}
    if pip.get("cert"):
        env["SSL_CERT_FILE"] = pip["cert"]
    if pip.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = pip["default-timeout"].split(".")[0]
    return UvSettings(tuple(args), env)
