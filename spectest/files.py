"""Files written whole or not at all: atomic writes, Parquet tables with provenance, hashes and
the provenance record.

The why and the details: docs/internals.md "spectest/files.py".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spectest import __version__
from spectest.errors import InfrastructureError, InputError

PROVENANCE_KEY = b"spectest.provenance"
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


def write_failed(path: Path, err: OSError) -> InfrastructureError:
    """The one line for a write the OS refused (ENOSPC, EDQUOT, EROFS, EACCES, EFBIG, EIO ...):
    it names the file being written — the OS error of a ``write()`` names none."""
    # NOTE: Arrow's strerror is "Error writing bytes to file. Detail: [errno 28] ..."
    reason = os.strerror(err.errno) if err.errno else ""
    reason = reason or err.strerror or " ".join(str(err).split()) or type(err).__name__
    if (
        err.filename is not None
        and str(err.filename) != str(path)
        and ".tmp" not in str(err.filename)
    ):
        reason = f"{reason} ({err.filename})"
    return InfrastructureError(f"cannot write {path}: {reason}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # NOTE: mkstemp creates 0600; results are ordinary files


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary and ``os.replace``; an ``OSError`` is one
    ``InfrastructureError`` naming ``path`` (``write_failed``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise write_failed(path, err) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise write_failed(path, err) from None
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as err:
        raise write_failed(path, err) from None
    try:
        pq.write_table(table, tmp)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):  # Arrow's "Error writing bytes to file" names no file
            raise write_failed(path, err) from None
        raise
    return table.num_rows


def read_table(path: Path) -> pd.DataFrame:
    """Read a Parquet file; a missing or corrupt file is one ``InputError`` line naming it."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        return pq.read_table(path).to_pandas()
    # a damaged pandas metadata block fails inside to_pandas as a KeyError / TypeError (found by
    # tools/fuzz.py: one flipped byte gave "internal error: KeyError: 'pandas_type'")
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError, IndexError) as err:
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


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (run files here, fixture files in
    ``models.fixtures``)."""
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
