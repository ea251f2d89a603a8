"""pip's settings carried to uv (kiln/toolchain/pipconfig.py), and the consumer
environment's commands with and without uv (kiln/toolchain/consumerenv.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kiln.toolchain import consumerenv, pipconfig, uvtool

LISTING = """\
:env:.find-links='/opt/env-wheels'
:env:.no-index='1'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://global.invalid/simple'
install.index-url='https://install.invalid/simple'
global.default-timeout='180'
global.trusted-host='mirror.invalid'
not a setting line
"""


def test_pip_precedence_environment_over_install_over_global() -> None:
    pip = pipconfig.parse(LISTING)
    assert pip["find-links"] == "/opt/env-wheels"
    assert pip["index-url"] == "https://install.invalid/simple"
    assert pip["extra-index-url"] == "file:///opt/pypi/simple file:///opt/pypi-more/simple"


def test_uv_arguments_fetch_from_what_pip_would() -> None:
    uv = pipconfig.uv_settings(pipconfig.parse(LISTING))
    assert list(uv.args) == [
        "--index-strategy",
        "unsafe-best-match",
        "--index-url",
        "https://install.invalid/simple",
        "--extra-index-url",
        "file:///opt/pypi/simple",
        "--extra-index-url",
        "file:///opt/pypi-more/simple",
        "--find-links",
        "/opt/env-wheels",
        "--no-index",
        "--constraint",
        "/etc/xdg/pip/constraints.txt",
        "--allow-insecure-host",
        "mirror.invalid",
    ]
    assert uv.env == {
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        "UV_HTTP_TIMEOUT": "180",
    }


def test_a_hashed_lock_drops_pips_constraints() -> None:
    """uv refuses a constraint that is not an exact pin in --require-hashes mode (this
    machine's pip caps torch with one): a hashed lock is installed without them."""
    uv = pipconfig.uv_settings(pipconfig.parse(LISTING))
    hashed = uv.for_hashed()
    assert "--constraint" not in hashed.args and "/etc/xdg/pip/constraints.txt" not in hashed.args
    assert "--find-links" in hashed.args and hashed.env == uv.env


def test_an_empty_setting_clears_the_files_one_as_pip_does() -> None:
    """PIP_FIND_LINKS="" overrides a config file's find-links: no link is passed."""
    uv = pipconfig.uv_settings(pipconfig.parse(":env:.find-links=''\nglobal.find-links='/x'\n"))
    assert "--find-links" not in uv.args


def test_this_machines_pip_listing_parses() -> None:
    """The real ``pip config list`` of this Python: every line it prints about indexes
    is read (a format change in pip would leave uv on its defaults: red here)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    wanted = [ln for ln in out.splitlines() if ".find-links=" in ln or ".index-url=" in ln]
    pip = pipconfig.parse(out)
    for line in wanted:
        key = line.split("=", 1)[0].split(".", 1)[1]
        assert key in pip, line


def _env(tmp_path: Path, requirements: str, uv: str | None) -> consumerenv.ConsumerEnv:
    return consumerenv.plan(tmp_path, "3.11", sys.executable, requirements, None, "local:", uv)


def test_uv_installs_with_hardlinks_from_a_cache_beside_the_environments(tmp_path: Path) -> None:
    uv = uvtool.binary()
    assert uv is not None, "kiln's pinned uv is a dependency: its binary must be found"
    env = _env(tmp_path, "six==1.16.0 --hash=sha256:ab\n", uv)
    (venv, _), (install, _) = env.commands(pipconfig.UvSettings(("--no-index",), {}))
    assert "--without-pip" in venv  # uv installs: the venv needs no pip of its own
    assert install[:3] == [uv, "pip", "install"]
    assert install[install.index("--cache-dir") + 1] == str(tmp_path / "envs" / ".uv-cache")
    assert install[install.index("--link-mode") + 1] == "hardlink"
    assert "--require-hashes" in install and "--no-index" in install
    assert "--compile-bytecode" not in install and "--no-config" in install  # the proofs do


def test_pip_installs_where_kiln_has_no_uv(tmp_path: Path) -> None:
    env = _env(tmp_path, "six==1.16.0\n", None)
    (venv, _), (install, _) = env.commands()
    assert "--without-pip" not in venv
    assert install[1:4] == ["-m", "pip", "install"]


def test_the_installer_is_part_of_the_environments_identity(tmp_path: Path) -> None:
    with_uv = _env(tmp_path, "six==1.16.0\n", uvtool.binary())
    with_pip = _env(tmp_path, "six==1.16.0\n", None)
    assert with_uv.root != with_pip.root


def test_uv_makes_a_real_environment_that_shares_the_cache(tmp_path: Path) -> None:
    """Two environments of one requirement from a local wheel: the second's files are
    the first's (hard links: one inode), and the distribution imports."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            "-d",
            str(wheels),
            "six==1.16.0",
        ],
        check=True,
    )
    uv = uvtool.binary()
    settings = pipconfig.UvSettings(("--no-index", "--find-links", str(wheels)), {})
    made = []
    for where in ("local:a", "local:b"):
        env = consumerenv.plan(tmp_path, "3.11", sys.executable, "six==1.16.0\n", None, where, uv)
        for i, (argv, _) in enumerate(env.commands(settings)):
            if i == 1:
                (env.root / consumerenv.REQUIREMENTS_FILE).write_text(env.requirements)
            subprocess.run(argv, check=True, capture_output=True)
        made.append(env)
    a, b = (e.site_packages() / "six.py" for e in made)
    assert a.stat().st_ino == b.stat().st_ino
    subprocess.run([str(made[1].python), "-c", "import six"], check=True)


