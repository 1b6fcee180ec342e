"""A completed run directory read back (``StoredRun``, ``load_run``, ``verify_manifest``), a
run's shards in plan order (``read_shards``: the runner's, before it analyses), and
``latest_run``. The rules: docs/run-directory.md "Integrity rules and layout"; the details:
docs/internals.md "spectest/stored.py".
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.errors import ConfigError, InputError
from spectest.files import atomic_write_json, read_provenance, read_table, sha256_file
from spectest.store import (
    COMPLETE_KEY,
    DATA_FILES,
    DATA_FILES_KEY,
    MANIFEST,
    PROTOCOL_FILE,
    RENDERED,
    REQUIRED_FILES,
    RUN_INFO,
    SAMPLES,
    SUMMARY,
    RunDir,
    file_entry,
    read_object,
)


@dataclass(frozen=True)
class StoredRun:
    """A completed run directory, read back (tables a run kind does not produce: ``None``)."""

    path: Path
    info: dict[str, Any]
    manifest: dict[str, Any]
    summary: dict[str, Any]

    def table(self, name: str, columns: Sequence[str] | None = None) -> pd.DataFrame | None:
        """Read one of the final tables (``samples.parquet`` ...; ``columns``: only those),
        ``None`` when absent."""
        p = self.path / name
        if not p.is_file():
            return None
        return read_table(p, columns)

    @property
    def provenance(self) -> dict[str, Any]:
        """The manifest's provenance, else that of samples.parquet (before the manifest exists)."""
        prov = self.manifest.get("provenance")
        if prov:
            return dict(prov)
        f = self.path / SAMPLES
        return read_provenance(f) if f.is_file() else {}

    @property
    def protocol_file(self) -> Path | None:
        p = self.path / PROTOCOL_FILE
        return p if p.is_file() else None


def load_run(path: str | os.PathLike[str], *, require_manifest: bool = True) -> StoredRun:
    """A completed run directory; an incomplete one or one whose files changed since the
    manifest is an ``InputError`` (``require_manifest=False``: the runner's reports, before its
    manifest; nothing verified)."""
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{p}: no such run directory")
    mpath = p / MANIFEST
    if require_manifest and not mpath.is_file():
        raise InputError(
            f"{p}: no {MANIFEST}: the run is incomplete (interrupted?); re-run it to resume"
        )
    manifest = read_object(mpath) if mpath.is_file() else {}
    summary = read_object(p / SUMMARY)  # each JSON file is named when damaged
    if require_manifest and summary.get(COMPLETE_KEY) is False:
        raise InputError(
            f"{p}: {SUMMARY} says complete: false: the run was interrupted while finishing; "
            "re-run it to resume"
        )
    if require_manifest:
        verify_manifest(p, manifest)
    info = read_object(p / RUN_INFO)
    return StoredRun(path=p, info=info, manifest=manifest, summary=summary)


def verify_manifest(p: Path, manifest: Mapping[str, Any]) -> None:
    """``InputError`` naming the first file that fails: every data file listed (rendered views
    aside) has its size and sha256, and every data file the run must have is listed
    (``REQUIRED_FILES`` of its kind, summary.json's ``data_files``, any on disk)."""
    files = manifest.get("files") if isinstance(manifest, Mapping) else None
    if not isinstance(files, Mapping) or not all(isinstance(e, Mapping) for e in files.values()):
        raise InputError(f"{p / MANIFEST}: damaged ('files' must map each name to its entry)")
    for name, entry in sorted(files.items()):
        if name in RENDERED:
            continue
        f = p / name
        if not f.is_file():
            raise InputError(f"{f}: listed in {MANIFEST} but missing")
        size = f.stat().st_size
        if size != entry.get("bytes"):
            raise InputError(
                f"{f}: size differs from {MANIFEST} ({size} != {entry.get('bytes')}): "
                "modified after the run"
            )
        digest = sha256_file(f)
        if digest != entry.get("sha256"):
            raise InputError(
                f"{f}: sha256 differs from {MANIFEST} ({digest[:12]}… != "
                f"{str(entry.get('sha256'))[:12]}…): modified after the run"
            )

    def unlisted(name: str, why: str) -> InputError:
        return InputError(
            f"{p / name}: not listed in {MANIFEST} although {why}: the manifest was edited "
            "(tampering?); re-run to regenerate the directory"
        )

    for name in DATA_FILES:  # a data file on disk the manifest does not vouch for
        if name not in files and (p / name).is_file():
            raise unlisted(name, "the run directory holds it")
    if RUN_INFO not in files:
        raise unlisted(RUN_INFO, "every run directory has it")
    kind = read_object(p / RUN_INFO).get("kind")  # verified above
    if kind not in REQUIRED_FILES or manifest.get("kind") not in (None, kind):
        raise InputError(
            f"{p / RUN_INFO}: kind {kind!r} (manifest: {manifest.get('kind')!r}) is not one of "
            f"{sorted(REQUIRED_FILES)}: a damaged run directory"
        )
    for name in REQUIRED_FILES[kind]:
        if name not in files:
            raise unlisted(name, f"every run of kind {kind!r} has it")
    written = read_object(p / SUMMARY).get(DATA_FILES_KEY) or []  # verified above
    for name in written if isinstance(written, list) else []:
        if isinstance(name, str) and name not in files:
            raise unlisted(name, f"{SUMMARY} says the run wrote it")


