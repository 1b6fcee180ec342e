"""The ``byo`` generator's mutations of one samples table: as a frame (columns dropped, renamed,
extra or twice, dtypes, values, ids, positions, cells, rows) drawn from the table
``FRAME_MUTATIONS``, and as bytes (CSV: NUL, long lines, BOM, CRLF, invalid UTF-8, truncation;
Parquet: truncation, flipped bytes, a damaged footer). ``fuzzing.byo`` builds the cases.
"""

from __future__ import annotations

import copy
import io
import random
from typing import Any

import numpy as np
import pandas as pd

COLS = ["prompt_id", "config_id", "seed", "position", "token_id"]


def write_frame(df: pd.DataFrame, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "csv":
        df.to_csv(buf, index=False)
    else:
        df.to_parquet(buf, index=False)
    return buf.getvalue()


ID_VALUES = [
    "",
    " ",
    "[/]",
    ":x:",
    "\x1b[31m",
    "a/b",
    "a\\b",
    "\n",
    "p\n",
    "\u2028",
    "\u0085",
    "x" * 256,
    "x" * 257,
    "ü",
    "😀",
    "<script>",
    "a,b",
    '"',
    "nan",
    "NULL",
    "0",
]
INT_VALUES: list[Any] = [
    -1,
    2**31,
    2**31 - 1,
    2**63 - 1,
    2**32 + 100,
    1.5,
    float("nan"),
    float("inf"),
    "abc",
    None,
    True,
    0,
    1,
    "1",
    " 2",
    "0x1",
]


Frame = tuple[pd.DataFrame | None, bytes | None]


def _drop(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    c = r.choice(COLS)
    notes.append(f"{who}: drop column {c}")
    return df.drop(columns=[c]), None


def _rename(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    c = r.choice(COLS)
    new = r.choice([c.upper(), f" {c}", f"{c} ", c + "x", "ü", "", c.replace("_", "-")])
    notes.append(f"{who}: rename {c} -> {new!r}")
    return df.rename(columns={c: new}), None


def _extra(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    name = r.choice(["arm", "wb_p", "extra", "round", "ü"])
    df[name] = r.choice([1, "x", 0.5, None])
    notes.append(f"{who}: extra column {name}")
    return df, None


def _values(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    c = r.choice(["seed", "position", "token_id"])
    v = copy.deepcopy(r.choice(INT_VALUES))
    col = df[c].astype(object)
    k = r.randrange(len(df))
    col.iloc[k] = v
    df[c] = col
    notes.append(f"{who}: {c}[{k}] = {v!r}")
    return df, None


def _ids(r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str) -> Frame:
    c = r.choice(["prompt_id", "config_id"])
    v = r.choice([*ID_VALUES, 5, None, 1.5])
    col = df[c].astype(object)
    if r.random() < 0.5:
        col[:] = v
        notes.append(f"{who}: every {c} = {v!r}")
    else:
        k = r.randrange(len(df))
        col.iloc[k] = v
        notes.append(f"{who}: {c}[{k}] = {v!r}")
    df[c] = col
    return df, None


def _numeric(col: pd.Series) -> pd.Series:
    return pd.to_numeric(col, errors="coerce")


# one dtype change of a column: (column, random) -> the new column
DTYPES: dict[str, Any] = {
    "float": lambda s, r: _numeric(s).astype(float) + r.choice([0, 0.5]),
    "str": lambda s, r: s.astype(str),
    "uint64": lambda s, r: (
        _numeric(s).fillna(0).astype("uint64") + (2**63 if r.random() < 0.5 else 0)
    ),
    "int8": lambda s, r: _numeric(s).fillna(0).astype("int8"),
    "category": lambda s, r: s.astype("category"),
    "bool": lambda s, r: s.astype(bool),
    "int32": lambda s, r: _numeric(s).fillna(0).astype("int32"),
    "bytes": lambda s, r: s.astype(str).str.encode("utf-8"),
}


def _dtype(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    c = r.choice(COLS)
    how = r.choice(list(DTYPES))
    try:
        df[c] = DTYPES[how](df[c], r)
    except (ValueError, TypeError, OverflowError):
        pass
    notes.append(f"{who}: {c} as {how}")
    return df, None


def _gap(r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str) -> Frame:
    cand = df.index[df["position"] == 1] if "position" in df else df.index[:0]
    if len(cand):
        k = int(cand[r.randrange(len(cand))])
        df = df.drop(index=k)
        notes.append(f"{who}: drop row {k} (a gap)")
    return df, None


def _dup(r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str) -> Frame:
    k = r.randrange(len(df))
    notes.append(f"{who}: row {k} twice")
    return pd.concat([df, df.iloc[[k]]], ignore_index=True), None


def _shift(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    df["position"] = df["position"] + 1
    notes.append(f"{who}: positions start at 1")
    return df, None


def _cell(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    cid = df["config_id"].iloc[0]
    df.loc[df["config_id"] == cid, "config_id"] = "other"
    notes.append(f"{who}: config {cid} renamed other")
    return df, None


def _empty(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    notes.append(f"{who}: header only")
    return df.iloc[:0], None


def _one(r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str) -> Frame:
    notes.append(f"{who}: one row")
    return df.iloc[:1], None


def _shuffle(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    df = df.sample(frac=1.0, random_state=int(g.integers(2**31))).reset_index(drop=True)
    notes.append(f"{who}: rows shuffled")
    return df, None


def _reorder(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    cols = list(df.columns)
    r.shuffle(cols)
    notes.append(f"{who}: columns {cols}")
    return df[cols], None


def _negpos(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    df.loc[df.index[0], "position"] = -1
    notes.append(f"{who}: position -1")
    return df, None


def _bigpos(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    df["position"] = df["position"].astype("int64") + r.choice([2**31, 2**32, 2**32 + 100])
    notes.append(f"{who}: positions + 2^31..")
    return df, None


def _seeds(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    v = r.choice([-5, 2**63 - 1, 2**40, 0])
    rank = df.groupby(["prompt_id", "config_id", "position"]).cumcount().astype("int64")
    df["seed"] = df["seed"].astype("int64") * 0 + v + rank
    notes.append(f"{who}: seeds from {v}")
    return df, None


def _nulls(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    c = r.choice(COLS)
    col = df[c].astype(object)
    col.iloc[r.randrange(len(df))] = None
    df[c] = col
    notes.append(f"{who}: a null in {c}")
    return df, None


def _dupcol(
    r: random.Random, g: Any, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    if fmt != "csv":
        return df, None
    head, _, rest = write_frame(df, "csv").partition(b"\n")
    notes.append(f"{who}: header names token_id twice")
    return None, head + b",token_id\n" + rest.replace(b"\n", b",1\n")


# the frame mutations, drawn from in this order by one random choice
FRAME_MUTATIONS = {
    "drop": _drop,
    "rename": _rename,
    "extra": _extra,
    "values": _values,
    "ids": _ids,
    "dtype": _dtype,
    "gap": _gap,
    "dup": _dup,
    "shift": _shift,
    "cell": _cell,
    "empty": _empty,
    "one": _one,
    "shuffle": _shuffle,
    "reorder": _reorder,
    "negpos": _negpos,
    "bigpos": _bigpos,
    "seeds": _seeds,
    "nulls": _nulls,
    "dupcol": _dupcol,
}


def mutate_frame(
    r: random.Random, g: np.random.Generator, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> Frame:
    """One change of a samples table; returns the new frame, or bytes when it cannot be a frame."""
    op = r.choice(list(FRAME_MUTATIONS))
    return FRAME_MUTATIONS[op](r, g, df.copy(), fmt, notes, who)


def mutate_csv_bytes(r: random.Random, data: bytes, notes: list[str], who: str) -> bytes:
    op = r.choice(
        [
            "nul",
            "longline",
            "crlf",
            "bom",
            "utf8",
            "truncate",
            "garbage",
            "quote",
            "empty",
            "noheader",
            "blank",
            "tabs",
            "flip",
        ]
    )
    b = bytearray(data)
    if op == "nul":
        k = r.randrange(len(b) + 1)
        b[k:k] = b"\x00" * r.choice([1, 1000])
    elif op == "longline":
        k = r.choice([70_000, 2**16, 2**16 + 1, 300_000])
        b += b"p0,c0,1,0," + b"9" * k + b"\n"
    elif op == "crlf":
        b = bytearray(bytes(b).replace(b"\n", b"\r\n"))
    elif op == "bom":
        b[:0] = b"\xef\xbb\xbf"
    elif op == "utf8":
        k = r.randrange(len(b) + 1)
        b[k:k] = b"\xff\xfe"
    elif op == "truncate":
        del b[r.randrange(len(b) + 1) :]
    elif op == "garbage":
        b += r.choice([b"a,b,c\n", b",,,,,,,\n", b'"\n', b"1,2\n", b"\n\n\n", b"#comment\n"])
    elif op == "quote":
        k = r.randrange(len(b) + 1)
        b[k:k] = b'"'
    elif op == "empty":
        b = bytearray()
    elif op == "noheader":
        b = bytearray(bytes(b).partition(b"\n")[2])
    elif op == "blank":
        b = bytearray(b"\n" * r.choice([1, 100]))
    elif op == "tabs":
        b = bytearray(bytes(b).replace(b",", b"\t"))
    elif op == "flip" and b:
        k = r.randrange(len(b))
        b[k] = r.randrange(256)
    notes.append(f"{who}: csv bytes {op}")
    return bytes(b)


def mutate_parquet_bytes(r: random.Random, data: bytes, notes: list[str], who: str) -> bytes:
    op = r.choice(["truncate", "flip", "zero", "garbage", "magic", "csv"])
    b = bytearray(data)
    if op == "truncate":
        del b[r.randrange(len(b)) :]
    elif op == "flip":
        for _ in range(r.choice([1, 8])):
            k = r.randrange(len(b))
            b[k] = r.randrange(256)
    elif op == "zero":
        b = bytearray()
    elif op == "garbage":
        b = bytearray(r.randbytes(r.choice([4, 100, 5000])))
    elif op == "magic":
        b[:4] = b"PAR2"
    elif op == "csv":
        b = bytearray(b"prompt_id,config_id,seed,position,token_id\np0,c0,0,0,1\n")
    notes.append(f"{who}: parquet bytes {op}")
    return bytes(b)
