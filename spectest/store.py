"""The run directory being written: its layout, every write of a run (atomic), shards and
resume, the writer's lock and the manifest (written last: a directory is complete only then).

The why and the details: docs/internals.md "spectest/store.py".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
import pyarrow as pa

from spectest import __version__, schema
from spectest.errors import ConfigError, InfrastructureError, InputError, os_error_line
from spectest.files import (
    LOCK_FILE,
    DirLock,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    lock_dir,
    read_table,
    sha256_file,
    write_table,
)
from spectest.fingerprint import UNFINGERPRINTED as UNFINGERPRINTED
from spectest.fingerprint import what_changed

MANIFEST = "manifest.json"
RUN_INFO = "run.json"
PROTOCOL_FILE = "protocol.yaml"
PROMPTS_FILE = "prompts.jsonl"
SHARDS_DIR = "shards"
SAMPLES = "samples.parquet"
ROUNDS = "rounds.parquet"
HISTOGRAMS = "histograms.parquet"
TESTS = "tests.parquet"
TRIE = "trie.parquet"
WHITEBOX = "whitebox.parquet"
SEQUENCE = "sequence.parquet"  # the sequence-level family (stats.sequence)
TOOTH_SIZES = "tooth_sizes.parquet"  # the ε arms' and mutants' TV per cell-position (tooth_size)
NUMERICS = (
    "numerics.parquet"  # the matched arm's per-token drift and floor (spectest.numerics.table)
)
TEACHER_LAWS = "teacher_laws.parquet"  # claim (b) teacher-forced: the plain laws (teacher_forced)
SUMMARY = "summary.json"
SHARD_DIGEST = "digest.json"  # shards/<key>.digest.json: sizes + sha256 of the shard's files
FINGERPRINTS_KEY = "fingerprints"  # run.json: arm → what it runs, hashed (spectest.fingerprint)
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
COMPLETE_KEY = "complete"  # summary.json: false until the manifest is written
RENDERED = (REPORT_MD, REPORT_HTML)  # views re-rendered from stored results; not data
DATA_FILES_KEY = "data_files"  # summary.json: the tables write_final wrote (verify_manifest)
# the data files spectest writes into a run directory (every one present must be in the manifest)
DATA_FILES = (
    RUN_INFO,
    PROTOCOL_FILE,
    PROMPTS_FILE,
    SUMMARY,
    SAMPLES,
    ROUNDS,
    HISTOGRAMS,
    TESTS,
    TRIE,
    WHITEBOX,
    SEQUENCE,
    TOOTH_SIZES,
    NUMERICS,
)
# what every completed run of a kind has, whatever its protocol (rounds, trie, white-box and
# sequence tables depend on the protocol and the data: summary.json's ``data_files`` lists them)
_RUN_FILES = (RUN_INFO, PROTOCOL_FILE, PROMPTS_FILE, SUMMARY, SAMPLES, HISTOGRAMS, TESTS)
REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    "run": _RUN_FILES,
    "teeth": _RUN_FILES,
    "compare": (RUN_INFO, SUMMARY, SAMPLES, HISTOGRAMS, TESTS),
}
# every name a run directory may hold that spectest wrote (a compare re-run clears these)
_OWN_FILES = (MANIFEST, *DATA_FILES, *RENDERED)
CRASH_ENV = "SPECTEST_CRASH_AT"  # test-only fault injection, see ``_crash_point``

# the count of each emitted token per (cell, arm, position): a storage format, not a statistic
HISTOGRAMS_SCHEMA = pa.schema(
    [
        pa.field(schema.PROMPT_ID, pa.string(), nullable=False),
        pa.field(schema.CONFIG_ID, pa.string(), nullable=False),
        pa.field(schema.ARM, pa.string(), nullable=False),
        pa.field(schema.POSITION, pa.int32(), nullable=False),
        pa.field(schema.TOKEN_ID, pa.int64(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
    ]
)
# ----------------------------------------------------------------------------- fault injection
_shards_written = 0  # in this process, for ``_crash_point("shard:<n>")``


def _crash_point(point: str) -> None:
    """Test-only: SIGKILL this process when ``SPECTEST_CRASH_AT`` names ``point`` (``shard:<n>``,
    ``final:<file>``, ``manifest``, ``manifest-written``), so kill-and-resume tests need no timer.
    """
    if os.environ.get(CRASH_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _check_out_path(p: Path) -> None:
    """``--out`` must be, or be creatable as, a directory: name the file that is in the way."""
    if p.exists() and not p.is_dir():
        raise InfrastructureError(f"--out: {str(p)!r} exists and is not a directory")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InfrastructureError(
                    f"--out: cannot create {str(p)!r}: {str(parent)!r} is a file, not a directory"
                )
            return


def _foreign_entries(p: Path) -> list[str]:
    """Entries of ``p`` that are neither spectest's lock nor a dead writer's temporary."""
    return sorted(f.name for f in p.iterdir() if f.name != LOCK_FILE and not _is_temporary(f.name))


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def file_entry(f: Path) -> dict[str, Any]:
    """A file's manifest or digest entry: size and sha256."""
    return {"bytes": f.stat().st_size, "sha256": sha256_file(f)}


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")


