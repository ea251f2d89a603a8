"""``kiln publish``: put a checked release into a folder or a Hugging Face Hub repository.

Targets: a local or mounted folder (``/srv/releases/x``, ``file:///srv/releases/x``) and a
Hub model repository (``hf://ORG/NAME``). The release is re-hashed
against its manifest first; a release with one changed byte is refused before anything is
written or sent. What is published is exactly ``manifest.json`` plus every file it lists,
all at once: a folder is staged beside the target and swapped in, the Hub gets one commit
that also deletes what the release no longer has (an earlier release's wheel), so the
target equals the release. A target holding files kiln did not write (a folder or Hub
repository without a kiln manifest, or with files that manifest does not list) is
refused unless ``--force``.

The Hub token is read from ``$HF_TOKEN`` or the Hub's own login (``hf auth login``, through
huggingface_hub's ``get_token``), never from an argument (which would land in shell
history and process lists), and scrubbed from every message kiln prints: it is never
printed, logged, or written to a file or the manifest.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln import fsutil
from kiln.errors import PublishError
from kiln.release import manifest, signing

log = logging.getLogger(__name__)

TOKEN_ENV = "HF_TOKEN"
ENDPOINT_ENV = "HF_ENDPOINT"  # huggingface_hub's own variable: another Hub (or a stand-in)
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Target:
    kind: str  # "folder" or "hub"
    where: str  # the folder's path, or the Hub repository id

    def __str__(self) -> str:
        return f"hf://{self.where}" if self.kind == "hub" else self.where


def parse_target(text: str) -> Target:
    if text.startswith("hf://"):
        repo = text.removeprefix("hf://").strip("/")
        if not REPO_RE.match(repo):
            raise PublishError(
                f"--to {text}: not a Hub model repository; write hf://ORG/NAME "
                f"(ORG and NAME as on the Hub)"
            )
        return Target("hub", repo)
    if text.startswith("file://"):
        path = text.removeprefix("file://")
        if not path.startswith("/"):
            raise PublishError(f"--to {text}: a file:// URL needs an absolute path (file:///srv/x)")
        return Target("folder", path)
    if "://" in text:
        raise PublishError(
            f"--to {text}: unknown target; publish to a folder (a path or file:///PATH) "
            f"or to the Hub (hf://ORG/NAME)"
        )
    return Target("folder", str(Path(text).absolute()))


def checked_files(release: Path) -> list[tuple[str, int]]:
    """``manifest.json`` and every file it lists, as (path, size), after a full re-hash."""
    path = release / manifest.FILE_NAME
    data = manifest.read(path)
    problems = manifest.check(path)
    if problems:
        p = problems[0]
        raise PublishError(
            f"{release}: {p.path}: {p.problem} ({len(problems)} file(s) differ from "
            f"manifest.json); nothing was published: rebuild the release or restore the file"
        )
    files = {o.path: o.size for o in data.outputs()}
    files[manifest.FILE_NAME] = path.stat().st_size
    for name in signing.SIGNATURE_FILES:  # the signature travels with the release
        if (release / name).is_file():
            files[name] = (release / name).stat().st_size
    return sorted(files.items())


def scrub(text: str, token: str | None) -> str:
    return text.replace(token, "<HF_TOKEN>") if token else text


# Files a Hub repository has that no release lists: the Hub writes it on creation.
HUB_OWN = set(signing.HUB_CLIENT_FILES)


def foreign_files(present: set[str], old_manifest: bytes | None) -> list[str]:
    """Of the files a target holds, those kiln did not write: all of them without a kiln
    manifest there, else those the earlier release's manifest does not list."""
    owned = set(HUB_OWN)
    if old_manifest is not None:
        try:
            old = manifest.Manifest.model_validate_json(old_manifest)
        except ValueError:
            old = None
        if old is not None:
            owned |= {o.path for o in old.outputs()} | {manifest.FILE_NAME}
            owned |= set(signing.SIGNATURE_FILES)
    return sorted(present - owned)


def _refuse_foreign(target: Target, foreign: list[str]) -> None:
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    raise PublishError(
        f"--to {target}: holds files kiln did not write ({shown}); publishing makes the "
        f"target equal to the release and would delete them: name another target, or pass "
        f"--force to replace them; nothing was published"
    )


def _to_folder(
    release: Path, files: list[tuple[str, int]], target: Target, force: bool = False
) -> str:
    dest = Path(target.where)
    if dest.resolve() == release.resolve():
        raise PublishError(f"--to {dest}: that is the release folder itself")
    if dest.exists() and not dest.is_dir():
        raise PublishError(f"--to {dest}: exists and is not a folder: name a folder")
    if dest.is_dir() and not force:
        present = {str(p.relative_to(dest)) for p in dest.rglob("*") if not p.is_dir()}
        old = dest / manifest.FILE_NAME
        foreign = foreign_files(present, old.read_bytes() if old.is_file() else None)
        if foreign:
            _refuse_foreign(target, foreign)
    with fsutil.staged_dir(dest) as stage:
        for rel, _size in files:
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(release / rel, stage / rel)
        problems = manifest.check(stage / manifest.FILE_NAME)
        if problems:
            raise PublishError(f"{dest}: {problems[0].path}: {problems[0].problem} after copying")
        fsutil.swap_in(stage, dest)
    return f"published {len(files)} files to {dest}"


