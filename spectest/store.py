"""The run directory: atomic Parquet writes, shards and resume, provenance, the manifest.

Owns: the layout of ``results/<run-id>/``, every file write (each one to a temporary name then
``os.replace``, so a reader never sees half a file), the resume bookkeeping (one shard per
arm × prompt, complete iff its samples file exists), provenance metadata, and the rule that a
directory is complete only once ``manifest.json`` — written last — exists. Also reads
bring-your-own samples files (Parquet or CSV) against ``schema.BYO_SCHEMA``.

Knows nothing about statistics or models: it stores the DataFrames it is given, with the Arrow
schema it is given, and checks nothing about their meaning.

Layout
------
::

    <run>/run.json            kind (run | teeth | compare), protocol hash, arms, created
    <run>/protocol.yaml       the protocol after overrides, self-contained (run / teeth)
    <run>/prompts.jsonl       the prompt set it uses
    <run>/shards/<arm>__<prompt>.{rounds,samples}.parquet   one per arm × prompt
    <run>/samples.parquet rounds.parquet histograms.parquet tests.parquet trie.parquet
          whitebox.parquet    final tables (provenance in each file's metadata)
    <run>/summary.json report.md report.html
    <run>/manifest.json       LAST: files with sizes and sha256; absent ⇒ incomplete
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spectest import __version__, schema
from spectest.errors import ConfigError, InputError

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
SUMMARY = "summary.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PROVENANCE_KEY = b"spectest.provenance"
RENDERED = (REPORT_MD, REPORT_HTML)  # views re-rendered from stored results; not data

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
_PACKAGES = (
    "spectest",
    "torch",
    "numpy",
    "scipy",
    "statsmodels",
    "pandas",
    "pyarrow",
    "transformers",
)


# ----------------------------------------------------------------------------- atomic writes
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # NOTE: mkstemp creates 0600; results are ordinary files


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_table(
    path: Path, df: pd.DataFrame, arrow_schema: pa.Schema | None, provenance: Mapping[str, Any]
) -> int:
    """Write ``df`` atomically as Parquet with ``arrow_schema`` (inferred when ``None``) and the
    provenance JSON in the file metadata. Returns the number of rows."""
    if arrow_schema is not None:
        missing = [f.name for f in arrow_schema if f.name not in df.columns]
        if missing:
            raise InputError(f"{path.name}: table lacks column(s) {missing!r} of its schema")
        df = df[[f.name for f in arrow_schema]]
    try:
        table = pa.Table.from_pandas(df, schema=arrow_schema, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise InputError(f"{path.name}: cannot store table: {str(err).splitlines()[0]}") from None
    meta = dict(table.schema.metadata or {})
    meta[PROVENANCE_KEY] = json.dumps(provenance, sort_keys=True, default=str).encode()
    meta.pop(b"pandas", None)  # NOTE: keep the explicit Arrow schema the source of truth
    table = table.replace_schema_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return table.num_rows


def read_table(path: Path) -> pd.DataFrame:
    """Read a Parquet file; a missing or corrupt file is one ``InputError`` line naming it."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        return pq.read_table(path).to_pandas()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise InputError(
            f"{path}: not a readable Parquet file ({str(err).splitlines()[0]})"
        ) from None


def read_provenance(path: Path) -> dict[str, Any]:
    try:
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError) as err:
        raise InputError(
            f"{path}: not a readable Parquet file ({str(err).splitlines()[0]})"
        ) from None
    raw = meta.get(PROVENANCE_KEY)
    return json.loads(raw) if raw else {}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------- provenance
