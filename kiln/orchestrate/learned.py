"""What a build learned travels: per unit its CPU time and peak memory, per step its link
time, so that a fresh machine's first build (a CI runner, a new pod, a teammate's
laptop) is scheduled like the tenth: each unit's own memory reserved at the compile
gate, the longest units first.

Where it lives (docs/performance.md):
- this cache's ``peaks.json``: what builds with this cache measured (``plan.schedule``);
- every build's run record: ``vendors.<name>.learned`` of ``artifacts/logs/<release>/
  run.json`` (beside the release, not in it: its figures differ from build to build), so
  ``--learned-from`` that file, or the release's ``manifest.json`` where its run record
  is found, starts from any build;
- the workspace's ``learned.json``, committed beside ``kiln.toml``: read by every build
  by default, written by ``kiln build --save-learned``.

Figures are keyed by vendor and recipe fingerprint (the vendor's ``[build]``, archs
included) and, per unit, by its path in the tree: they mean the same in another folder
and on another machine, and a changed recipe ignores them. What is taken, in order:
``--learned-from`` (named, so it wins), then this cache's own, then the workspace's
``learned.json``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Literal, cast

from pydantic import Field, ValidationError

from kiln.config.models import Vendor
from kiln.errors import ConfigError, ManifestError
from kiln.plan import schedule
from kiln.release import manifest, runrecord
from kiln.release.manifest import LearnedVendor, Model

log = logging.getLogger(__name__)

SCHEMA_ID = "kiln.learned/1"
FILE_NAME = "learned.json"
FIX = (
    "pass a build's run record (artifacts/logs/<release>/run.json), its release's "
    "manifest.json, or a learned.json kiln wrote (kiln build --save-learned)"
)


class LearnedFile(Model):
    """The workspace's ``learned.json``: the manifest's ``learned`` records by vendor."""

    schema_id: Literal["kiln.learned/1"] = Field(alias="schema")
    vendors: dict[str, LearnedVendor]


def _entry(record: LearnedVendor) -> schedule.LearnedEntry:
    """A record the model has read, as the store holds it (the same keys: the model's
    fields are the store entry's)."""
    return cast(schedule.LearnedEntry, record.data())


def read(path: Path, what: str) -> dict[str, schedule.LearnedEntry]:
    """Per vendor its learned record (as the store holds it), from a ``learned.json`` or a release's
    ``manifest.json``; a file that is neither is one line naming it and the fix."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what} {path}: no such file: {FIX}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {path}: cannot be read ({exc}): {FIX}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{what} {path}: not JSON ({exc.msg}, line {exc.lineno}): {FIX}"
        ) from None
    kind = data.get("schema") if isinstance(data, dict) else None
    if kind == manifest.SCHEMA_ID:
        try:
            found = manifest.read(path)  # with its run record's figures, where found
        except ManifestError as exc:
            raise ConfigError(f"{what} {exc}: {FIX}") from None
        return {n: _entry(e.learned) for n, e in found.vendors.items() if e.learned is not None}
    if kind == runrecord.SCHEMA_ID:
        vendors = data.get("vendors") or {}
        try:
            return {
                n: _entry(LearnedVendor.model_validate(v["learned"]))
                for n, v in vendors.items()
                if v.get("learned")
            }
        except ValidationError as exc:
            raise ConfigError(f"{what} {path}: {exc.errors()[0]['msg']}: {FIX}") from None
    if kind == SCHEMA_ID:
        try:
            learned = LearnedFile.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = "/".join(str(p) for p in err["loc"])
            raise ConfigError(f"{what} {path}: {where}: {err['msg']}: {FIX}") from None
        return {n: _entry(v) for n, v in learned.vendors.items()}
    raise ConfigError(
        f"{what} {path}: neither a kiln manifest nor kiln's learned data "
        f"(schema {kind!r}, expected {manifest.SCHEMA_ID!r}, {runrecord.SCHEMA_ID!r} or "
        f"{SCHEMA_ID!r}): {FIX}"
    )


def open_store(
    cache: Path, workspace: Path, learned_from: Path | None, vendors: list[Vendor]
) -> schedule.PeakStore:
    """This cache's learned figures, with the workspace's ``learned.json`` filling what
    it does not know and ``--learned-from`` in place of both, for ``vendors``."""
    store = schedule.PeakStore(cache / "peaks.json")
    committed = workspace / FILE_NAME
    entries = read(committed, "learned data") if committed.is_file() else {}
    if entries:
        taken = store.adopt(entries, vendors, override=False)
        if taken:
            log.info("learned data for %s from %s", ", ".join(taken), committed)
    if learned_from is not None:
        offered = read(learned_from, "--learned-from")
        taken = store.adopt(offered, vendors, override=True)
        missed = [v.name for v in vendors if v.name not in taken]
        if taken:
            log.info("learned data for %s from %s", ", ".join(taken), learned_from)
        if missed:
            log.warning(
                "--learned-from %s: nothing for this recipe of %s (%s): planned from %s",
                learned_from,
                ", ".join(missed),
                "another recipe or archs there" if set(missed) & set(offered) else "not in it",
                "this cache's figures or the recipe",
            )
    # a committed file that silently stopped matching (the recipe changed since it was
    # saved) cost examples/public's CI build its schedule: said, unless --learned-from or
    # this cache knows the recipe as it is now
    stale = stale_entries(entries, store, vendors)
    if stale:
        log.warning(
            "%s: the figures of %s were learned with another recipe: not used, so this "
            "build is planned from the recipe's guesses (refresh the file: kiln build "
            "--save-learned, or --learned-from a run.json of this recipe)",
            committed,
            ", ".join(stale),
        )
    return store


def stale_entries(
    entries: dict[str, schedule.LearnedEntry], store: schedule.PeakStore, vendors: list[Vendor]
) -> list[str]:
    """The vendors of this build whose entry in ``entries`` is for another recipe than
    theirs, where ``store`` knows nothing of their current one either."""
    return [
        v.name
        for v in vendors
        if v.name in entries
        and entries[v.name].get("recipe") != schedule.recipe_fingerprint(v)
        and store.entry(v) is None
    ]


def save(workspace: Path, store: schedule.PeakStore, vendors: list[Vendor]) -> Path:
    """Write the workspace's ``learned.json``: what it held, with each of ``vendors``'
    records replaced by what ``store`` knows of its current recipe now."""
    path = workspace / FILE_NAME
    records = read(path, "learned data") if path.is_file() else {}
    for vendor in vendors:
        found = record(store.entry(vendor))
        if found is not None:
            records[vendor.name] = _entry(found)
    whole = LearnedFile.model_validate({"schema": SCHEMA_ID, "vendors": records})
    tmp = path.with_name(f".{FILE_NAME}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(whole.data(), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    log.info("learned data written: %s", path)
    return path


def record(entry: schedule.LearnedEntry | None) -> LearnedVendor | None:
    """The manifest's ``learned`` for a vendor: the store's entry for its recipe, with
    this run's figures taken in (None: nothing, or a cache file from another kiln that
    does not read as one)."""
    try:
        return LearnedVendor.model_validate(entry) if entry is not None else None
    except ValidationError:
        return None
