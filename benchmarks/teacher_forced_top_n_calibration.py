"""Calibration of claim (b) teacher-forced in its coarsened mode (top-n lists short of 1,
``stats.teacher_forced``): a synthetic engine (``engine``, also used by
tests/test_teacher_forced_top_n.py: V 10, 2 positions, 11 random laws, each listed as its top
``keep`` ids), a correct candidate (draws from π) replicated with fresh seeds. Prints, per
case, how often each decision and LCB > 0 came out, with 95 % Clopper–Pearson intervals. The
null's "beyond" and LCB > 0 must stay ≤ α.

Usage: PYTHONPATH=. python benchmarks/teacher_forced_top_n_calibration.py [--reps 200]
[--n 400] [--B 300] (about 0.2 s per replication and case on one CPU core; 200: ~80 s).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import pandas as pd
from scipy.stats import beta

from spectest import schema
from spectest.stats.teacher_forced import LAWS, decide_teacher_forced, prefix_key

V = 10


def _pi(rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.dirichlet(np.full(V, 0.7)))[::-1]


def engine(seed: int, keep: int, n: int, move: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """2 positions, 1 cell: π at position 0 and at each (x_0) for position 1; the laws listed
    as their top ``keep`` ids (descending), the candidate drawing from π with ``move`` of the
    top token's mass moved to the ids outside the list (uniformly)."""
    rng = np.random.default_rng(seed)
    laws = {(): _pi(rng)} | {(v,): _pi(rng) for v in range(V)}
    rows, table = [], []
    for s in range(n):
        prefix: tuple[int, ...] = ()
        for t in range(2):
            q = laws[prefix].copy()
            q[0] -= move
            q[keep:] += move / (V - keep)
            x = int(rng.choice(V, p=q / q.sum()))
            rows.append(("p", "c", s, t, x))
            prefix = (*prefix, x)
    for h, p in laws.items():
        table.append(("p", "c", len(h), prefix_key(np.array(h)), np.arange(keep), p[:keep]))
    cols = [schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED, schema.POSITION, schema.TOKEN_ID]
    return pd.DataFrame(rows, columns=cols), pd.DataFrame(table, columns=list(LAWS))


def cp(k: int, n: int) -> str:
    lo = beta.ppf(0.025, k, n - k + 1) if k else 0.0
    hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return f"{k}/{n} = {k / n:.1%} [{lo:.1%}, {hi:.1%}]"


def run(reps: int, n: int, keep: int, margin: float, B: int, seed: int) -> dict:
    """``reps`` replications of a correct candidate with lists of the top ``keep`` ids."""
    got: Counter[str] = Counter()
    lcb_pos = 0
    outside = 0.0
    for r in range(reps):
        df, table = engine(seed + r, keep, n, 0.0)
        res = decide_teacher_forced(
            df, table, margin=margin, alpha=0.05, rng=np.random.default_rng(r), resamples=B
        )
        got[res.decision] += 1
        lcb_pos += res.lcb > 0
        outside = max(outside, res.outside_max)
    return {"decisions": dict(got), "lcb_pos": lcb_pos, "outside_max": outside}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--B", type=int, default=300)
    a = ap.parse_args()
    for keep, margin in ((4, 0.01), (9, 0.1)):
        out = run(a.reps, a.n, keep, margin, a.B, 1000 * keep)
        d = out["decisions"]
        print(
            f"null, lists of top {keep} of 10 (outside max {out['outside_max']:.3f}), n {a.n}, "
            f"m {margin}: beyond {cp(d.get('beyond', 0), a.reps)}; LCB > 0 "
            f"{cp(out['lcb_pos'], a.reps)}; within {cp(d.get('within', 0), a.reps)}"
        )


if __name__ == "__main__":
    main()