def _kiln_venv(cache: Path) -> str:
    """A build venv's python path as kiln lays it out (``CACHE/envs/NAME/bin/python``),
    with its folder's uv cache."""
    (cache / "envs" / uvtool.CACHE).mkdir(parents=True)
    return str(cache / "envs" / "py3.11-torch" / "bin" / "python")


def test_a_consumer_environment_links_from_the_cache_that_filled_the_build_venv(
    tmp_path: Path,
) -> None:
    """A cold run's empty kiln cache, with a build venv kiln made in another cache on
    the same filesystem: uv links from the build venv's cache (torch unpacked once)."""
    python = _kiln_venv(tmp_path / "kept")
    cold = tmp_path / "cold"
    kept = tmp_path / "kept" / "envs" / ".uv-cache"
    assert uvtool.shared_cache(python, cold / "envs") == kept
    env = consumerenv.plan(
        cold, "3.11", python, "six==1.16.0\n", None, "local:", uvtool.binary(),
        uvtool.shared_cache(python, cold / "envs"),
    )  # fmt: skip
    (_, _), (install, _) = env.commands(pipconfig.UvSettings())
    assert install[install.index("--cache-dir") + 1] == str(kept)
    # the cache it links from is not part of its identity: the same files either way
    plain = consumerenv.plan(cold, "3.11", python, "six==1.16.0\n", None, "local:", uvtool.binary())
    assert env.root == plain.root


def test_the_environments_own_cache_where_the_build_venv_has_none_to_share(
    tmp_path: Path,
) -> None:
    """Not a venv kiln made (no uv cache beside it), or the build venv's own cache:
    the environments folder's own cache."""
    own = tmp_path / "cold" / "envs" / ".uv-cache"
    assert uvtool.shared_cache(sys.executable, tmp_path / "cold" / "envs") == own
    python = _kiln_venv(tmp_path / "cold")
    assert uvtool.shared_cache(python, tmp_path / "cold" / "envs") == own
    bare = tmp_path / "bare" / "envs" / "py3.11" / "bin" / "python"
    assert uvtool.shared_cache(str(bare), tmp_path / "cold" / "envs") == own


def test_no_cache_of_another_filesystem_is_linked_from(tmp_path: Path) -> None:
    """Hard links cross no filesystem: a build venv's cache on another one (tmpfs here)
    is not used."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        import pytest

        pytest.skip("no second filesystem here")
    other = Path(tempfile.mkdtemp(dir=shm))
    try:
        python = _kiln_venv(other)
        own = tmp_path / "envs" / ".uv-cache"
        assert uvtool.shared_cache(python, tmp_path / "envs") == own
    finally:
        shutil.rmtree(other)
