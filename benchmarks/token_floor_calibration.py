"""Calibration of claim (b) from tokens (issue 31, ``spectest.stats.token_floor``): the false
"beyond" rate at the margin's boundary and the "within" rate under the null, over fixed seeds.

The law: ``compare_h0``'s (its first ``--cells`` of 12 cells, T = 8, V = 64, a first-order
Markov chain per cell, stop probability 0.03). The reference, the candidate and floor B are
drawn with ``--samples`` sequences per cell each; floor A is the reference itself (a run's
shape: reference vs floor arm). Scenario ``null``: all three from one law (true D = 0). Scenario
``boundary``: the candidate from the chain mixed with another (λ chosen by bisection so that the
mean over units of the exact marginal Σ_v (p − q)² equals 2m²): true D = 2m² exactly, so a
"beyond" there is a false one. Exact marginals: init · trans^t (stopping is independent of the
tokens). Recorded: the decisions, P(LCB > true D) and P(UCB < true D).

    OMP_NUM_THREADS=1 nice python benchmarks/token_floor_calibration.py --scenario null \
        [--reps 200] [--samples 256] [--margin 0.02] [--out results/bench/token_floor_null.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).parent))
import compare_h0
from compare_h0 import T, V, draw, make_law

from spectest.stats.token_floor import decide_token_floor, margin_sq


def marginals(law: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Exact per-position marginals ``[cells, T, V]``."""
    out = np.empty((len(law), T, V))
    for c, (init, trans) in enumerate(law):
        p = init
        for t in range(T):
            out[c, t] = p
            p = p @ trans
    return out


def mix(law: list, other: list, lam: float) -> list:
    return [
        ((1 - lam) * a + lam * c, (1 - lam) * b + lam * d)
        for (a, b), (c, d) in zip(law, other, strict=True)
    ]


def boundary_law(law: list, other: list, target: float) -> tuple[list, float]:
    """The mixture whose mean marginal squared L2 from ``law`` is ``target`` (bisection)."""
    base = marginals(law)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        lam = (lo + hi) / 2
        d = float(((marginals(mix(law, other, lam)) - base) ** 2).sum(-1).mean())
        lo, hi = (lam, hi) if d < target else (lo, lam)
    return mix(law, other, lo), float(((marginals(mix(law, other, lo)) - base) ** 2).sum(-1).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=("null", "boundary"), required=True)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--margin", type=float, default=0.02)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--cells", type=int, default=12, help="the first N of compare_h0's cells")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    compare_h0.CELLS[:] = compare_h0.CELLS[: a.cells]
    t0 = time.time()
    rows = []
    for rep in range(a.reps):
        rng = np.random.default_rng([20261202, rep])
        law = make_law(rng)
        cand_law, true_d = law, 0.0
        if a.scenario == "boundary":
            cand_law, true_d = boundary_law(law, make_law(rng), margin_sq(a.margin))
        ref, cand, fb = (
            draw(rng, law, a.samples, 0.03),
            draw(rng, cand_law, a.samples, 0.03),
            draw(rng, law, a.samples, 0.03),
        )
        r = decide_token_floor(ref, cand, ref, fb, margin=a.margin, alpha=a.alpha,
                               rng=np.random.default_rng([7, rep]))  # fmt: skip
        rows.append({"decision": r.decision, "D": r.statistic, "lcb": r.lcb, "ucb": r.ucb,
                     "true_D": true_d})  # fmt: skip
        print(rep, r.decision, f"{r.statistic:+.2e} [{r.lcb:+.2e}, {r.ucb:+.2e}]", flush=True)
    n = len(rows)
    count = {k: sum(r["decision"] == k for r in rows) for k in ("within", "beyond", "unresolved")}
    lcb_miss = sum(r["lcb"] > r["true_D"] for r in rows)
    ucb_miss = sum(r["ucb"] < r["true_D"] for r in rows)
    cp = stats.beta.ppf(0.95, lcb_miss + 1, n - lcb_miss) if lcb_miss < n else 1.0
    out = {
        "scenario": a.scenario, "reps": n, "samples_per_cell": a.samples, "cells": a.cells,
        "T": T, "V": V, "margin_tv": a.margin, "margin_sq": margin_sq(a.margin),
        "alpha": a.alpha, "decisions": count, "lcb_miss": lcb_miss, "lcb_miss_cp95": cp,
        "ucb_miss": ucb_miss, "mean_D": float(np.mean([r["D"] for r in rows])),
        "true_D": rows[0]["true_D"] if rows else None, "wall_s": round(time.time() - t0, 1),
        "command": " ".join(sys.argv),
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
