"""Bring-your-own samples: a samples file (Parquet, or CSV with a header) read and checked
against ``schema.BYO_SCHEMA`` before ``spectest compare`` trusts it.

The why and the details: docs/internals.md "spectest/byo.py".
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.errors import InputError
from spectest.files import open_input, refused
from spectest.store import read_table

_INT_COLS = (schema.SEED, schema.POSITION, schema.TOKEN_ID)
_STR_COLS = (schema.PROMPT_ID, schema.CONFIG_ID)
# inclusive upper bounds of the stored types (position int32, seed / token_id int64)
_INT_MAX = {schema.SEED: 2**63 - 1, schema.POSITION: 2**31 - 1, schema.TOKEN_ID: 2**63 - 1}
_SEQUENCE = (schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED)
MAX_CSV_LINE_BYTES = 2**16  # a row is five short fields; ids are at most MAX_ID_CHARS
MAX_ID_CHARS = 256
_SCAN_BLOCK = 2**20
# what an id may not hold: control characters (C0, DEL, C1), Unicode line and paragraph
# separators, path separators (ids name report rows and, in runs, file names)
_BAD_ID_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029/\\]")


def read_samples_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a bring-your-own samples file (Parquet, or CSV with a header) and check it against
    ``schema.BYO_SCHEMA``: one line naming the file, the column and the bad value otherwise.

    Notes
    -----
    Beyond types: integers must fit their stored type (``position`` int32, ``seed`` and
    ``token_id`` int64) and be >= 0 — nothing is wrapped or truncated (``2**32 + 100`` would
    otherwise become position 100); every sequence (prompt_id, config_id, seed) must hold each
    position once and its positions must be exactly 0, 1, ..., n-1. A missing position in the
    middle (0, 1, 3) is a gap, refused: the token at 3 was drawn after a token the file does
    not show, so it cannot be tested as "the token at position 3" of a sequence. A sequence
    that simply stops early (0..5 of 0..31) is a shorter sequence (EOS, a length limit), not
    an error: its length is part of the law and is tested as such.
    """
    p = Path(path)
    return checked_samples(p, _read_any(p))


def checked_samples(p: Path, df: pd.DataFrame) -> pd.DataFrame:
    """``read_samples_file``'s checks on samples ``df`` as read from ``p`` (named in the lines)."""
    missing = [c for c in (f.name for f in schema.BYO_SCHEMA) if c not in df.columns]
    if missing:
        expected = ", ".join(f.name for f in schema.BYO_SCHEMA)
        raise InputError(f"{p}: missing column(s) {', '.join(missing)} (expected {expected})")
    if len(df) == 0:
        raise InputError(f"{p}: holds no samples")
    for col in _STR_COLS:
        df[col] = _checked_strings(p, col, df[col])
    for col in _INT_COLS:
        df[col] = _checked_integers(p, col, df[col])
    df[schema.POSITION] = df[schema.POSITION].astype("int32")
    dup = df.duplicated([schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED, schema.POSITION])
    if dup.any():
        r = df[dup].iloc[0]
        key = (*(r[c] for c in _STR_COLS), int(r[schema.SEED]), int(r[schema.POSITION]))
        raise InputError(f"{p}: duplicate row for (prompt_id, config_id, seed, position) = {key!r}")
    _check_no_gaps(p, df)
    df = _reported_columns(p, df)
    keep = {f.name for f in schema.BYO_SCHEMA} | set(schema.WHITEBOX_COLUMNS)
    extra = [c for c in df.columns if c not in keep and c not in schema.REPORTED_COLUMNS]
    return df.drop(columns=extra)


