"""URL rewriting for users behind a firewall (and for the tests).

A mirrors file maps URL prefixes to replacements, like git's ``insteadOf``::

    [mirrors]
    "https://github.com/deepseek-ai/" = "/srv/git-mirrors/deepseek-ai/"
    "https://github.com/NVIDIA/cutlass" = "https://git.internal/mirrors/cutlass"

The longest matching prefix wins. A replacement may be a local path or a URL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kiln.config.workspace import read_toml
from kiln.errors import ConfigError
from kiln.inside.kit import contract

ENV_VAR = contract.MIRRORS


@dataclass(frozen=True)
class Mirrors:
    rules: dict[str, str] = field(default_factory=dict)

    def map(self, url: str) -> str:
        best = max((p for p in self.rules if url.startswith(p)), key=len, default=None)
        return url if best is None else self.rules[best] + url[len(best) :]

    @classmethod
    def load(cls, path: Path | None) -> Mirrors:
        """Read ``path``, else the file named by ``$KILN_MIRRORS``, else no rules."""
        if path is None and os.environ.get(ENV_VAR):
            path = Path(os.environ[ENV_VAR])
        if path is None:
            return cls()
        data = read_toml(path)
        unknown = sorted(set(data) - {"mirrors"})
        if unknown:
            raise ConfigError(f"{path}: {unknown[0]}: unknown key (only [mirrors] is allowed)")
        rules = data.get("mirrors", {})
        if not isinstance(rules, dict) or not all(isinstance(v, str) for v in rules.values()):
            raise ConfigError(f"{path}: mirrors: must map URL prefixes to strings")
        base = path.parent.resolve()
        resolved = {k: _anchor(v, base) for k, v in rules.items()}
        return cls(resolved)


def _anchor(target: str, base: Path) -> str:
    """Relative local paths in a mirrors file are relative to that file."""
    if is_remote(target) or os.path.isabs(target):
        return target
    return str(base / target)


def is_remote(url: str) -> bool:
    """True for URLs that need the network (http, https, ssh, git, scp-like)."""
    if url.startswith(("http://", "https://", "ssh://", "git://", "ftp://", "ftps://")):
        return True
    if url.startswith("file://") or url.startswith("/") or url.startswith("."):
        return False
    head = url.split("/", 1)[0]
    return ":" in head and "@" in head  # user@host:path
