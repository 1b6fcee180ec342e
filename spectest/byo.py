"""Bring-your-own samples: read a samples file an external engine produced (Parquet, or CSV with
a header) and check it against ``schema.BYO_SCHEMA`` before ``spectest compare`` trusts it.

Owns: what a valid bring-your-own file is — the columns, their types, values that fit the stored
types (nothing wrapped or truncated), one row per (sequence, position), positions 0..n-1 with no
gap — and the one-line ``InputError`` naming the file, the column and the bad value. Knows
nothing about statistics or about how a comparison is stored (``spectest.compare``,
``spectest.store``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.errors import InputError
from spectest.store import read_table

_INT_COLS = (schema.SEED, schema.POSITION, schema.TOKEN_ID)
_STR_COLS = (schema.PROMPT_ID, schema.CONFIG_ID)
# inclusive upper bounds of the stored types (position int32, seed / token_id int64)
_INT_MAX = {schema.SEED: 2**63 - 1, schema.POSITION: 2**31 - 1, schema.TOKEN_ID: 2**63 - 1}
_SEQUENCE = (schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED)


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
        df[col] = _checked_integers(p, col, df[col])
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
    _check_no_gaps(p, df)
    extra = [
        c
        for c in df.columns
        if c not in {f.name for f in schema.BYO_SCHEMA} and c not in schema.WHITEBOX_COLUMNS
    ]
    return df.drop(columns=extra)


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
    have = set(df.loc[
        (df[schema.PROMPT_ID] == key[0]) & (df[schema.CONFIG_ID] == key[1])
        & (df[schema.SEED] == key[2]), schema.POSITION,
    ].tolist())  # fmt: skip
    missing = next(t for t in range(int(stats.loc[key, "max"]) + 1) if t not in have)
    after = min(t for t in have if t > missing)
    raise InputError(
        f"{p}: column position: sequence (prompt_id, config_id, seed) = "
        f"{(key[0], key[1], int(key[2]))!r} has position {after} but not {missing}: "
        f"a gap ({len(holed)} sequence(s) with gaps; positions must run 0, 1, ..., n-1)"
    )