def _scan_csv(p: Path, sep: str) -> None:
    """Cheap sanity before pandas parses a CSV: the header (line 1) names every column of the
    schema, no byte is NUL and no line is longer than ``MAX_CSV_LINE_BYTES``. One pass in
    ``_SCAN_BLOCK`` blocks (numpy finds the newlines), so memory stays constant whatever the
    file; the first problem is one ``InputError`` naming the file and the line."""
    expected = [f.name for f in schema.BYO_SCHEMA]
    with open_input(p, "samples file") as f:
        line, line_start, offset = 1, 0, 0
        while True:
            try:
                block = f.read(_SCAN_BLOCK)
            except OSError as err:
                raise refused(p, "samples file", err.strerror or type(err).__name__) from None
            if not block:
                break
            if offset == 0:
                _check_header(p, block, sep, expected)
            nul = block.find(b"\0")
            if nul >= 0:
                at = line + block.count(b"\n", 0, nul)
                raise InputError(
                    f"{p}: line {at}: NUL byte at byte {offset + nul}: not a CSV text file"
                )
            nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + offset
            if nl.size:
                lengths = nl - np.r_[line_start, nl[:-1] + 1]
                long = np.flatnonzero(lengths > MAX_CSV_LINE_BYTES)
                if long.size:
                    _too_long(p, line + int(long[0]))
                line += int(nl.size)
                line_start = int(nl[-1]) + 1
            offset += len(block)
            if offset - line_start > MAX_CSV_LINE_BYTES:
                _too_long(p, line)


def _too_long(p: Path, line: int) -> None:
    raise InputError(
        f"{p}: line {line}: longer than {MAX_CSV_LINE_BYTES} bytes: not a samples file (a row is "
        "prompt_id, config_id, seed, position, token_id)"
    )


def _check_header(p: Path, block: bytes, sep: str, expected: list[str]) -> None:
    """Line 1 of a CSV (within the first block) must name every column of the schema."""
    end = block.find(b"\n")
    head = block if end < 0 else block[:end]
    if (nul := head.find(b"\0")) >= 0:
        raise InputError(f"{p}: line 1: NUL byte at byte {nul}: not a CSV text file")
    if len(head) > MAX_CSV_LINE_BYTES:
        _too_long(p, 1)
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r")
    names = [c.strip().strip('"') for c in text.split(sep)]
    missing = [c for c in expected if c not in names]
    if missing:
        raise InputError(
            f"{p}: missing column(s) {', '.join(missing)} (expected {', '.join(expected)}; "
            f"line 1 is {text[:80]!r})"
        )


