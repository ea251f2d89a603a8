"""Runners are told apart in one place (kiln.runners.registry, issue 56 (2)): the rest of
kiln asks a runner's capabilities, never its name, and imports no concrete runner. The
registry's own behaviour: each entry's capabilities name it, ``auto`` takes the first
available (local where no image is named), an unknown name is refused with the choices."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from kiln.errors import ConfigError
from kiln.orchestrate.options import RunnerChoice
from kiln.runners import registry
from kiln.runners.local import LocalRunner
from kiln.runners.protocol import RunnerRequest

KILN = Path(__file__).resolve().parents[2] / "kiln"
_NAME_COMPARED = re.compile(r'runner\.kind\s*(?:==|!=|in\b)|(?:==|!=)\s*"(?:docker|local)"')
_CONCRETE = re.compile(
    r"kiln\.runners\.(?:docker|local)\b|from kiln\.runners import .*\b(?:docker|local)\b"
)


def _lines(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(KILN)}:{n}: {line.strip()}"
        for path in sorted(KILN.rglob("*.py"))
        if path.parent.name != "runners"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_runner_is_told_apart_by_its_name_outside_the_registry() -> None:
    # the compile gate's and the timings' "local" is where a compile ran, not a runner
    found = [x for x in _lines(_NAME_COMPARED) if not x.startswith(("inside/kit/", "timings/"))]
    assert found == [], "a runner's name compared:\n" + "\n".join(found)


def test_no_concrete_runner_is_imported_outside_the_runners() -> None:
    assert _lines(_CONCRETE) == []


def _request(tmp_path: Path, image: str | None = None) -> RunnerRequest:
    return RunnerRequest(
        image=image, python=None, cuda_home=None, cache=tmp_path, logs=tmp_path,
        pypi_cuda=None, dry=True, allow_network=True, allow_unpinned_image=False,
        docker_dir=tmp_path, build_args={}, mounts=(), keep_container=False,
    )  # fmt: skip


def test_each_runner_declares_its_capabilities_under_its_name() -> None:
    for name, kind in registry.RUNNERS.items():
        assert kind.capabilities().kind == name
        assert registry.capabilities(name) == kind.capabilities()
    with pytest.raises(ConfigError, match=r"runner 'pod': not a runner kiln has \(docker, local\)"):
        registry.capabilities("pod")


def test_auto_is_local_where_no_image_is_named_and_a_name_is_checked(tmp_path: Path) -> None:
    assert isinstance(registry.make("auto", _request(tmp_path)), LocalRunner)
    with pytest.raises(
        ConfigError, match=r"--runner pod: unknown runner \(choose: auto, docker, local\)"
    ):
        registry.make("pod", _request(tmp_path))
    with pytest.raises(ConfigError, match="--runner docker needs an image"):
        registry.make("docker", _request(tmp_path))


def test_the_runner_option_offers_the_registrys_runners() -> None:
    assert sorted(get_args(RunnerChoice)) == sorted(["auto", *registry.RUNNERS])
