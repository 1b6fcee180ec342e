"""The ``byo`` generator: two samples files for ``spectest compare`` (Parquet or CSV) drawn from
one law or two, mutated in columns (dropped, renamed, extra, twice), dtypes, values (negative,
huge, NaN, strings, nulls), ids (control characters, separators, unicode, 257 characters),
positions (gaps, duplicates, a shifted start, past int32), cells, bytes (NUL, a 300 KB line,
BOM, CRLF, invalid UTF-8, truncation, a damaged Parquet footer) and paths (missing, a directory,
a FIFO, a character device, a symlink loop, an odd extension), and the command's own options.
Knows nothing about running a case.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd

from fuzzing.byo_mutations import (
    COLS,
    mutate_csv_bytes,
    mutate_frame,
    mutate_parquet_bytes,
    write_frame,
)
from fuzzing.common import (
    VERDICTS,
    file_entry,
    new_case,
    np_rng,
    rng_for,
)


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


def _laws(r: random.Random, g: np.random.Generator, notes: list[str]) -> dict[str, pd.DataFrame]:
    """The reference and candidate samples: one law, or the candidate's rolled by one token."""
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
    return {"reference": ref, "candidate": cand}


def _samples_file(
    r: random.Random, g: np.random.Generator, df: pd.DataFrame, notes: list[str], who: str
) -> tuple[str, bytes]:
    """One samples file: its name and bytes after 0-2 frame mutations and maybe a byte one."""
    fmt = r.choice(["csv", "parquet"])
    frame: pd.DataFrame | None = df
    data: bytes | None = None
    for _ in range(r.choices([0, 1, 2], [55, 35, 10])[0]):
        if frame is None:
            break
        try:
            frame, data = mutate_frame(r, g, frame, fmt, notes, who)
        except (KeyError, ValueError, TypeError, IndexError, OverflowError) as err:
            notes.append(f"{who}: a mutation did not apply ({type(err).__name__})")
    if frame is not None:
        try:
            data = write_frame(frame, fmt)
        except Exception as err:  # a frame pyarrow cannot store: keep the file valid
            notes.append(f"{who}: unwritable frame ({type(err).__name__}); original kept")
            data = write_frame(df, fmt)
    assert data is not None
    if r.random() < 0.15:
        data = (mutate_csv_bytes if fmt == "csv" else mutate_parquet_bytes)(r, data, notes, who)
    return f"{who}.{fmt}", data


def _renamed(r: random.Random, case: dict[str, Any], old: str, who: str, how: str) -> str:
    """The file ``old`` moved to an odd extension ("ext") or a unicode name ("unicode")."""
    if how == "ext":
        new = f"{who}.{r.choice(['tsv', 'txt', 'PARQUET', 'CSV', 'json', ''])}".rstrip(".")
    else:
        new = f"ü {who}😀.{old.rsplit('.', 1)[1]}"
    case["files"][new] = case["files"].pop(old)
    return new


# a hostile path for one side: how -> (name, the case list or map it goes in, its target)
ODD_PATHS: dict[str, tuple[str, str | None, str | None]] = {
    "missing": ("missing.parquet", None, None),
    "dir": ("adir.parquet", "dirs", None),
    "fifo": ("fifo.csv", "fifos", None),
    "device": ("zero.csv", "symlinks", "/dev/zero"),
    "loop": ("loop.parquet", "symlinks", "loop.parquet"),
}


def _odd_path(r: random.Random, case: dict[str, Any], names: dict[str, str]) -> None:
    """Point one side at a missing file, a directory, a FIFO, a device, a loop or an odd name."""
    who = r.choice(["reference", "candidate"])
    how = r.choice([*ODD_PATHS, "ext", "unicode"])
    if how in ODD_PATHS:
        name, where, target = ODD_PATHS[how]
        if where == "symlinks":
            case["symlinks"][name] = target
        elif where is not None:
            case[where].append(name)
        names[who] = name
    else:
        names[who] = _renamed(r, case, names[who], who, how)
    case["notes"].append(f"{who} path: {how} ({names[who]})")


CLI_VALUES = {
    "--alpha": ["0", "-1", "nan", "inf", "1", "0.5", "1e-300", "abc", "0.05"],
    "--multiplicity": ["bh", "by", "maxT", "BH", "", "holm"],
    "--max-mde-tv": ["0", "-1", "nan", "2", "1", "0.5", "inf"],
    "--out": ["afile/run", "afile", "adir2"],
}
# notes that leave the comparison well-formed: a case with only these expects a verdict
BENIGN = (
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


def _cli_option(r: random.Random, case: dict[str, Any], argv: list[str]) -> None:
    """One of compare's own options set to an odd value (``--out`` at a file or a directory)."""
    opt = r.choice(list(CLI_VALUES))
    v = r.choice(CLI_VALUES[opt])
    argv += [opt, v]
    case["notes"].append(f"cli {opt} {v!r}")
    if opt == "--out":
        case["out"] = v
        case["files"]["afile"] = file_entry("x\n")
        case["dirs"].append("adir2")


def byo_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "byo", index)
    g = np_rng(r)
    case = new_case("byo", index, seed)
    notes = case["notes"]
    names = {}
    for who, df in _laws(r, g, notes).items():
        names[who], data = _samples_file(r, g, df, notes, who)
        case["files"][names[who]] = file_entry(data)
    if r.random() < 0.08:  # the path itself
        _odd_path(r, case, names)
    argv = ["compare", "--reference", names["reference"], "--candidate", names["candidate"]]
    argv += ["--out", "run", "--no-progress"]
    if r.random() < 0.25:
        _cli_option(r, case, argv)
    case["argv"] = argv
    if all(any(b in n for b in BENIGN) for n in notes[1:]):
        case["expect"] = VERDICTS
    return case