def _read_any(p: Path) -> pd.DataFrame:
    """The file as read: CSV (or TSV/TXT) after ``_scan_csv``, else Parquet."""
    try:
        open_input(p, "samples file").close()  # exit 4 when the machine refuses it
    except FileNotFoundError:
        raise InputError(f"{p}: no such samples file") from None
    if p.suffix.lower() not in (".csv", ".tsv", ".txt"):
        return read_table(p)
    sep = "\t" if p.suffix.lower() == ".tsv" else ","
    _scan_csv(p, sep)
    try:
        return pd.read_csv(p, sep=sep, dtype={c: str for c in _STR_COLS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise InputError(f"{p}: not a readable CSV file ({str(err).splitlines()[0]})") from None


def _checked_strings(p: Path, col: str, s: pd.Series) -> pd.Series:
    """An id column as ``str``, refused when a value is empty, not a string, or a bad id."""
    bad = s[s.isna()]
    if len(bad):
        raise InputError(f"{p}: column {col}: empty value at row {int(bad.index[0])}")
    if not (pd.api.types.is_string_dtype(s) or pd.api.types.is_object_dtype(s)):
        raise InputError(f"{p}: column {col}: expected strings, got {s.dtype} (e.g. {s.iloc[0]!r})")
    out = s.astype(str)
    _check_ids(p, col, out)
    return out


def _reported_columns(p: Path, df: pd.DataFrame) -> pd.DataFrame:
    """The engine-reported columns checked as probabilities in [0, 1] (or empty); all of them
    present (unstated: NaN) when ``rep_p`` is, else none."""
    for c in (c for c in schema.REPORTED_COLUMNS if c in df.columns):
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero((df[c].notna().to_numpy() & np.isnan(v)) | (v < 0) | (v > 1 + 1e-6))
        if len(bad):
            raise InputError(
                f"{p}: column {c!r}: expected a probability in [0, 1] or empty, "
                f"got {df[c].iloc[bad[0]]!r} (row {int(bad[0])})"
            )
        df[c] = v
    if schema.REP_P not in df.columns:
        return df.drop(columns=[c for c in schema.REPORTED_COLUMNS if c in df.columns])
    for c in schema.REPORTED_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    return df


def _check_ids(p: Path, col: str, s: pd.Series) -> None:
    """Every ``prompt_id`` / ``config_id`` is non-empty, at most ``MAX_ID_CHARS`` characters,
    with no control character, line separator or path separator (checked on the distinct
    values: cheap)."""
    for v in pd.unique(s):
        why = (
            "is empty"
            if v == ""
            else f"is longer than {MAX_ID_CHARS} characters"
            if len(v) > MAX_ID_CHARS
            else "holds a control character or a path separator"
            if _BAD_ID_CHAR.search(v)
            else None
        )
        if why is not None:
            row = int(np.flatnonzero((s == v).to_numpy())[0])
            raise InputError(f"{p}: column {col}: the id {v!r:.80} {why} (row {row})")


def _exact_int(v: Any) -> int | None:
    """A cell as an exact Python int, or ``None`` when it is not an integer (bools are not)."""
    if isinstance(v, bool | np.bool_):
        return None
    if isinstance(v, int | np.integer):
        return int(v)
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            return int(v.strip())
        try:
            v = float(v)
        except ValueError:
            return None
    if isinstance(v, float | np.floating) and np.isfinite(v) and float(v).is_integer():
        return int(v)
    return None


def _checked_integers(p: Path, col: str, s: pd.Series) -> pd.Series:
    """``s`` as int64 after checking every value is an integer in [0, max of its stored type];
    the message names the file, the column, the first bad value and its row.

    NOTE: a column that is not already integer typed (floats, strings, a CSV value beyond
    uint64 that pandas keeps as text) is converted cell by cell to exact Python ints, so the
    range check never meets a float64 that rounded 2**63 or wrapped a large value."""

    def bad(mask: Any, what: str) -> InputError:
        i = int(np.asarray(mask, dtype=bool).nonzero()[0][0])
        v = s.iloc[i]
        v = v.item() if hasattr(v, "item") else v  # numpy scalar → Python for the message
        return InputError(f"{p}: column {col}: expected {what}, got {v!r} at row {i}")

    exact: pd.Series = s
    if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_integer_dtype(s):
        exact = s.map(_exact_int).astype(object)
        if exact.isna().any():
            raise bad(exact.isna(), "integers")
    lo, hi = 0, _INT_MAX[col]
    neg = (exact < lo).to_numpy(dtype=bool)
    if neg.any():
        raise bad(neg, f"integers >= {lo}")
    over = (exact > hi).to_numpy(dtype=bool)
    if over.any():
        raise bad(over, f"integers <= {hi} (the {col} column is {hi.bit_length() + 1}-bit)")
    return exact.astype("int64")


def _check_no_gaps(p: Path, df: pd.DataFrame) -> None:
    """Each sequence's positions are 0..n-1 (no duplicates: checked before). A sequence that
    stops early is fine; one with a hole is named with the first missing position."""
    g = df.groupby(list(_SEQUENCE), sort=False)[schema.POSITION]
    stats = g.agg(["size", "max"])
    holed = stats[stats["max"] + 1 != stats["size"]]
    if len(holed) == 0:
        return
    key = holed.index[0]
    have = set(
        df.loc[
            (df[schema.PROMPT_ID] == key[0])
            & (df[schema.CONFIG_ID] == key[1])
            & (df[schema.SEED] == key[2]),
            schema.POSITION,
        ].tolist()
    )
    missing = next(t for t in range(int(stats.loc[key, "max"]) + 1) if t not in have)
    after = min(t for t in have if t > missing)
    raise InputError(
        f"{p}: column position: sequence (prompt_id, config_id, seed) = "
        f"{(key[0], key[1], int(key[2]))!r} has position {after} but not {missing}: "
        f"a gap ({len(holed)} sequence(s) with gaps; positions must run 0, 1, ..., n-1)"
    )