def _hub_state(api: object, repo: str, token: str) -> tuple[set[str], bytes | None]:
    """The files the repository holds now, and its manifest.json if it has one."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import build_hf_headers, get_session

    present = {f.path for f in api.list_repo_tree(repo, recursive=True) if isinstance(f, RepoFile)}  # type: ignore[attr-defined]
    if manifest.FILE_NAME not in present:
        return present, None
    url = hf_hub_url(repo, manifest.FILE_NAME, endpoint=api.endpoint)  # type: ignore[attr-defined]
    res = get_session().get(url, headers=build_hf_headers(token=token), follow_redirects=True)
    res.raise_for_status()
    return present, res.content


def _to_hub(
    release: Path, files: list[tuple[str, int]], target: Target, force: bool = False
) -> str:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, get_token
    from huggingface_hub.errors import RepositoryNotFoundError
    from huggingface_hub.utils import disable_progress_bars

    token = get_token()  # $HF_TOKEN, else the token `hf auth login` saved
    if not token:
        raise PublishError(
            f"no Hugging Face token: export {TOKEN_ENV} or run `hf auth login` with a token "
            f"that can write to {target.where}; nothing was uploaded"
        )
    disable_progress_bars()
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # one line per request otherwise
        logging.getLogger("httpx").setLevel(logging.WARNING)
    api = HfApi(endpoint=os.environ.get(ENDPOINT_ENV) or None, token=token)
    name = manifest.read(release / manifest.FILE_NAME).release.name
    digest = fsutil.sha256_file(release / manifest.FILE_NAME)
    try:
        present, old_manifest = _hub_state(api, target.where, token)
    except RepositoryNotFoundError:
        raise PublishError(
            f"{target}: repository not found, or the token cannot write to it: create the "
            f"model repository on the Hub (or fix the token) and rerun; nothing was committed"
        ) from None
    except Exception as exc:  # huggingface_hub's HTTP and network errors
        detail = scrub(" ".join(str(exc).split()), token)[:400]
        raise PublishError(
            f"{target}: listing its files failed, nothing was committed: "
            f"{type(exc).__name__}: {detail}"
        ) from None
    foreign = foreign_files(present, old_manifest)
    if foreign and not force:
        _refuse_foreign(target, foreign)
    keep = {rel for rel, _ in files} | HUB_OWN
    stale = sorted(present - keep)
    operations: list[CommitOperationAdd | CommitOperationDelete] = [
        CommitOperationAdd(path_in_repo=rel, path_or_fileobj=release / rel) for rel, _ in files
    ]
    operations += [CommitOperationDelete(path_in_repo=rel) for rel in stale]
    log.info(
        "uploading %d files to %s in one commit%s",
        len(files),
        target,
        f", deleting {len(stale)} the release no longer has" if stale else "",
    )
    try:
        info = api.create_commit(
            repo_id=target.where,
            repo_type="model",
            operations=operations,
            commit_message=f"{name}: kiln release ({len(files)} files)",
            commit_description=f"manifest.json sha256 {digest}",
        )
    except RepositoryNotFoundError:
        raise PublishError(
            f"{target}: repository not found, or the token cannot write to it: create the "
            f"model repository on the Hub (or fix the token) and rerun; nothing was committed"
        ) from None
    except Exception as exc:  # huggingface_hub's HTTP, network and validation errors
        detail = scrub(" ".join(str(exc).split()), token)[:400]
        raise PublishError(
            f"{target}: the upload failed, nothing was committed: {type(exc).__name__}: {detail}"
        ) from None
    deleted = f", deleted {len(stale)}" if stale else ""
    return f"published {len(files)} files to {target} in one commit{deleted}: {info.commit_url}"


def publish(
    release: Path,
    to: str,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
    force: bool = False,
) -> str:
    """Check ``release`` and publish it to ``to``; return the one-line result."""
    target = parse_target(to)
    files = checked_files(release)
    if dry_run:
        total = sum(size for _, size in files)
        for rel, size in files:
            say(f"{size:>14,}  {rel}")
        return (
            f"dry run: would upload {len(files)} files ({total:,} bytes) to {target}; "
            f"nothing was uploaded"
        )
    if target.kind == "hub":
        return _to_hub(release, files, target, force)
    return _to_folder(release, files, target, force)
