"""False-exit-1 and false-exit-3 rates of ``spectest compare`` under H0 (issue 9).

Each replication draws two samples files from ONE law, writes them as real files (reference
Parquet, candidate CSV) and calls ``spectest.byo_compare.compare_files`` on them — the same path as
``spectest compare`` (reading, checks, analysis, verdict, stored results and reports).

The law: 4 prompts × 3 configs = 12 cells, T = 8 positions (96 cell-positions, the issue's
count), ``--samples`` sequences per cell per file (256 by default, the issue's size). In each
cell the tokens follow a first-order Markov chain over V = 64 ids whose rows are Zipf(1.1) laws
over a cell-specific random permutation of the ids (so positions are dependent, as in a language
model); after every position a sequence stops with probability ``--stop`` (EOS; 0.03 by
default), so lengths vary and the sequence-length family is active under H0.

Recorded per replication: the exit code under the default resolution requirement (compare runs
no teeth: ``verdict.DEFAULT_MAX_MDE_TV``), the exit code the same comparisons get with the
requirement switched off (``--max-mde-tv 1``: only "nothing testable" can then give exit 3),
the median per-cell MDE (TV), and which families rejected.

    OMP_NUM_THREADS=1 nice python benchmarks/compare_h0.py [--reps 200] [--samples 256]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from spectest.byo_compare import compare_files
from spectest.decision.claims import DEFAULT_MAX_MDE_TV
from spectest.decision.verdict import decide

V, T = 64, 8
CELLS = [(f"p{i}", f"c{j}") for i in range(4) for j in range(3)]


def make_law(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per cell: (initial law [V], transition matrix [V, V])."""
    zipf = 1.0 / np.arange(1, V + 1) ** 1.1
    zipf /= zipf.sum()
    out = []
    for _ in CELLS:
        init = zipf[rng.permutation(V)]
        trans = np.stack([zipf[rng.permutation(V)] for _ in range(V)])
        out.append((init, trans))
    return out


def draw(
    rng: np.random.Generator, law: list[tuple[np.ndarray, np.ndarray]], n: int, stop: float
) -> pd.DataFrame:
    parts = []
    for (pid, cid), (init, trans) in zip(CELLS, law, strict=True):
        toks = np.empty((n, T), dtype=np.int64)  # [n, T]
        toks[:, 0] = rng.choice(V, size=n, p=init)
        cum = np.cumsum(trans, axis=1)  # [V, V]
        for t in range(1, T):
            u = rng.random(n)
            toks[:, t] = np.minimum((cum[toks[:, t - 1]] < u[:, None]).sum(axis=1), V - 1)
        length = np.minimum(rng.geometric(stop, size=n), T) if stop > 0 else np.full(n, T)
        seq, pos = np.nonzero(np.arange(T)[None, :] < length[:, None])
        parts.append(
            pd.DataFrame(
                {
                    "prompt_id": pid,
                    "config_id": cid,
                    "seed": seq.astype(np.int64),
                    "position": pos.astype(np.int32),
                    "token_id": toks[seq, pos],
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def _rate(c: Counter[int], code: int, n: int) -> dict[str, Any]:
    """The rate with its exact (Clopper–Pearson) 95 % interval."""
    ci = stats.binomtest(c[code], n).proportion_ci(0.95, method="exact")
    return {"rate": c[code] / n, "count": c[code], "ci95": [ci.low, ci.high]}


def _exits(codes: Counter[int], n: int) -> dict[str, Any]:
    return {
        "exit_codes": dict(sorted(codes.items())),
        "false_exit_1": _rate(codes, 1, n),
        "false_exit_3": _rate(codes, 3, n),
    }


def _replicate(
    args: argparse.Namespace, rng: np.random.Generator
) -> tuple[Counter[int], Counter[int], Counter[str], list[float]]:
    """``args.reps`` comparisons of two files drawn from one law: the exit codes by default and
    with ``--max-mde-tv 1``, the rejecting families, and the candidate cell's MDEs."""
    default_codes: Counter[int] = Counter()
    permissive_codes: Counter[int] = Counter()
    family_rejections: Counter[str] = Counter()
    mdes = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.reps):
            law = make_law(rng)
            ref, cand = Path(tmp) / f"ref{i}.parquet", Path(tmp) / f"cand{i}.csv"
            draw(rng, law, args.samples, args.stop).to_parquet(ref, index=False)
            draw(rng, law, args.samples, args.stop).to_csv(cand, index=False)
            res = compare_files(ref, cand, out=Path(tmp) / f"out{i}")
            default_codes[int(res.verdict.exit_code)] += 1
            loose = decide(res.comparisons, max_mde_tv=1.0, kind="compare")
            permissive_codes[int(loose.exit_code)] += 1
            cand_c = res.comparisons[0]
            for f in cand_c.families:
                if f.rejected:
                    family_rejections[f.name] += 1
            if cand_c.mde_tv is not None:
                mdes.append(cand_c.mde_tv)
            if (i + 1) % 20 == 0:
                print(
                    f"{i + 1}/{args.reps}: default {dict(default_codes)}, "
                    f"--max-mde-tv 1 {dict(permissive_codes)}, "
                    f"rejections {dict(family_rejections)}",
                    flush=True,
                )
    return default_codes, permissive_codes, family_rejections, mdes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=256, help="sequences per cell per file")
    ap.add_argument("--stop", type=float, default=0.03, help="stop probability per position")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--record", type=Path, default=Path("results/bench/compare_h0.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    default_codes, permissive_codes, family_rejections, mdes = _replicate(args, rng)
    n = args.reps

    record = {
        "date": date.today().isoformat(),
        "bench": "compare_h0",
        "reps": n,
        "samples_per_cell": args.samples,
        "cells": len(CELLS),
        "positions": T,
        "vocab": V,
        "stop": args.stop,
        "seed": args.seed,
        "default_max_mde_tv": DEFAULT_MAX_MDE_TV,
        "default": _exits(default_codes, n),
        "max_mde_tv_1": _exits(permissive_codes, n),
        "family_rejections": dict(family_rejections),
        "median_cell_mde_tv": {
            "min": float(np.min(mdes)) if mdes else None,
            "median": float(np.median(mdes)) if mdes else None,
            "max": float(np.max(mdes)) if mdes else None,
        },
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(record, indent=2))
    args.record.parent.mkdir(parents=True, exist_ok=True)
    with args.record.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
