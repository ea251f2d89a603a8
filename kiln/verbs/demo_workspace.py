"""The bundled example: ``examples/demo`` holds a workspace plus the sources of its
upstreams. ``prepare`` turns those sources into git repositories (deterministic
history, so the workspace's lock pins real SHAs) and writes a mirrors file that
points the upstream URLs at them: the same offline mechanism a user behind a
firewall uses."""

from __future__ import annotations

from pathlib import Path

from kiln.config.workspace import read_toml
from kiln.errors import ConfigError
from kiln.sources.gitrepo import CommitSpec, make_repo, snapshot

HISTORY = "upstreams/history.toml"


def prepare(workspace: Path, dest: Path) -> Path:
    """Materialise the example's upstreams under ``dest``; return the mirrors file."""
    history_file = workspace / HISTORY
    history = read_toml(history_file)
    base_url = history.get("base_url")
    if not isinstance(base_url, str):
        raise ConfigError(f"{history_file}: base_url: missing required key")
    heads: dict[str, str] = {}
    for repo in history.get("repo", []):
        name = repo["name"]
        src = workspace / "upstreams" / name
        if not src.is_dir():
            raise ConfigError(f"{history_file}: repo {name}: no folder {src}")
        files = snapshot(src)
        commits = []
        for step in repo["commit"]:
            chosen = {
                k: v
                for k, v in files.items()
                if any(k == g or k.startswith(g.rstrip("/") + "/") for g in step["add"])
            }
            subs = {
                path: (f"{base_url}{sub}.git", heads[sub])
                for path, sub in step.get("submodules", {}).items()
            }
            commits.append(
                CommitSpec(
                    step["message"],
                    chosen,
                    submodules=subs,
                    executable=set(step.get("executable", [])),
                )
            )
        heads[name] = make_repo(dest / f"{name}.git", commits)[-1]
    dest = dest.resolve()
    mirrors = dest / "mirrors.toml"
    mirrors.write_text(f'[mirrors]\n"{base_url}" = "{dest}/"\n')
    return mirrors
