"""The ``byo`` generator: two samples files for ``spectest compare`` (Parquet or CSV) drawn from
one law or two, mutated in columns (dropped, renamed, extra, twice), dtypes, values (negative,
huge, NaN, strings, nulls), ids (control characters, separators, unicode, 257 characters),
positions (gaps, duplicates, a shifted start, past int32), cells, bytes (NUL, a 300 KB line,
BOM, CRLF, invalid UTF-8, truncation, a damaged Parquet footer) and paths (missing, a directory,
a FIFO, a character device, a symlink loop, an odd extension), and the command's own options.
Knows nothing about running a case.
"""

from __future__ import annotations

import copy
import io
import random
from typing import Any

import numpy as np
import pandas as pd

from fuzzing.common import (
    VERDICTS,
    file_entry,
    new_case,
    np_rng,
    rng_for,
)

COLS = ["prompt_id", "config_id", "seed", "position", "token_id"]


def draw_samples(
    g: np.random.Generator,
    cells: list[tuple[str, str]],
    seeds: range,
    T: int,
    probs: np.ndarray,
    stop: float,
) -> pd.DataFrame:
    rows = []
    for pid, cid in cells:
        for s in seeds:
            n = T
            if stop > 0:
                while n > 1 and g.random() < stop:
                    n -= 1
            toks = g.choice(len(probs), size=n, p=probs)
            rows += [(pid, cid, s, t, int(toks[t])) for t in range(n)]
    return pd.DataFrame(rows, columns=COLS)


def _write_frame(df: pd.DataFrame, fmt: str) -> bytes:
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


def mutate_frame(
    r: random.Random, g: np.random.Generator, df: pd.DataFrame, fmt: str, notes: list[str], who: str
) -> tuple[pd.DataFrame | None, bytes | None]:
    """One change of a samples table; returns the new frame, or bytes when it cannot be a frame."""
    op = r.choice(
        [
            "drop",
            "rename",
            "extra",
            "values",
            "ids",
            "dtype",
            "gap",
            "dup",
            "shift",
            "cell",
            "empty",
            "one",
            "shuffle",
            "reorder",
            "negpos",
            "bigpos",
            "seeds",
            "nulls",
            "dupcol",
        ]
    )
    df = df.copy()
    if op == "drop":
        c = r.choice(COLS)
        df = df.drop(columns=[c])
        notes.append(f"{who}: drop column {c}")
    elif op == "rename":
        c = r.choice(COLS)
        new = r.choice([c.upper(), f" {c}", f"{c} ", c + "x", "ü", "", c.replace("_", "-")])
        df = df.rename(columns={c: new})
        notes.append(f"{who}: rename {c} -> {new!r}")
    elif op == "extra":
        name = r.choice(["arm", "wb_p", "extra", "round", "ü"])
        df[name] = r.choice([1, "x", 0.5, None])
        notes.append(f"{who}: extra column {name}")
    elif op == "values":
        c = r.choice(["seed", "position", "token_id"])
        v = copy.deepcopy(r.choice(INT_VALUES))
        col = df[c].astype(object)
        k = r.randrange(len(df))
        col.iloc[k] = v
        df[c] = col
        notes.append(f"{who}: {c}[{k}] = {v!r}")
    elif op == "ids":
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
    elif op == "dtype":
        c = r.choice(COLS)
        how = r.choice(["float", "str", "uint64", "int8", "category", "bool", "int32", "bytes"])
        try:
            if how == "float":
                df[c] = pd.to_numeric(df[c], errors="coerce").astype(float) + r.choice([0, 0.5])
            elif how == "str":
                df[c] = df[c].astype(str)
            elif how == "uint64":
                df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype("uint64") + (
                    2**63 if r.random() < 0.5 else 0
                )
            elif how == "int8":
                df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype("int8")
            elif how == "category":
                df[c] = df[c].astype("category")
            elif how == "bool":
                df[c] = df[c].astype(bool)
            elif how == "int32":
                df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype("int32")
            elif how == "bytes":
                df[c] = df[c].astype(str).str.encode("utf-8")
        except (ValueError, TypeError, OverflowError):
            pass
        notes.append(f"{who}: {c} as {how}")
    elif op == "gap":
        cand = df.index[df["position"] == 1] if "position" in df else df.index[:0]
        if len(cand):
            k = int(cand[r.randrange(len(cand))])
            df = df.drop(index=k)
            notes.append(f"{who}: drop row {k} (a gap)")
    elif op == "dup":
        k = r.randrange(len(df))
        df = pd.concat([df, df.iloc[[k]]], ignore_index=True)
        notes.append(f"{who}: row {k} twice")
    elif op == "shift":
        df["position"] = df["position"] + 1
        notes.append(f"{who}: positions start at 1")
    elif op == "cell":
        cid = df["config_id"].iloc[0]
        df.loc[df["config_id"] == cid, "config_id"] = "other"
        notes.append(f"{who}: config {cid} renamed other")
    elif op == "empty":
        df = df.iloc[:0]
        notes.append(f"{who}: header only")
    elif op == "one":
        df = df.iloc[:1]
        notes.append(f"{who}: one row")
    elif op == "shuffle":
        df = df.sample(frac=1.0, random_state=int(g.integers(2**31))).reset_index(drop=True)
        notes.append(f"{who}: rows shuffled")
    elif op == "reorder":
        cols = list(df.columns)
        r.shuffle(cols)
        df = df[cols]
        notes.append(f"{who}: columns {cols}")
    elif op == "negpos":
        df.loc[df.index[0], "position"] = -1
        notes.append(f"{who}: position -1")
    elif op == "bigpos":
        df["position"] = df["position"].astype("int64") + r.choice([2**31, 2**32, 2**32 + 100])
        notes.append(f"{who}: positions + 2^31..")
    elif op == "seeds":
        v = r.choice([-5, 2**63 - 1, 2**40, 0])
        df["seed"] = (
            df["seed"].astype("int64") * 0
            + v
            + df.groupby(["prompt_id", "config_id", "position"]).cumcount().astype("int64")
        )
        notes.append(f"{who}: seeds from {v}")
    elif op == "nulls":
        c = r.choice(COLS)
        col = df[c].astype(object)
        col.iloc[r.randrange(len(df))] = None
        df[c] = col
        notes.append(f"{who}: a null in {c}")
    elif op == "dupcol":
        if fmt == "csv":
            data = _write_frame(df, "csv")
            head, _, rest = data.partition(b"\n")
            notes.append(f"{who}: header names token_id twice")
            return None, head + b",token_id\n" + rest.replace(b"\n", b",1\n")
    return df, None


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


