"""The run directory: atomic Parquet writes, shards and resume, provenance, the manifest.

Owns: the layout of ``results/<run-id>/``, every file write of a run (each one atomic, through
``spectest.files``, so a reader never sees half a file), the resume bookkeeping (one shard per
arm × prompt, complete iff its digest exists, checked on read; each arm's fingerprint, a change
of which drops that arm's shards), provenance metadata, the writer's lock, and
the rule that a directory is complete only once ``manifest.json`` — written last — exists and
every data file it lists still has its sha256. Bring-your-own samples files are read and checked
by ``spectest.byo``.

The details (moved from this docstring):
docs/run-directory.md "Integrity rules and layout".
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
    _umask as _umask,
)
from spectest.files import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_provenance,
    read_table,
    sha256_file,
    write_table,
)
from spectest.fingerprint import UNFINGERPRINTED as UNFINGERPRINTED
from spectest.fingerprint import what_changed
from spectest.lock import LOCK_FILE, DirLock, lock_dir

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
    RUN_INFO, PROTOCOL_FILE, PROMPTS_FILE, SUMMARY, SAMPLES, ROUNDS, HISTOGRAMS, TESTS, TRIE,
    WHITEBOX, SEQUENCE, TOOTH_SIZES, NUMERICS,
)  # fmt: skip
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

# NOTE: per-token histograms are a storage format, not a statistic: the count of each emitted
# token per (cell, arm, position). Kept here beside the file it describes; schema.py owns the
# other table shapes (a request to move it there is in the report).
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
    """Test-only fault injection: SIGKILL this process at a named point of a write.

    ``SPECTEST_CRASH_AT`` = ``shard:<n>`` (after the n-th shard this process wrote),
    ``final:<file>`` (after that final file was written), ``manifest`` (everything written but
    the manifest), ``manifest-written`` (the manifest written, summary.json still
    ``complete: false``). A real SIGKILL — no handler, no cleanup, no flush — at an exact point,
    so the kill-and-resume tests are deterministic instead of racing a timer. Unset: one lookup.
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


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")


