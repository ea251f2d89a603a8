"""``kiln publish``: a real release to a folder and to a stand-in for the Hugging Face Hub
(a local HTTP server serving the endpoints huggingface_hub calls for one commit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.release import manifest
from tests import releases
from tests.conftest import REPO
from tests.hub_standin import StandinHub
from tests.upstreams import Upstreams

TOKEN = "hf_kilnTestToken0123456789abcdefSECRET"
EMPTY_HF_HOME = Path("/nonexistent/kiln-tests-hf-home")
REPO_ID = "inferencekey/deepinfer-sm100-cu132"


@pytest.fixture(scope="module")
def release(
    tmp_path_factory: pytest.TempPathFactory, upstreams: Upstreams, build_python: Path
) -> Path:
    root = tmp_path_factory.mktemp("publish")
    ws = releases.workspace(root / "ws", upstreams)
    return releases.build(ws, root, upstreams, build_python, "artifacts")


def publish(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m kiln -v publish ...`` with HF_TOKEN only where ``env`` sets it (and an
    HF_HOME of its own: no login token of this machine's is found unless ``env`` puts one)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    base["HF_HOME"] = str(EMPTY_HF_HOME)
    return subprocess.run(
        [sys.executable, "-m", "kiln", "-v", "publish", *map(str, args)],
        cwd=REPO,
        text=True,
        capture_output=True,
        env={**base, "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})},
        check=False,
        timeout=300,
    )


def hub_env(hub: StandinHub, token: str | None = TOKEN) -> dict[str, str]:
    env = {"HF_ENDPOINT": hub.url}
    if token:
        env["HF_TOKEN"] = token
    return env


def release_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def listed(release: Path) -> set[str]:
    data = manifest.read(release / "manifest.json")
    return {o.path for o in data.outputs()} | {"manifest.json"}


def test_publish_to_a_folder(release: Path, tmp_path: Path) -> None:
    dest = tmp_path / "mnt" / "releases" / "r1"
    res = publish(release, "--to", dest)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"published {len(listed(release))} files to {dest}"
    assert set(release_files(dest)) == listed(release)
    assert manifest.check(dest / "manifest.json") == []
    # file:// form, over the earlier release (swapped in whole)
    res = publish(release, "--to", f"file://{dest}")
    assert res.returncode == 0, res.stderr
    assert manifest.check(dest / "manifest.json") == []
    assert sorted(p.name for p in dest.parent.iterdir()) == ["r1"]  # no staging left


def test_publish_refuses_a_folder_that_is_not_a_release(release: Path, tmp_path: Path) -> None:
    dest = tmp_path / "home"
    dest.mkdir()
    (dest / "thesis.tex").write_text("years of work\n")
    res = publish(release, "--to", dest)
    assert res.returncode == 14
    assert "holds files kiln did not write (thesis.tex)" in res.stderr
    assert [p.name for p in dest.iterdir()] == ["thesis.tex"]


def test_publish_refuses_a_release_with_a_modified_wheel(release: Path, tmp_path: Path) -> None:
    bad = releases.copy(release, tmp_path / "bad")
    wheel = sorted((bad / "wheels").glob("plainext-*.whl"))[0]
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1  # one bit, same size
    wheel.write_bytes(bytes(data))
    dest = tmp_path / "out"
    res = publish(bad, "--to", dest)
    assert res.returncode == 14
    (line,) = res.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"kiln: error: {bad}: wheels/{wheel.name}: sha256 ")
    assert "nothing was published" in line
    assert not dest.exists()

    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        res = publish(bad, "--to", f"hf://{REPO_ID}", env=hub_env(hub))
    assert res.returncode == 14 and "nothing was published" in res.stderr
    assert hub.requests == [] and hub.commits == []


def test_publish_dry_run_lists_sizes_and_uploads_nothing(release: Path, tmp_path: Path) -> None:
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        res = publish(release, "--to", f"hf://{REPO_ID}", "--dry-run", env=hub_env(hub))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    sizes = {ln.split()[1]: int(ln.split()[0].replace(",", "")) for ln in lines[:-1]}
    assert sizes == {p: (release / p).stat().st_size for p in listed(release)}
    total = sum(sizes.values())
    assert lines[-1] == (
        f"dry run: would upload {len(sizes)} files ({total:,} bytes) to hf://{REPO_ID}; "
        f"nothing was uploaded"
    )
    assert hub.requests == []
    res = publish(release, "--to", tmp_path / "folder", "--dry-run")
    assert res.returncode == 0 and not (tmp_path / "folder").exists()


def test_publish_to_hub_standin_server(release: Path, tmp_path: Path) -> None:
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        res = publish(release, "--to", f"hf://{REPO_ID}", env=hub_env(hub))
    assert res.returncode == 0, res.stderr
    n = len(listed(release))
    assert res.stdout.startswith(f"published {n} files to hf://{REPO_ID} in one commit: ")
    (commit,) = hub.commits  # one commit holding every file
    assert set(commit.files) == listed(release)
    assert commit.summary == f"test-release: kiln release ({n} files)"
    assert [p for _, p in hub.requests if "/commit/" in p] == [f"/api/models/{REPO_ID}/commit/main"]
    # what the Hub now holds is the release: manifest check accepts it
    assert manifest.check(tmp_path / "hub" / REPO_ID / "manifest.json") == []
    assert TOKEN not in res.stdout + res.stderr


def test_publish_hub_standin_without_token_stops_before_any_request(
    release: Path, tmp_path: Path
) -> None:
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        res = publish(release, "--to", f"hf://{REPO_ID}", env=hub_env(hub, token=None))
    assert res.returncode == 14
    assert res.stderr.strip().splitlines()[-1] == (
        f"kiln: error: no Hugging Face token: export HF_TOKEN or run `hf auth login` with a "
        f"token that can write to {REPO_ID}; nothing was uploaded"
    )
    assert hub.requests == []


def test_publish_hub_takes_the_token_of_hf_auth_login(release: Path, tmp_path: Path) -> None:
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text(TOKEN)  # where `hf auth login` stores it
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        res = publish(
            release, "--to", f"hf://{REPO_ID}", env={**hub_env(hub, None), "HF_HOME": str(home)}
        )
    assert res.returncode == 0, res.stderr
    assert len(hub.commits) == 1 and TOKEN not in res.stdout + res.stderr


def _seed_earlier_release(hub_root: Path, release: Path) -> str:
    """The Hub repository as an earlier publish left it: this release's files plus a
    wheel its manifest listed that the new release no longer has."""
    repo = hub_root / REPO_ID
    shutil.copytree(release, repo)
    data = json.loads((repo / "manifest.json").read_text())
    outputs = next(v["outputs"] for v in data["vendors"].values() if v["outputs"])
    old = dict(outputs[0], path="wheels/old_pkg-0.1-py3-none-any.whl")
    outputs.append(old)
    (repo / old["path"]).parent.mkdir(parents=True, exist_ok=True)
    (repo / old["path"]).write_bytes(b"an earlier release's wheel")
    (repo / "manifest.json").write_text(json.dumps(data))
    (repo / ".gitattributes").write_text("*.whl filter=lfs\n")
    return str(old["path"])


def test_publish_hub_makes_the_repository_equal_to_the_release(
    release: Path, tmp_path: Path
) -> None:
    stale = _seed_earlier_release(tmp_path / "hub", release)
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        res = publish(release, "--to", f"hf://{REPO_ID}", env=hub_env(hub))
    assert res.returncode == 0, res.stderr
    assert ", deleted 1:" in res.stdout
    assert hub.deleted == [stale] and len(hub.commits) == 1
    held = {
        str(p.relative_to(tmp_path / "hub" / REPO_ID))
        for p in (tmp_path / "hub" / REPO_ID).rglob("*")
        if p.is_file()
    }
    assert held == listed(release) | {".gitattributes"}


def test_publish_hub_refuses_files_it_did_not_write_unless_forced(
    release: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "hub" / REPO_ID
    repo.mkdir(parents=True)
    (repo / "notes.md").write_text("someone else's")
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        refused = publish(release, "--to", f"hf://{REPO_ID}", env=hub_env(hub))
        assert refused.returncode == 14 and hub.commits == []
        assert "holds files kiln did not write (notes.md)" in refused.stderr
        assert "--force" in refused.stderr
        forced = publish(release, "--to", f"hf://{REPO_ID}", "--force", env=hub_env(hub))
    assert forced.returncode == 0, forced.stderr
    assert hub.deleted == ["notes.md"] and not (repo / "notes.md").exists()


def test_publish_hub_standin_never_prints_the_token(release: Path, tmp_path: Path) -> None:
    """The stand-in repeats the Authorization header in its error: kiln must not print it."""
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}, echo_token_on_commit=True) as hub:
        res = publish(release, "--to", f"hf://{REPO_ID}", env=hub_env(hub))
    assert res.returncode == 14
    out = res.stdout + res.stderr
    assert "the upload failed, nothing was committed" in out
    assert "Bearer <HF_TOKEN>" in out  # the server's message, token scrubbed
    assert TOKEN not in out and TOKEN[3:] not in out
    assert hub.commits == []
    assert not any(
        TOKEN in p.read_text(errors="replace") for p in release.rglob("*") if p.is_file()
    )


def test_publish_hub_standin_wrong_token_or_repo(release: Path, tmp_path: Path) -> None:
    with StandinHub(tmp_path / "hub", TOKEN, {REPO_ID}) as hub:
        wrong = publish(release, "--to", f"hf://{REPO_ID}", env=hub_env(hub, "hf_wrong"))
        missing = publish(release, "--to", "hf://inferencekey/absent", env=hub_env(hub))
    assert wrong.returncode == 14 and "hf_wrong" not in wrong.stdout + wrong.stderr
    assert missing.returncode == 14
    assert "hf://inferencekey/absent: repository not found" in missing.stderr
    assert hub.commits == []


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("s3://bucket/x", "unknown target"),
        ("hf://just-a-name", "not a Hub model repository"),
        ("file://relative/x", "needs an absolute path"),
    ],
)
def test_publish_refuses_unknown_targets(release: Path, target: str, message: str) -> None:
    res = publish(release, "--to", target)
    assert res.returncode == 14 and message in res.stderr