def update_manifest_entries(path: str | os.PathLike[str], names: Iterable[str]) -> bool:
    """Whether the manifest changed when the entries of the rendered views ``names`` were
    re-listed (every other entry kept byte for byte). The caller holds the lock."""
    p = Path(path)
    names = list(names)
    if bad := [n for n in names if n not in RENDERED]:
        raise ValueError(f"update_manifest_entries: {bad!r} are not rendered views")
    manifest = read_object(p / MANIFEST)
    files = dict(manifest.get("files") or {})
    for name in names:
        f = p / name
        if f.is_file():
            files[name] = file_entry(f)
        else:
            files.pop(name, None)
    if files == manifest.get("files"):
        return False
    atomic_write_json(p / MANIFEST, {**manifest, "files": dict(sorted(files.items()))})
    return True


def latest_run(root: str | os.PathLike[str] = "results") -> Path:
    """The run directory under ``root`` (or ``root`` itself) whose ``manifest.json`` is the
    newest: a completed run (the manifest is written last). One ``ConfigError`` line naming
    ``root`` when it holds none."""
    base = Path(root)
    if (base / MANIFEST).is_file():
        return base
    runs = [p for p in base.iterdir() if (p / MANIFEST).is_file()] if base.is_dir() else []
    if not runs:
        raise ConfigError(
            f"{base}: no completed run here (a run directory holds {MANIFEST}); "
            "set SPECTEST_RUN_DIR to one"
        )
    return max(runs, key=lambda p: ((p / MANIFEST).stat().st_mtime_ns, p.name))


def read_shards(rd: RunDir, plan: Any) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Every shard of ``plan`` (``spectest.plan.Plan``) read back from ``rd``: samples and rounds
    in plan order (arm, prompt), each sorted by (config in protocol order, seed, position): the
    same bytes whatever order shards were generated (or resumed) in."""
    s_parts, r_parts = [], []
    for shard in plan.shards:
        s, r = rd.read_shard(shard.key)
        s_parts.append(s)
        if r is not None:
            r_parts.append(r)
    samples = pd.concat(s_parts, ignore_index=True)
    names = {
        schema.ARM: [a.name for a in plan.arms],
        schema.PROMPT_ID: [p.id for p in plan.protocol.prompts.items],
        schema.CONFIG_ID: [cid for cid, _ in plan.protocol.configs],
    }

    def rank(df: pd.DataFrame, col: str) -> Any:  # [N] position in the plan (absent: last)
        at = pd.Index(names[col]).get_indexer(df[col])  # Series.map: 3x slower on Arrow strings
        return np.where(at < 0, len(names[col]), at)

    def ordered(df: pd.DataFrame, extra: Sequence[str]) -> pd.DataFrame:
        key = pd.DataFrame(
            {
                **{f"_{c}": rank(df, c) for c in (schema.ARM, schema.PROMPT_ID, schema.CONFIG_ID)},
                "_s": df[schema.SEED],
                **{f"_{i}": df[c] for i, c in enumerate(extra)},
            }
        )
        idx = key.sort_values(list(key.columns), kind="stable").index
        return df.loc[idx].reset_index(drop=True)

    samples = ordered(samples, [schema.POSITION])
    rounds = ordered(pd.concat(r_parts, ignore_index=True), ["round"]) if r_parts else None
    return samples, rounds
