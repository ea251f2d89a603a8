"""The release's own workspace passes the release's own checks (issue 41): ``kiln build
--dry-run`` on the repository's kiln.toml, vendors/ and patches/ (what ``nox -s
build_all`` on a fresh clone runs first) lists only the inputs that cannot be had here:
the upstreams on GitHub, the DeepInfer patches on the Hub and the builder image's digest
in its registry. A check that refuses a valid input of the release (as one did: the
runtime requirements' ``torch==2.13.0+cu132`` compared without its local label) fails
this test."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import REPO, run_kiln

UNREACHABLE = [
    # the upstreams: GitHub cannot be reached from here
    re.compile(r"^\w+: cannot reach https://github\.com/deepseek-ai/\w+ "),
    # DeepInfer's own patches, fetched by `kiln lock` from the Hub
    re.compile(
        r"^patch \S+ \(for deepinfer\) is listed in the series but absent: .* fetch it from hf://"
    ),
    # the builder image, pinned by `kiln lock` where its registry answers
    re.compile(r"^image \S+ is not pinned by digest"),
]


def test_the_release_workspace_has_only_unreachable_inputs_left(tmp_path: Path) -> None:
    res = run_kiln(
        "build", "--dry-run", "--json", "--workspace", REPO, "--cache", tmp_path / "cache"
    )
    dry = json.loads(res.stdout)
    problems = dry["problems"]
    assert problems, res.stderr[-2000:]  # the unreachable inputs are named
    left = [p for p in problems if not any(rx.search(p) for rx in UNREACHABLE)]
    assert left == [], left
    named = {p.split(":")[0] for p in problems if "cannot reach" in p}
    assert named == {"deepep", "deepgemm", "deepinfer", "deepselect", "flashmla"}