# ----------------------------------------------------------------------------- the run directory
@dataclass(frozen=True)
class RunDir:
    """A run directory being written, locked against a second writer (``RunDir.open``) until
    ``write_manifest``, ``release()`` or the process's end."""

    path: Path
    info: dict[str, Any]
    lock: DirLock | None = field(default=None, compare=False, repr=False)
    # what opening it did beyond resuming (an arm whose fingerprint changed: its shards dropped)
    notes: tuple[str, ...] = ()

    @staticmethod
    def open(
        path: str | os.PathLike[str],
        info: Mapping[str, Any],
        *,
        protocol_yaml: str | None = None,
        prompts: str | None = None,
        replace: bool = False,
    ) -> RunDir:
        """``path`` created, or resumed into, and locked.

        Notes
        -----
        ``info`` holds ``kind`` and ``protocol_hash``; an existing directory is resumed only when
        its ``run.json`` has the same (``replace=True``: one of the same kind is cleared and
        reused), a foreign non-empty one or one locked by a live writer is a ``ConfigError``. A
        completed run is marked incomplete first.
        """
        p = Path(path)
        _check_out_path(p)
        if p.is_dir() and not (p / RUN_INFO).is_file() and _foreign_entries(p):
            raise ConfigError(
                f"--out: {str(p)!r} is a non-empty directory that is not a spectest run"
            )
        try:
            p.mkdir(parents=True, exist_ok=True)
            lock = lock_dir(p)
        except OSError as err:
            raise InfrastructureError(
                f"--out: cannot write into {str(p)!r}: {err.strerror or err}"
            ) from None
        try:
            notes = RunDir._prepare(p, info, protocol_yaml, prompts, replace)
        except OSError as err:
            lock.release()
            raise InfrastructureError(os_error_line(err, "--out")) from None
        except BaseException:
            lock.release()
            raise
        return RunDir(path=p, info=dict(info), lock=lock, notes=tuple(notes))

    @staticmethod
    def _prepare(
        p: Path,
        info: Mapping[str, Any],
        protocol_yaml: str | None,
        prompts: str | None,
        replace: bool,
    ) -> list[str]:
        """Under the lock: check what the directory holds, mark it incomplete, write run.json,
        drop changed arms' shards; the notes of what it dropped."""
        info_path = p / RUN_INFO
        notes: list[str] = []
        if info_path.is_file():
            try:
                old = json.loads(info_path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                if not replace:
                    raise InputError(
                        f"{info_path}: not valid JSON (a damaged run directory)"
                    ) from None
                old = {"kind": info.get("kind")}  # a damaged compare directory: replaced
            same_kind = old.get("kind") == info.get("kind")
            if replace and same_kind:
                _clear_own_files(p)
            elif not same_kind or old.get("protocol_hash") != info.get("protocol_hash"):
                raise ConfigError(
                    f"{p}: holds a {old.get('kind')!r} run of protocol hash "
                    f"{str(old.get('protocol_hash'))[:12]!r}, not "
                    f"{str(info.get('protocol_hash'))[:12]!r}: choose another --out or delete it"
                )
            else:
                notes = _refingerprint(p, old, info)
        elif _foreign_entries(p):  # appeared between the first check and the lock
            raise ConfigError(
                f"--out: {str(p)!r} is a non-empty directory that is not a spectest run"
            )
        for f in p.iterdir():  # temporaries of a writer that died (we hold the lock)
            if _is_temporary(f.name):
                f.unlink()
        _mark_incomplete(p)
        if not info_path.is_file():
            if protocol_yaml is not None:
                atomic_write_text(p / PROTOCOL_FILE, protocol_yaml)
            if prompts is not None:
                atomic_write_text(p / PROMPTS_FILE, prompts)
            atomic_write_json(info_path, dict(info))
        elif notes:  # the new fingerprints, once the changed arms' shards are gone
            atomic_write_json(info_path, dict(info))
        return notes

    def release(self) -> None:
        """Release the writer's lock (idempotent)."""
        if self.lock is not None:
            self.lock.release()

    # -- shards
    def _shard_path(self, key: str, table: str) -> Path:
        return self.path / SHARDS_DIR / f"{key}.{table}.parquet"

    def _digest_path(self, key: str) -> Path:
        return self.path / SHARDS_DIR / f"{key}.{SHARD_DIGEST}"

    def shard_done(self, key: str) -> bool:
        """Whether the shard is complete: its digest, written last, exists."""
        return self._digest_path(key).is_file() and self._shard_path(key, "samples").is_file()

    def completed_shards(self, keys: Iterable[str]) -> list[str]:
        return [k for k in keys if self.shard_done(k)]

    def write_shard(
        self,
        key: str,
        samples: pd.DataFrame,
        rounds: pd.DataFrame | None,
        provenance: Mapping[str, Any],
    ) -> None:
        """Write one shard: rounds, samples, then their digest (the completion mark)."""
        global _shards_written
        self._digest_path(key).unlink(missing_ok=True)
        files = {"samples": self._shard_path(key, "samples")}
        if rounds is not None:
            files["rounds"] = self._shard_path(key, "rounds")
            write_table(files["rounds"], rounds, schema.ROUNDS_SCHEMA, provenance)
        write_table(files["samples"], samples, samples_schema(samples), provenance)
        atomic_write_json(self._digest_path(key), {t: file_entry(f) for t, f in files.items()})
        _shards_written += 1
        _crash_point(f"shard:{_shards_written}")

    def read_shard(self, key: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """A completed shard's samples and rounds, checked against its digest first."""
        dpath = self._digest_path(key)
        digest = read_object(dpath)
        for table in ("samples", "rounds"):
            f = self._shard_path(key, table)
            entry = digest.get(table)
            if not isinstance(entry, Mapping):
                if table == "rounds" and entry is None and not f.is_file():
                    continue
                raise InputError(f"{dpath}: damaged (no entry for the {table} file)")
            if not f.is_file():
                raise InputError(f"{f}: listed in {dpath.name} but missing: delete the shard")
            got = sha256_file(f)
            if f.stat().st_size != entry.get("bytes") or got != entry.get("sha256"):
                raise InputError(
                    f"{f}: sha256 differs from its digest {dpath.name} ({got[:12]}… != "
                    f"{str(entry.get('sha256'))[:12]}…): the shard was modified after it was "
                    "written; delete it (or the run directory) to regenerate it"
                )
        samples = read_table(self._shard_path(key, "samples"))
        rp = self._shard_path(key, "rounds")
        return samples, (read_table(rp) if "rounds" in digest else None)

    # -- final files
    def write_final(
        self,
        *,
        tables: Mapping[str, tuple[pd.DataFrame, pa.Schema | None]],
        summary: Mapping[str, Any],
        texts: Mapping[str, str],
        provenance: Mapping[str, Any],
        manifest: bool = True,
    ) -> dict[str, Any] | None:
        """Write the final tables, summary.json (``complete: false``), the texts, then the
        manifest (``manifest=False``: the caller calls ``write_manifest`` after more files)."""
        for name, (df, arrow_schema) in tables.items():
            write_table(self.path / name, df, arrow_schema, provenance)
            _crash_point(f"final:{name}")
        # verify_manifest: each must be listed (rendered views are not data)
        data_files = sorted(n for n in {*tables, *texts} if n not in RENDERED)
        atomic_write_json(
            self.path / SUMMARY, {**summary, DATA_FILES_KEY: data_files, COMPLETE_KEY: False}
        )
        _crash_point(f"final:{SUMMARY}")
        for name, text in texts.items():
            atomic_write_text(self.path / name, text)
        return self.write_manifest(provenance) if manifest else None

    def write_manifest(
        self, provenance: Mapping[str, Any], *, release: bool = True
    ) -> dict[str, Any]:
        """The manifest written (every file's size and sha256, summary.json's as ``complete:
        true``), then those summary bytes, then the lock released (``release=False``: the
        caller's, after more writes or ``mark_incomplete``).

        Notes
        -----
        ``complete: true`` implies a manifest; a kill between the writes reads as incomplete.
        """
        _crash_point("manifest")
        final_summary: bytes | None = None
        if (self.path / SUMMARY).is_file():
            summary = json.loads((self.path / SUMMARY).read_text(encoding="utf-8"))
            final_summary = _json_bytes({**summary, COMPLETE_KEY: True})
        files = {}
        for f in sorted(self.path.iterdir()):
            if f.name == SUMMARY and final_summary is not None:
                digest = hashlib.sha256(final_summary).hexdigest()
                files[f.name] = {"bytes": len(final_summary), "sha256": digest}
            elif f.is_file() and f.name != MANIFEST and not f.name.startswith("."):
                files[f.name] = file_entry(f)
        manifest = {
            "complete": True,
            "kind": self.info.get("kind"),
            "protocol_hash": self.info.get("protocol_hash"),
            "spectest_version": __version__,
            "completed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "provenance": dict(provenance),
            "files": files,
        }
        atomic_write_json(self.path / MANIFEST, manifest)
        _crash_point("manifest-written")
        if final_summary is not None:
            atomic_write_bytes(self.path / SUMMARY, final_summary)
        if release:
            self.release()
        return manifest

    def mark_incomplete(self) -> None:
        """Take a completion back (``complete: false``, no manifest)."""
        _mark_incomplete(self.path)


def _mark_incomplete(p: Path) -> None:
    """``complete: false`` in summary.json first, then no manifest (never complete meanwhile)."""
    sp = p / SUMMARY
    if sp.is_file():
        try:
            summary = json.loads(sp.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            summary = None
        if isinstance(summary, dict):
            if summary.get(COMPLETE_KEY) is not False:
                atomic_write_json(sp, {**summary, COMPLETE_KEY: False})
        else:
            sp.unlink()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(p / MANIFEST)


def _refingerprint(p: Path, old: Mapping[str, Any], info: Mapping[str, Any]) -> list[str]:
    """A resume: drop the shards of every arm whose fingerprint differs from ``run.json``'s
    and say so (docs/run-directory.md "Provenance of every arm")."""
    new = info.get(FINGERPRINTS_KEY) or {}
    was = old.get(FINGERPRINTS_KEY)
    before: dict[str, Any] = was if isinstance(was, dict) else {}
    notes = []
    prefixes = {arm: quote(arm, safe="") + "__" for arm in {*new, *before}}
    for arm in sorted(new):
        if (before.get(arm) or {}) == (new.get(arm) or {}):
            continue
        longer = [q for a, q in prefixes.items() if a != arm and q.startswith(prefixes[arm])]
        dropped = 0
        for f in sorted((p / SHARDS_DIR).glob("*")) if (p / SHARDS_DIR).is_dir() else []:
            if f.name.startswith(prefixes[arm]) and not any(f.name.startswith(q) for q in longer):
                dropped += f.name.endswith(SHARD_DIGEST)
                f.unlink()
        if dropped:
            what = what_changed(before.get(arm) or {}, new[arm]) or "its fingerprint"
            notes.append(
                f"provenance: arm {arm!r} runs something else than when its shards were "
                f"written ({what}): its {dropped} shard(s) are regenerated"
            )
    return notes


def _clear_own_files(p: Path) -> None:
    """Remove what a previous spectest attempt wrote here (summary and manifest first)."""
    _mark_incomplete(p)
    for name in _OWN_FILES:
        with contextlib.suppress(FileNotFoundError):
            (p / name).unlink()
    shutil.rmtree(p / SHARDS_DIR, ignore_errors=True)


def samples_schema(df: pd.DataFrame) -> pa.Schema:
    """The samples schema with the white-box, role and engine-reported columns ``df`` has."""
    if schema.WB_ROLE_P in df.columns:
        base = schema.SAMPLES_ROLE_SCHEMA
    else:
        base = schema.SAMPLES_WB_SCHEMA if schema.WB_P in df.columns else schema.SAMPLES_SCHEMA
    return pa.schema(list(base) + [f for f in schema.REPORTED_FIELDS if f.name in df.columns])


def _read_json(f: Path) -> Any:
    """A JSON file of a run directory; ``InputError`` naming the file when missing or damaged."""
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{f}: missing from the run directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{f}: damaged JSON ({err})") from None


def read_object(f: Path) -> dict[str, Any]:
    """A JSON object of a run directory (``_read_json``; anything but an object is damage)."""
    obj = _read_json(f)
    if not isinstance(obj, dict):
        raise InputError(f"{f}: damaged JSON (expected an object, got {type(obj).__name__})")
    return obj