def byo_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "byo", index)
    g = np_rng(r)
    case = new_case("byo", index, seed)
    notes = case["notes"]
    P, C = r.choice([1, 2]), r.choice([1, 2])
    cells = [(f"p{i}", f"c{j}") for i in range(P) for j in range(C)]
    S, T = r.choice([20, 40, 80]), r.choice([1, 2, 3, 4])
    k = r.choice([3, 5, 8])
    probs = np.array([1 / (i + 1) for i in range(k)])
    probs /= probs.sum()
    stop = r.choice([0.0, 0.0, 0.1])
    ref = draw_samples(g, cells, range(S), T, probs, stop)
    cand_p = probs if r.random() < 0.6 else np.roll(probs, 1)
    cand = draw_samples(g, cells, range(S, 2 * S), T, cand_p, stop)
    notes.append(f"cells {len(cells)} seeds {S} T {T} law {'same' if cand_p is probs else 'other'}")
    files: dict[str, bytes] = {}
    names = {}
    for who, df in (("reference", ref), ("candidate", cand)):
        fmt = r.choice(["csv", "parquet"])
        name = f"{who}.{fmt}"
        frame: pd.DataFrame | None = df
        data: bytes | None = None
        n = r.choices([0, 1, 2], [55, 35, 10])[0]
        for _ in range(n):
            if frame is None:
                break
            try:
                frame, data = mutate_frame(r, g, frame, fmt, notes, who)
            except (KeyError, ValueError, TypeError, IndexError, OverflowError) as err:
                notes.append(f"{who}: a mutation did not apply ({type(err).__name__})")
        if frame is not None:
            try:
                data = _write_frame(frame, fmt)
            except Exception as err:  # a frame pyarrow cannot store: keep the file valid
                notes.append(f"{who}: unwritable frame ({type(err).__name__}); original kept")
                data = _write_frame(df, fmt)
        assert data is not None
        if r.random() < 0.15:
            data = (mutate_csv_bytes if fmt == "csv" else mutate_parquet_bytes)(r, data, notes, who)
        files[name] = data
        names[who] = name
    for name, data in files.items():
        case["files"][name] = file_entry(data)
    if r.random() < 0.08:  # the path itself
        who = r.choice(["reference", "candidate"])
        how = r.choice(["missing", "dir", "fifo", "device", "loop", "ext", "unicode"])
        if how == "missing":
            names[who] = "missing.parquet"
        elif how == "dir":
            names[who] = "adir.parquet"
            case["dirs"].append("adir.parquet")
        elif how == "fifo":
            names[who] = "fifo.csv"
            case["fifos"].append("fifo.csv")
        elif how == "device":
            names[who] = "zero.csv"
            case["symlinks"]["zero.csv"] = "/dev/zero"
        elif how == "loop":
            names[who] = "loop.parquet"
            case["symlinks"]["loop.parquet"] = "loop.parquet"
        elif how == "ext":
            new = f"{who}.{r.choice(['tsv', 'txt', 'PARQUET', 'CSV', 'json', ''])}".rstrip(".")
            case["files"][new] = case["files"].pop(names[who])
            names[who] = new
        else:
            new = f"ü {who}😀.{names[who].rsplit('.', 1)[1]}"
            case["files"][new] = case["files"].pop(names[who])
            names[who] = new
        notes.append(f"{who} path: {how} ({names[who]})")
    argv = [
        "compare",
        "--reference",
        names["reference"],
        "--candidate",
        names["candidate"],
        "--out",
        "run",
        "--no-progress",
    ]
    if r.random() < 0.25:
        opt = r.choice(["--alpha", "--multiplicity", "--max-mde-tv", "--out"])
        v = r.choice(
            {
                "--alpha": ["0", "-1", "nan", "inf", "1", "0.5", "1e-300", "abc", "0.05"],
                "--multiplicity": ["bh", "by", "maxT", "BH", "", "holm"],
                "--max-mde-tv": ["0", "-1", "nan", "2", "1", "0.5", "inf"],
                "--out": ["afile/run", "afile", "adir2"],
            }[opt]
        )
        argv += [opt, v]
        notes.append(f"cli {opt} {v!r}")
        if opt == "--out":
            case["out"] = v
            case["files"]["afile"] = file_entry("x\n")
            case["dirs"].append("adir2")
    case["argv"] = argv
    benign = (
        "rows shuffled",
        "columns [",
        "cli --alpha '0.05'",
        "cli --alpha '0.5'",
        "cli --multiplicity 'by'",
        "cli --multiplicity 'maxT'",
        "cli --max-mde-tv '1'",
        "cli --max-mde-tv '0.5'",
        "cli --multiplicity 'bh'",
        "cli --alpha '1e-300'",
    )
    if all(any(b in n for b in benign) for n in notes[1:]):
        case["expect"] = VERDICTS
    return case
