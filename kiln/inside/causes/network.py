"""The row of a build step that reached for the network (hermetic steps cannot)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from kiln.errors import FixEdit
from kiln.inside import netrefuse
from kiln.inside.causes.cause import Cause, Failure, toml_edit

_NET_ERROR = re.compile(
    r"urlopen error|Name or service not known|Temporary failure in name resolution|"
    r"Could not resolve host|Network is unreachable|No route to host|Connection refused|"
    r"getaddrinfo failed|Failed to establish a new connection"
)
_URL = re.compile(r"https?://[^\s'\"<>)\]]+")
# what kiln.inside.netrefuse wrote: the step's proxy refused this request
_REFUSED = re.compile(re.escape(netrefuse.MARK) + r"(\S+)")
_SWITCH = re.compile(
    r"os\.(?:getenv|environ\.get)\(\s*[\"'](?P<var>\w+)[\"']\s*(?:,\s*[\"'](?P<default>[^\"']*)"
    r"[\"']\s*)?\)\s*(?P<op>==|!=)\s*[\"'](?P<value>[^\"']*)[\"']"
)


def _download_switch(f: Failure) -> str | None:
    found = _download_switch_edit(f)
    return found[0] if found else None


def _download_switch_edit(f: Failure) -> tuple[str, FixEdit] | None:
    """The setup.py switch that builds from source instead of downloading: a variable
    compared with a constant (``os.getenv("X_FORCE_BUILD", "FALSE") == "TRUE"``), and
    what the recipe sets it to now."""
    try:
        text = (f.tree / "setup.py").read_text(errors="replace")
    except OSError:
        return None
    found = list(_SWITCH.finditer(text))
    preferred = [m for m in found if re.search(r"FORCE|BUILD|SOURCE|DOWNLOAD|SKIP", m["var"])]
    for m in preferred or found:
        line = text.count("\n", 0, m.start()) + 1
        have = f.env.get(m["var"])
        want = m["value"]
        if have == want:
            continue  # set as compared: not what let the download happen
        now = (
            f'vendors/{f.vendor}.toml sets {m["var"]} = "{have}", but setup.py:{line} compares '
            f'it with {m["op"]} "{want}"'
            if have is not None
            else f'setup.py:{line} reads {m["var"]} (compared with {m["op"]} "{want}")'
        )
        said = f'{now}: set {m["var"]} = "{want}" in [build.env] of vendors/{f.vendor}.toml'
        return said, toml_edit(f.vendor, ["build", "env", m["var"]], set_to=want)
    return None


def _download_in_setup(f: Failure) -> str | None:
    """The URL setup.py downloads, with its line (a traceback of setup.py run by
    setuptools shows no source lines, so the output may not have it)."""
    try:
        lines = (f.tree / "setup.py").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines, 1):
        found = _URL.search(line)
        if found and re.search(r"urlopen|urlretrieve|download|wget|curl|requests\.get", line):
            return f"{found.group(0)} (setup.py:{i})"
    return None


def _host_and_path(url: str) -> tuple[str | None, bool]:
    """A URL's host, and whether it names more than the host (a path)."""
    try:
        parts = urlsplit(url.split()[0])
    except (ValueError, IndexError):
        return None, False
    return parts.hostname, parts.path not in ("", "/")


def _fuller(refused: str, candidates: list[str]) -> str:
    """An HTTPS request is all a proxy sees of it: ``https://HOST:443``. The output's or
    setup.py's URL on the same host says more (its path, setup.py's line): that one."""
    host, has_path = _host_and_path(refused)
    if has_path or host is None:
        return refused
    return next((c for c in candidates if _host_and_path(c) == (host, True)), refused)


def network_download(f: Failure) -> Cause | None:
    """The upstream's build reached for the network (a prebuilt wheel, a submodule
    fetched at build time): builds are offline."""
    # the attempt itself, whatever made it: the step's proxy's lines (in the log, and in
    # its record where this runs in the step itself)
    refused = _REFUSED.findall(f.output + netrefuse.recorded())
    m = _NET_ERROR.search(f.output)
    if not m and not refused:
        return None
    urls = _URL.findall(f.output[: m.end() + 400]) if m else []
    in_setup = _download_in_setup(f)
    url = (
        _fuller(refused[0], [*reversed(urls), in_setup or ""])
        if refused
        else urls[-1]
        if urls
        else in_setup or "something from the network"
    )
    switch = _download_switch_edit(f)
    return Cause(
        "network-download",
        f"the upstream's build tried to download {url}, and builds are offline (kiln fetches "
        "sources first; a build step never reaches the network)",
        switch[0]
        if switch
        else "set the upstream's switch that builds from source instead of downloading (read "
        "its setup.py), in [build.env] of the vendor TOML; or put what it downloads in the tree "
        "(a submodule, a patch)",
        edit=switch[1] if switch else None,
    )
