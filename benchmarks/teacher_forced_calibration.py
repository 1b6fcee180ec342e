"""Calibration of claim (b) teacher-forced (``spectest.stats.teacher_forced``): false "beyond"
under the null and false "within" at the boundary, each with Clopper–Pearson bounds.

Usage: python benchmarks/teacher_forced_calibration.py [--reps 200] [--n 400] [--seed 0]

A synthetic engine: per cell a random Markov chain over V tokens (the law at a prefix depends on
its last token; softmax of N(0, 1.5²) logits), T positions. The plain law π at each prefix is
exact. **Null**: the candidate draws from π (U1's expectation 0): "beyond" must be ≤ α.
**Boundary**: the candidate draws from π + δ, δ moving mass m from the chain's most likely
token to another at every prefix (every law gives that token ≥ m), so E(e_x − π(h)) = δ at
every position and U1's expectation is ‖δ‖² = 2m² exactly: "within" must be ≤ α. Prints each
rate with its 95 % Clopper–Pearson interval and the mean bounds; takes ~1 s per replication.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema
from spectest.stats.teacher_forced import IDS, PREFIX, PROBS, decide_teacher_forced, prefix_key

V, T, CELLS = 12, 4, 2


def chain(rng: np.random.Generator, m: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Markov chain's laws ``[V + 1, V]`` (row V: the first position's), its boundary-shifted
    twin (mass ``m`` from token 0, made the likeliest, to token 1) and that shift δ."""
    while True:
        logits = rng.normal(0, 1.5, size=(V + 1, V))
        logits[:, 0] = logits.max(-1) + 1.0
        pi = np.exp(logits)
        pi /= pi.sum(-1, keepdims=True)
        if pi[:, 0].min() >= m:
            break
    delta = np.zeros(V)
    delta[0], delta[1] = -m, m
    return pi, pi + delta, delta


def sample(rng: np.random.Generator, law: np.ndarray, n: int, cell: int, arm: str) -> pd.DataFrame:
    """``n`` sequences of T tokens drawn from the chain ``law`` as a samples frame."""
    X = np.zeros((n, T), dtype=np.int64)
    prev = np.full(n, V)
    for t in range(T):
        c = law[prev].cumsum(-1)
        X[:, t] = np.minimum((rng.random(n)[:, None] > c).sum(-1), V - 1)
        prev = X[:, t]
    seeds = np.repeat(np.arange(n), T)
    return pd.DataFrame(
        {
            schema.PROMPT_ID: f"p{cell}",
            schema.CONFIG_ID: "c",
            schema.SEED: seeds + (0 if arm == "candidate" else n),
            schema.POSITION: np.tile(np.arange(T), n),
            schema.TOKEN_ID: X.reshape(-1),
        }
    )


def laws_of(frames: list[pd.DataFrame], pis: list[np.ndarray]) -> pd.DataFrame:
    """The plain law at every prefix the frames hold (π of the prefix's last token)."""
    rows = []
    for df in frames:
        for (pid, _), g in df.groupby(list(schema.CELL)):
            pi = pis[int(str(pid)[1:])]
            X = g.sort_values([schema.SEED, schema.POSITION])[schema.TOKEN_ID].to_numpy()
            for x in np.unique(X.reshape(-1, T), axis=0):
                for t in range(T):
                    last = V if t == 0 else int(x[t - 1])
                    rows.append((pid, "c", t, prefix_key(x[:t]), np.arange(V), pi[last]))
    cols = [schema.PROMPT_ID, schema.CONFIG_ID, schema.POSITION, PREFIX, IDS, PROBS]
    return pd.DataFrame(rows, columns=cols).drop_duplicates(subset=cols[:4])


def replicate(rng: np.random.Generator, n: int, m: float, boundary: bool, resamples: int):
    """One replication's ``TeacherForcedResult``."""
    chains = [chain(rng, m) for _ in range(CELLS)]
    cand = pd.concat(
        [
            sample(rng, ch[1] if boundary else ch[0], n, k, "candidate")
            for k, ch in enumerate(chains)
        ]
    )
    ref = pd.concat([sample(rng, ch[0], n, k, "reference") for k, ch in enumerate(chains)])
    laws = laws_of([cand, ref], [ch[0] for ch in chains])
    return decide_teacher_forced(
        cand, laws, margin=m, alpha=0.05, rng=rng, n_max=n, reference=ref, resamples=resamples
    )


def cp(k: int, n: int) -> tuple[float, float]:
    """The 95 % Clopper–Pearson interval of k successes in n."""
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def run(reps: int, n: int, m: float, boundary: bool, seed: int, resamples: int) -> dict:
    """Rates of each decision over ``reps`` replications."""
    rng = np.random.default_rng(seed)
    out = [replicate(rng, n, m, boundary, resamples) for _ in range(reps)]
    bad = "within" if boundary else "beyond"
    k = sum(r.decision == bad for r in out)
    truth = 2 * m * m if boundary else 0.0
    return {
        "bad": bad,
        "k": k,
        "rate": k / reps,
        "cp": cp(k, reps),
        "lcb": float(np.mean([r.lcb for r in out])),
        "ucb": float(np.mean([r.ucb for r in out])),
        "stat": float(np.mean([r.statistic for r in out])),
        "lcb_miss": sum(r.lcb > truth for r in out),  # the lower bound above the truth
        "ucb_miss": sum(r.ucb < truth for r in out),
        "control": float(np.mean([r.control for r in out])),
        "control_beyond": sum(r.control_lcb > r.margin_sq for r in out),
        "decisions": {
            d: sum(r.decision == d for r in out) for d in ("within", "beyond", "unresolved")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for boundary in (False, True):
        t0 = time.time()
        r = run(a.reps, a.n, a.margin, boundary, a.seed + int(boundary), a.resamples)
        what = "boundary (U1 = 2m²)" if boundary else "null (U1 = 0)"
        print(
            f"{what}: false {r['bad']} {r['k']}/{a.reps} = {r['rate']:.3f} "
            f"[{r['cp'][0]:.3f}, {r['cp'][1]:.3f}]; mean U1 {r['stat']:+.2e} in "
            f"[{r['lcb']:+.2e}, {r['ucb']:+.2e}], 2m² {2 * a.margin**2:.2e}; decisions "
            f"{r['decisions']}; control mean {r['control']:+.2e}, control LCB > 2m² "
            f"{r['control_beyond']}; bound misses: LCB > truth {r['lcb_miss']}, UCB < truth "
            f"{r['ucb_miss']}; n {a.n} per cell, {CELLS} cells × {T} positions, "
            f"{time.time() - t0:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