def git_sha() -> str:
    """The git commit of the spectest checkout (``+dirty`` when modified), or ``"unknown"``."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    out["python"] = platform.python_version()
    return out


def make_provenance(
    *,
    protocol_hash: str | None,
    device: str,
    seed_ranges: Mapping[str, Any],
    kind: str,
    threads: int | None = None,
) -> dict[str, Any]:
    """What every result file records about how it was produced."""
    return {
        "spectest_version": __version__,
        "kind": kind,
        "protocol_hash": protocol_hash,
        "git_sha": git_sha(),
        "packages": package_versions(),
        "device": device,
        "torch_threads": threads,
        "host": platform.node(),
        "seed_ranges": dict(seed_ranges),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# ----------------------------------------------------------------------------- the run directory
@dataclass(frozen=True)
class RunDir:
    """A run directory being written. Create with ``RunDir.open``."""

    path: Path
    info: dict[str, Any]

    @staticmethod
    def open(
        path: str | os.PathLike[str],
        info: Mapping[str, Any],
        *,
        protocol_yaml: str | None = None,
        prompts: str | None = None,
    ) -> RunDir:
        """Create ``path`` or resume into it.

        ``info`` must hold ``kind`` and ``protocol_hash``. An existing directory is resumed only
        when its ``run.json`` names the same kind and hash; otherwise ``ConfigError``. An existing
        non-empty directory without ``run.json`` is refused (never overwrite foreign files). The
        manifest of a previous completed run is removed first, so the directory reads as
        incomplete until this run finishes.
        """
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise ConfigError(f"--out: {str(p)!r} exists and is not a directory")
        info_path = p / RUN_INFO
        if info_path.is_file():
            try:
                old = json.loads(info_path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise InputError(f"{info_path}: not valid JSON (a damaged run directory)") from None
            if old.get("protocol_hash") != info.get("protocol_hash") or old.get("kind") != info.get(
                "kind"
            ):
                raise ConfigError(
                    f"{p}: holds a {old.get('kind')!r} run of protocol hash "
                    f"{str(old.get('protocol_hash'))[:12]!r}, not "
                    f"{str(info.get('protocol_hash'))[:12]!r}: choose another --out or delete it"
                )
        elif p.is_dir() and any(p.iterdir()):
            raise ConfigError(
                f"--out: {str(p)!r} is a non-empty directory that is not a spectest run"
            )
        p.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p / MANIFEST)
        if not info_path.is_file():
            if protocol_yaml is not None:
                atomic_write_text(p / PROTOCOL_FILE, protocol_yaml)
            if prompts is not None:
                atomic_write_text(p / PROMPTS_FILE, prompts)
            atomic_write_json(info_path, dict(info))
        return RunDir(path=p, info=dict(info))

    # -- shards
    def _shard_path(self, key: str, table: str) -> Path:
        return self.path / SHARDS_DIR / f"{key}.{table}.parquet"

    def shard_done(self, key: str) -> bool:
        """A shard is complete iff its samples file exists (written after its rounds file)."""
        return self._shard_path(key, "samples").is_file()

    def completed_shards(self, keys: Iterable[str]) -> list[str]:
        return [k for k in keys if self.shard_done(k)]

    def write_shard(
        self,
        key: str,
        samples: pd.DataFrame,
        rounds: pd.DataFrame | None,
        provenance: Mapping[str, Any],
    ) -> None:
        """Write one shard: rounds first, samples last (the completion mark), each atomically."""
        if rounds is not None:
            write_table(self._shard_path(key, "rounds"), rounds, schema.ROUNDS_SCHEMA, provenance)
        write_table(self._shard_path(key, "samples"), samples, samples_schema(samples), provenance)

    def read_shard(self, key: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        samples = read_table(self._shard_path(key, "samples"))
        rp = self._shard_path(key, "rounds")
        return samples, (read_table(rp) if rp.is_file() else None)

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
        """Write the final tables, summary.json and text files, then ``manifest.json`` last
        (``manifest=False``: the caller writes more files, then calls ``write_manifest``)."""
        for name, (df, arrow_schema) in tables.items():
            write_table(self.path / name, df, arrow_schema, provenance)
        atomic_write_json(self.path / SUMMARY, dict(summary))
        for name, text in texts.items():
            atomic_write_text(self.path / name, text)
        return self.write_manifest(provenance) if manifest else None

    def write_manifest(self, provenance: Mapping[str, Any]) -> dict[str, Any]:
        files = {}
        for f in sorted(self.path.iterdir()):
            if f.is_file() and f.name != MANIFEST and not f.name.startswith("."):
                files[f.name] = {"bytes": f.stat().st_size, "sha256": _sha256(f)}
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
        return manifest


def samples_schema(df: pd.DataFrame) -> pa.Schema:
    """The samples schema, with the white-box columns when the table has them."""
    return schema.SAMPLES_WB_SCHEMA if schema.WB_P in df.columns else schema.SAMPLES_SCHEMA


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
    """Open a completed run directory; an incomplete one (no manifest) is an ``InputError``.

    ``require_manifest=False`` is for the runner only: it renders reports from the files it has
    just written, before it writes the manifest.
    """
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{p}: no such run directory")
    mpath = p / MANIFEST
    if require_manifest and not mpath.is_file():
        raise InputError(
            f"{p}: no {MANIFEST}: the run is incomplete (interrupted?); re-run it to resume"
        )
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8")) if mpath.is_file() else {}
        info = json.loads((p / RUN_INFO).read_text(encoding="utf-8"))
        summary = json.loads((p / SUMMARY).read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise InputError(
            f"{err.filename}: missing from a run directory that has a manifest"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{p}: a JSON file of the run is damaged ({err})") from None
    for name, entry in manifest.get("files", {}).items():
        if name in RENDERED:
            continue  # re-rendered views of the stored results (``spectest report``)
        f = p / name
        if not f.is_file():
            raise InputError(f"{f}: listed in {MANIFEST} but missing")
        if f.stat().st_size != entry.get("bytes"):
            raise InputError(
                f"{f}: size differs from {MANIFEST} ({f.stat().st_size} != "
                f"{entry.get('bytes')}): modified after the run"
            )
    return StoredRun(path=p, info=info, manifest=manifest, summary=summary)


# ------------------------------------------------------------------ bring-your-own samples
_INT_COLS = (schema.SEED, schema.POSITION, schema.TOKEN_ID)
_STR_COLS = (schema.PROMPT_ID, schema.CONFIG_ID)


def read_samples_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a bring-your-own samples file (Parquet, or CSV with a header) and check it against
    ``schema.BYO_SCHEMA``: one line naming the file, the column and the bad value otherwise."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such samples file")
    expected = ", ".join(f.name for f in schema.BYO_SCHEMA)
    if p.suffix.lower() in (".csv", ".tsv", ".txt"):
        try:
            df = pd.read_csv(
                p,
                sep="\t" if p.suffix.lower() == ".tsv" else ",",
                dtype={c: str for c in _STR_COLS},
            )
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise InputError(f"{p}: not a readable CSV file ({str(err).splitlines()[0]})") from None
    else:
        df = read_table(p)
    missing = [c for c in (f.name for f in schema.BYO_SCHEMA) if c not in df.columns]
    if missing:
        raise InputError(f"{p}: missing column(s) {', '.join(missing)} (expected {expected})")
    if len(df) == 0:
        raise InputError(f"{p}: holds no samples")
    for col in _STR_COLS:
        s = df[col]
        bad = s[s.isna()]
        if len(bad):
            raise InputError(f"{p}: column {col}: empty value at row {int(bad.index[0])}")
        if not (pd.api.types.is_string_dtype(s) or pd.api.types.is_object_dtype(s)):
            raise InputError(
                f"{p}: column {col}: expected strings, got {s.dtype} (e.g. {s.iloc[0]!r})"
            )
        df[col] = s.astype(str)
    for col in _INT_COLS:
        s = df[col]
        if not pd.api.types.is_integer_dtype(s) or pd.api.types.is_bool_dtype(s):
            num = pd.to_numeric(s, errors="coerce")
            bad_mask = num.isna() | (num != num.round())
            if bad_mask.any():
                i = int(bad_mask.to_numpy().nonzero()[0][0])
                v = s.iloc[i]
                v = v.item() if hasattr(v, "item") else v  # numpy scalar → Python for the message
                raise InputError(f"{p}: column {col}: expected integers, got {v!r} at row {i}")
            s = num
        df[col] = s.astype("int64")
        if (df[col] < 0).any():
            i = int((df[col] < 0).to_numpy().nonzero()[0][0])
            raise InputError(
                f"{p}: column {col}: expected integers >= 0, "
                f"got {int(df[col].iloc[i])!r} at row {i}"
            )
    df[schema.POSITION] = df[schema.POSITION].astype("int32")
    dup = df.duplicated([schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED, schema.POSITION])
    if dup.any():
        r = df[dup].iloc[0]
        key = (
            r[schema.PROMPT_ID],
            r[schema.CONFIG_ID],
            int(r[schema.SEED]),
            int(r[schema.POSITION]),
        )
        raise InputError(f"{p}: duplicate row for (prompt_id, config_id, seed, position) = {key!r}")
    extra = [
        c
        for c in df.columns
        if c not in {f.name for f in schema.BYO_SCHEMA} and c not in schema.WHITEBOX_COLUMNS
    ]
    return df.drop(columns=extra)


def rewrite_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Re-list the files of a completed run after reports were (re)rendered into it, keeping its
    provenance: the run stays complete and its manifest stays true."""
    p = Path(path)
    try:
        old = json.loads((p / MANIFEST).read_text(encoding="utf-8"))
        info = json.loads((p / RUN_INFO).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{p}: cannot re-list a run without a readable manifest ({err})") from None
    return RunDir(path=p, info=info).write_manifest(old.get("provenance", {}))