# ----------------------------------------------------------------------------- the run directory
@dataclass(frozen=True)
class RunDir:
    """A run directory being written, locked against a second writer. Create with
    ``RunDir.open``; the lock is released when the manifest is written (``write_manifest``), by
    ``release()``, or when the process ends."""

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
        """Create ``path`` or resume into it, and lock it.

        ``info`` must hold ``kind`` and ``protocol_hash``. An existing directory is resumed only
        when its ``run.json`` names the same kind and hash; otherwise ``ConfigError``. An existing
        non-empty directory without ``run.json`` is refused (never overwrite foreign files).
        ``replace=True`` (``compare``, which has nothing worth resuming): an existing directory of
        the same kind is cleared of spectest's files and reused, whatever its hash or state.
        A previous completed run first gets ``complete: false`` in its summary, then loses its
        manifest, so the directory reads as incomplete until this run finishes. A directory
        locked by another live writer is a ``ConfigError``; a filesystem refusal is an
        ``InfrastructureError``.
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
        """Under the lock: check what the directory holds, mark it incomplete, write run.json;
        drop the shards of every arm whose fingerprint changed (``_refingerprint``)."""
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
        """A shard is complete iff its digest exists (written after its rounds and samples
        files, with their sizes and sha256: ``read_shard`` checks them)."""
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
        """Write one shard: rounds, samples, then their digest (the completion mark), each
        atomically."""
        global _shards_written
        self._digest_path(key).unlink(missing_ok=True)
        files = {"samples": self._shard_path(key, "samples")}
        if rounds is not None:
            files["rounds"] = self._shard_path(key, "rounds")
            write_table(files["rounds"], rounds, schema.ROUNDS_SCHEMA, provenance)
        write_table(files["samples"], samples, samples_schema(samples), provenance)
        digest = {
            t: {"bytes": f.stat().st_size, "sha256": sha256_file(f)} for t, f in files.items()
        }
        atomic_write_json(self._digest_path(key), digest)
        _shards_written += 1
        _crash_point(f"shard:{_shards_written}")

    def read_shard(self, key: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """A completed shard, checked against its digest first (``InputError`` naming the file
        that was modified after it was written: a resume never uses a rewritten shard)."""
        dpath = self._digest_path(key)
        digest = _read_object(dpath)
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
        """Write the final tables, summary.json (``complete: false``) and text files, then
        ``manifest.json`` last (``manifest=False``: the caller writes more files, then calls
        ``write_manifest``)."""
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
        """List every file with size and sha256, write ``manifest.json``, then ``summary.json``
        with ``complete: true`` (the manifest records those final bytes), then release the lock
        (``release=False``: the caller writes more, then releases, or takes the completion back
        with ``mark_incomplete`` when that fails).

        NOTE: the order makes ``complete: true`` imply a manifest; a kill between the two writes
        leaves a manifest beside ``complete: false``, which ``load_run`` reads as incomplete."""
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
                files[f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
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
        """Take a completion back (``complete: false``, no manifest): something the run was
        asked to write after its manifest failed, so it is not a finished result."""
        _mark_incomplete(self.path)


def _mark_incomplete(p: Path) -> None:
    """``complete: false`` in summary.json first, then no manifest: never a moment where a
    reader of either file sees the old run as complete while this one writes."""
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
    """A resume into ``p``: drop the shards of every arm whose fingerprint (what it runs,
    hashed: ``spectest.fingerprint``) differs from the one ``run.json`` recorded, and say so.
    Regenerate, not refuse: the protocol is the same, so the arm's shards are simply stale, and
    a CI gate then decides on what the engine runs now — never on an old pass. A directory
    written before fingerprints were recorded has none: every arm with a fingerprint is then
    regenerated (nothing says its shards match)."""
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
    """The samples schema, with the white-box (and role) columns when the table has them, and
    the engine-reported ones (``schema.REPORTED_FIELDS``) after them when it has those."""
    if schema.WB_ROLE_P in df.columns:
        base = schema.SAMPLES_ROLE_SCHEMA
    else:
        base = schema.SAMPLES_WB_SCHEMA if schema.WB_P in df.columns else schema.SAMPLES_SCHEMA
    return pa.schema(list(base) + [f for f in schema.REPORTED_FIELDS if f.name in df.columns])


# ------------------------------------------------------------------ reading a completed run
@dataclass(frozen=True)
class StoredRun:
    """A completed run directory, read back (tables a run kind does not produce: ``None``)."""

    path: Path
    info: dict[str, Any]
    manifest: dict[str, Any]
    summary: dict[str, Any]

    def table(self, name: str) -> pd.DataFrame | None:
        """Read one of the final tables (``samples.parquet`` ...), ``None`` when absent."""
        p = self.path / name
        if not p.is_file():
            return None
        return read_table(p)

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
    """Open a completed run directory; an incomplete one (no manifest, or a summary that says
    ``complete: false``) or one whose data files changed since the manifest (size or sha256;
    the first changed file is named) is an ``InputError``.

    ``require_manifest=False`` is for the runner only: it renders reports from the files it has
    just written, before it writes the manifest (nothing is verified then).
    """
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{p}: no such run directory")
    mpath = p / MANIFEST
    if require_manifest and not mpath.is_file():
        raise InputError(
            f"{p}: no {MANIFEST}: the run is incomplete (interrupted?); re-run it to resume"
        )
    manifest = _read_object(mpath) if mpath.is_file() else {}
    summary = _read_object(p / SUMMARY)  # each JSON file is named when damaged
    if require_manifest and summary.get(COMPLETE_KEY) is False:
        raise InputError(
            f"{p}: {SUMMARY} says complete: false: the run was interrupted while finishing; "
            "re-run it to resume"
        )
    if require_manifest:
        verify_manifest(p, manifest)
    info = _read_object(p / RUN_INFO)
    return StoredRun(path=p, info=info, manifest=manifest, summary=summary)


def _read_json(f: Path) -> Any:
    """A JSON file of a run directory; ``InputError`` naming the file when missing or damaged."""
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{f}: missing from the run directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{f}: damaged JSON ({err})") from None


def _read_object(f: Path) -> dict[str, Any]:
    """A JSON object of a run directory (``_read_json``; anything but an object is damage)."""
    obj = _read_json(f)
    if not isinstance(obj, dict):
        raise InputError(f"{f}: damaged JSON (expected an object, got {type(obj).__name__})")
    return obj


def verify_manifest(p: Path, manifest: Mapping[str, Any]) -> None:
    """Every data file the manifest lists exists with its size and sha256 (rendered reports are
    views, re-rendered by ``spectest report``, and are not checked), and the manifest lists
    every data file the run must have: ``REQUIRED_FILES`` of its kind (``run.json``'s, which
    must agree with the manifest's), the tables ``summary.json`` says were written, and every
    data file present on disk. Raises ``InputError`` naming the first file that fails."""
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
    kind = _read_object(p / RUN_INFO).get("kind")  # verified above
    if kind not in REQUIRED_FILES or manifest.get("kind") not in (None, kind):
        raise InputError(
            f"{p / RUN_INFO}: kind {kind!r} (manifest: {manifest.get('kind')!r}) is not one of "
            f"{sorted(REQUIRED_FILES)}: a damaged run directory"
        )
    for name in REQUIRED_FILES[kind]:
        if name not in files:
            raise unlisted(name, f"every run of kind {kind!r} has it")
    written = _read_object(p / SUMMARY).get(DATA_FILES_KEY) or []  # verified above
    for name in written if isinstance(written, list) else []:
        if isinstance(name, str) and name not in files:
            raise unlisted(name, f"{SUMMARY} says the run wrote it")


def update_manifest_entries(path: str | os.PathLike[str], names: Iterable[str]) -> bool:
    """Re-list the rendered views ``names`` (``RENDERED``) of a completed run after
    ``spectest report`` re-rendered them: their entries only — every other entry, the
    provenance and the ``completed`` time are kept byte for byte. Returns whether the manifest
    changed (it is rewritten only then). The caller holds the run directory's lock."""
    p = Path(path)
    names = list(names)
    if bad := [n for n in names if n not in RENDERED]:
        raise ValueError(f"update_manifest_entries: {bad!r} are not rendered views")
    manifest = _read_object(p / MANIFEST)
    files = dict(manifest.get("files") or {})
    for name in names:
        f = p / name
        if f.is_file():
            files[name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        else:
            files.pop(name, None)
    if files == manifest.get("files"):
        return False
    atomic_write_json(p / MANIFEST, {**manifest, "files": dict(sorted(files.items()))})
    return True
