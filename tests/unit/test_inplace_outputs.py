"""An in-place build's outputs (``build.outputs``) never name kiln's own ``.kiln/``: the
kit links this machine's CUDA libraries there, and ``kiln add`` drafts ``**/*.so`` for a
build.sh upstream (issue 40: the refusal blamed ``.kiln/host/links/libcublas.so``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.errors import VerifyError
from kiln.orchestrate.kinds.inplace import find_outputs


def test_outputs_never_match_kilns_own_kit(tmp_path: Path) -> None:
    for rel in (".kiln/host/links/libcublas.so", ".kiln/objcache/x.so", "pkg/_C.so", "lib.so"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"\x7fELF")
    found = find_outputs(tmp_path, ["**/*.so"], "v")
    assert [str(p.relative_to(tmp_path)) for p in found] == ["lib.so", "pkg/_C.so"]
    (tmp_path / "pkg/_C.so").unlink()
    (tmp_path / "lib.so").unlink()
    with pytest.raises(VerifyError, match=r"^v: the build left none of \*\*/\*\.so in the tree"):
        find_outputs(tmp_path, ["**/*.so"], "v")
