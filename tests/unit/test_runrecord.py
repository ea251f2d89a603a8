"""The manifest in two halves (kiln/release/runrecord.py): the release's manifest.json
holds what the inputs decide, the same bytes for two builds whose figures differ; the
run's figures go to artifacts/logs/<release>/run.json and come back on reading, only
into the manifest they were written with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln.orchestrate import learned
from kiln.release import manifest, runrecord
from tests.releases import tiny_release

OUTPUT = "wheels/x-1.0-py3-none-any.whl"


def _with_figures(
    release: Path, wall: float, cpu: float, cache: str = "/root/.cache/kiln"
) -> manifest.Manifest:
    """The tiny release's manifest with one vendor, as a build with these figures made it
    with its toolchain and build venv in ``cache``."""
    m: dict[str, Any] = manifest.read(release / manifest.FILE_NAME).data()
    cuda = f"{cache}/toolchains/cuda-13.2-0123/cuda"
    m["toolchain"].update(
        cuda_home=cuda,
        python=f"{cache}/envs/py3.12/bin/python",
        site_packages=f"{cache}/envs/py3.12/lib/python3.12/site-packages",
        pip_cuda={"cuda_link": "kiln-stub", "cuda_h": f"{cuda}/include/cuda.h"},
    )
    m["vendors"]["x"] = {
        "source": {
            "url": "https://x.invalid/x.git",
            "requested": "a" * 40,
            "commit": "a" * 40,
            "commit_time": 0,
            "submodules": [],
        },
        "patches": [],
        "recipe": {"kind": "wheel"},
        "environment": {"CUDA_HOME": cuda, "TORCH_CUDA_ARCH_LIST": "10.0a"},
        "outputs": [
            {
                "path": OUTPUT,
                "sha256": "b" * 64,
                "size": 1,
                "kind": "wheel",
                "import_proof": {
                    "environment": "e",
                    "requirements": "the profile's torch",
                    "python": "3.12",
                    "driver": "found",
                    "seconds": wall / 10,
                    "modules": [
                        {"module": "x", "kind": "package", "status": "ok", "seconds": wall / 100}
                    ],
                },
            }
        ],
        "timings": {"build": wall},
        "schedule": {"max_jobs": 2, "mem_per_job_gib": 3.0, "estimate_source": "t"},
        "caches": {"artifact": {"status": "miss", "key": "k"}},
        "learned": {
            "recipe": "r",
            "peak_job_gib": 1.0,
            "units": {"a.cu": {"cpu_s": cpu, "rss_gib": 1.0}},
        },
    }
    m["scheduler"] = {"mem_gib": 8.0, "cpus": 2, "source": "test", "wall_s": wall}
    return manifest.parse(m, "test")


def _strip(data: dict[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(json.dumps(data))
    return plain


def test_two_builds_whose_figures_differ_write_the_same_manifest(tmp_path: Path) -> None:
    first = tiny_release(tmp_path / "a" / "artifacts" / "rel")
    second = tiny_release(tmp_path / "b" / "artifacts" / "rel")
    # another run's figures, and its toolchain and build venv in another cache folder
    m1 = _with_figures(first, 10.0, 5.0)
    m2 = _with_figures(second, 13.0, 6.5, cache="/ci/runner/.kiln-cache")
    manifest.write(first / manifest.FILE_NAME, m1)
    manifest.write(second / manifest.FILE_NAME, m2)
    text = (first / manifest.FILE_NAME).read_text()
    assert text == (second / manifest.FILE_NAME).read_text()
    for key in ("timings", "schedule", "caches", "learned", "scheduler", '"seconds"', "cache"):
        assert key not in text, key
    assert '"cuda_link": "kiln-stub"' in text and '"TORCH_CUDA_ARCH_LIST": "10.0a"' in text
    # the figures are in the run record, beside the logs, and read back whole
    record = first.parent / "logs" / "rel" / runrecord.FILE_NAME
    assert record == runrecord.path_for(first / manifest.FILE_NAME) and record.is_file()
    assert manifest.read(first / manifest.FILE_NAME) == m1
    assert manifest.read(second / manifest.FILE_NAME) == m2


def test_a_run_record_of_another_manifest_is_not_read_into_this_one(tmp_path: Path) -> None:
    release = tiny_release(tmp_path / "artifacts" / "rel")
    manifest.write(release / manifest.FILE_NAME, _with_figures(release, 10.0, 5.0))
    record = runrecord.path_for(release / manifest.FILE_NAME)
    kept = record.read_text()
    # another build of this release name wrote its manifest, no figures (a merge): the old
    # run record stays in the logs, and must not be taken for this manifest's
    tiny_release(tmp_path / "other" / "rel")
    (release / manifest.FILE_NAME).write_bytes((tmp_path / "other/rel/manifest.json").read_bytes())
    assert record.read_text() == kept
    entry = manifest.read(release / manifest.FILE_NAME)
    assert entry.scheduler is None and entry.vendors == {}
    # and a record that is not one is ignored, not a crash
    record.write_text("{not json")
    assert manifest.read(release / manifest.FILE_NAME).scheduler is None


def test_split_and_join_are_inverse(tmp_path: Path) -> None:
    release = tiny_release(tmp_path / "artifacts" / "rel")
    data = _with_figures(release, 10.0, 5.0).data()
    what, run = runrecord.split(data)
    assert runrecord.join(what, run) == _strip(data)
    assert run["vendors"]["x"][runrecord.SECONDS] == {OUTPUT: [1.0, 0.1]}
    bare = manifest.read(release / manifest.FILE_NAME).data()  # as read: no figures
    assert runrecord.split(bare)[1] == {"toolchain": {"cuda_home": "/usr/local/cuda"}}
    assert runrecord.join(*runrecord.split(bare)) == bare


def test_learned_from_takes_the_run_record_or_the_manifest_beside_it(tmp_path: Path) -> None:
    release = tiny_release(tmp_path / "artifacts" / "rel")
    manifest.write(release / manifest.FILE_NAME, _with_figures(release, 10.0, 5.0))
    record = runrecord.path_for(release / manifest.FILE_NAME)
    want = {
        "x": {"recipe": "r", "peak_job_gib": 1.0, "units": {"a.cu": {"cpu_s": 5.0, "rss_gib": 1.0}}}
    }
    assert learned.read(record, "--learned-from") == want
    assert learned.read(release / manifest.FILE_NAME, "--learned-from") == want
