"""Calibration of claim (b) teacher-forced with prefixes left out (``stats.teacher_forced``: an
empty law, a prefix whose top-n list does not fix the law;
docs/numerics.md "A straddled token is left out"): the synthetic engine of
benchmarks/teacher_forced_top_n_calibration.py (V 10, 2 positions, lists of the top ``keep``
ids) with the laws after the first tokens ``--firsts`` left out, a correct candidate
replicated with fresh seeds. Prints how often each decision and LCB > 0 came out, with 95 %
Clopper–Pearson intervals, and the mean share left out. The null's "beyond" and LCB > 0 must
stay ≤ α (0.05).

Usage: PYTHONPATH=. python benchmarks/teacher_forced_left_out_calibration.py [--reps 200]
[--n 400] [--B 300] [--firsts 1 2] (about 0.2 s per replication and case on one CPU core).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import pandas as pd
from teacher_forced_top_n_calibration import cp, engine

from spectest.stats.teacher_forced import IDS, PREFIX, PROBS, decide_teacher_forced, prefix_key


def emptied(table: pd.DataFrame, firsts: set[int]) -> pd.DataFrame:
    """``table`` with the laws at the prefixes (v,), v in ``firsts``, empty (left out)."""
    out = table.copy()
    idx = out.index[out[PREFIX].isin({prefix_key(np.array([v])) for v in firsts})]
    out.loc[idx, IDS] = pd.Series([np.zeros(0, dtype=np.int64)] * len(idx), index=idx)
    out.loc[idx, PROBS] = pd.Series([np.zeros(0)] * len(idx), index=idx)
    return out


def run(a: argparse.Namespace, keep: int, margin: float) -> dict:
    got: Counter[str] = Counter()
    lcb_pos, share = 0, 0.0
    for r in range(a.reps):
        df, table = engine(7000 + 10 * keep + r, keep, a.n, 0.0)
        res = decide_teacher_forced(
            df,
            emptied(table, set(a.firsts)),
            margin=margin,
            alpha=0.05,
            rng=np.random.default_rng(r),
            resamples=a.B,
            left_out_max=1.0,  # the decision rule itself, not the bound
        )
        got[res.decision] += 1
        lcb_pos += res.lcb > 0
        share += res.left_out_share / a.reps
    return {"decisions": dict(got), "lcb_pos": lcb_pos, "share": share}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--B", type=int, default=300)
    ap.add_argument("--firsts", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args()
    for keep, margin in ((9, 0.1), (4, 0.01)):
        out = run(a, keep, margin)
        d = out["decisions"]
        print(
            f"null, lists of top {keep} of 10, laws after first tokens {a.firsts} left out "
            f"(mean share {out['share']:.3f}), n {a.n}, m {margin}: beyond "
            f"{cp(d.get('beyond', 0), a.reps)}; LCB > 0 {cp(out['lcb_pos'], a.reps)}; within "
            f"{cp(d.get('within', 0), a.reps)}"
        )


if __name__ == "__main__":
    main()
