"""Files written whole or not at all: atomic writes, Parquet tables with provenance, hashes and
the provenance record; and the input files a user names opened so that reading them can neither
hang nor be refused without the file being named (``open_input``, ``read_input``: exit 4); one
writer per run directory (``DirLock``, ``lock_dir``: an exclusive ``flock`` on ``<run>/.lock``).

The why and the details: docs/internals.md "spectest/files.py".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import stat
import subprocess
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spectest import __version__
from spectest.errors import ConfigError, InfrastructureError, InputError

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


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[str]:
    """A temporary file beside ``path`` that replaces it when the block ends (mode
    ``_FILE_MODE``) and is removed when the block raises; an ``OSError`` is one
    ``InfrastructureError`` naming ``path`` (``write_failed``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as err:
        raise write_failed(path, err) from None
    try:
        yield tmp
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):  # Arrow's "Error writing bytes to file" names no file
            raise write_failed(path, err) from None
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary and ``os.replace`` (``_replacing``)."""
    with _replacing(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


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
    with _replacing(path) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)
    return table.num_rows


def read_table(path: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Read a Parquet file (``columns``: only those); a missing or corrupt file is one
    ``InputError`` line naming it."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        return pq.read_table(path, columns=None if columns is None else list(columns)).to_pandas()
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


_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
)


def refused(path: str | os.PathLike[str], what: str, reason: str) -> InfrastructureError:
    """The one line (exit 4) for an input file the machine would not let spectest read."""
    return InfrastructureError(f"{os.fspath(path)}: cannot read the {what}: {reason}")


def not_regular(mode: int) -> str | None:
    """Why a file of this ``st_mode`` is not read as an input file, or None for a regular one."""
    for check, why in _KINDS:
        if check(mode):
            return why
    return None if stat.S_ISREG(mode) else "is not a regular file"


def open_input(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """Open ``path`` for binary reading; ``what`` names its role in messages ("protocol file").

    Raises ``InfrastructureError`` (exit 4) naming the path when it cannot be opened (permission
    denied, a component not searchable, an I/O error) or is not a regular file.

    Notes
    -----
    ``O_NONBLOCK`` makes the open of a FIFO without a writer return at once (it would block
    otherwise); the descriptor is then refused by ``fstat`` — checked on the open descriptor, so
    a file swapped between a ``stat`` and the ``open`` cannot slip through. A missing file is the
    caller's to report (``FileNotFoundError`` passes through).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise refused(path, what, "is a directory") from None
    except OSError as err:
        raise refused(path, what, err.strerror or type(err).__name__) from None
    try:
        why = not_regular(os.fstat(fd).st_mode)
        if why is not None:
            raise refused(path, what, why)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``path`` (so a caller sees that it is longer than
    ``limit`` without reading it all); errors as ``open_input``, and a read error (EIO) names
    the file too."""
    with open_input(path, what) as f:
        try:
            return f.read(limit + 1)
        except OSError as err:
            raise refused(path, what, err.strerror or type(err).__name__) from None


LOCK_FILE = ".lock"


class DirLock:
    """An exclusive ``flock`` on ``<run>/.lock``, held by an open descriptor.

    NOTE: flock, not a pid file: the kernel releases it when the descriptor is closed, and so when
    the holder dies in any way (SIGKILL, OOM), so a lock is never stale. The file is left in
    place (unlinking a locked file races a second opener) and holds the holder's pid for the
    message. The descriptor is not inherited by subprocesses (``os.open`` is non-inheritable).

    NOTE: the lock keeps other processes out. Within one process a new ``RunDir`` on a directory
    takes over the lock of an earlier one that was never released — a run that raised, whose
    frames a caller still holds (spectest never writes one directory from two threads).
    """

    def __init__(self, fd: int, key: str) -> None:
        self.fd: int | None = fd
        self.key = key
        _HELD[key] = self

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            if _HELD.get(self.key) is self:
                del _HELD[self.key]
            os.close(fd)  # closing the descriptor drops the flock

    def __del__(self) -> None:  # a RunDir dropped without release (an exception) unlocks too
        self.release()


# this process's live locks, by real path of the run directory; weak, so a RunDir that is
# dropped without release (a run that raised) still unlocks when it is collected
_HELD: weakref.WeakValueDictionary[str, DirLock] = weakref.WeakValueDictionary()


def lock_dir(run: Path) -> DirLock:
    """Take the lock of the existing directory ``run`` without waiting: a live holder in another
    process is a ``ConfigError`` naming its pid (exit 2); an ``OSError`` (permissions, read-only)
    is left to the caller, which knows the role of the path."""
    key = os.path.realpath(run)
    held = _HELD.get(key)
    if held is not None:
        held.release()  # abandoned by an earlier RunDir of this process (see DirLock)
    fd = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)  # umask applies
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise ConfigError(
            f"{run}: another spectest process{who} is writing to this run directory; "
            "wait for it to finish or choose another --out"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DirLock(fd, key)
