"""Claim (b) teacher-forced, unit by unit: where a run's U1 comes from (issue 31).

Usage: python tools/gpu/teacher_forced_positions.py RUN_DIR [--n 1500] [--sims 0]

RUN_DIR: a finished ``spectest run`` with ``arms.floor.teacher_forced`` (its samples.parquet and
teacher_laws.parquet). Prints, per (config, position), U1 = the unbiased ‖E(e_x − π(h))‖² of the
candidate and of the reference (the control), the number of distinct prefixes, and the mean of
U1 over all units and over positions ≥ 1 — position 0 has one prefix (the prompt), so a
verify-vs-prefill numerics difference there is not averaged over prefixes. A readout, not a test.

With ``--sims S``: each unit's U1 is also set against S draws of U1 under its own null — every
sequence's token drawn from π at its stored prefix (``null_u1``, seed 0) — giving the null sd
and a Monte Carlo p per unit, and per arm the smallest p with its Šidák correction over the
units (how often the most extreme of that many units is that extreme when all are exact). The
statistic's own per-unit sd (``stats.teacher_forced._u1``, a plug-in that keeps the squared mean
term) is printed beside it: at the null it reads 1.7–9× the null sd (results/LOG.md h67).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spectest import schema
from spectest.stats.teacher_forced import DEFAULT_SEQUENCES, _first, _u1, _Unit, _unit, law_dict
from spectest.stats.token_floor import cell_matrices


@dataclass(frozen=True)
class UnitReadout:
    """One unit: U1, its distinct prefixes, the statistic's plug-in sd, and (with sims) the sd
    of U1 under the unit's own null and the Monte Carlo p of U1 against it (NaN without)."""

    u1: float
    prefixes: int
    sd_plugin: float
    sd_null: float = math.nan
    p: float = math.nan


def null_u1(u: _Unit, sims: int, rng: np.random.Generator) -> np.ndarray:
    """``sims`` draws of the unit's U1 under its null: each sequence's token drawn from π at its
    own prefix (the prefixes held fixed, as teacher forcing conditions on them).

    Notes
    -----
    U1 with unit weights depends on the tokens only through the per-prefix counts C[r] (``_u1``:
    ‖Σ Z_i‖² minus Σ ‖Z_i‖² = N − 2 Σ_r C[r]·π_r + Σ_r n_r ‖π_r‖²), so each prefix's n_r tokens
    are one multinomial draw. A stored law with mass below 1 (rounded storage) is renormalised
    to draw, and used as stored in U1, like the observed U1.
    """
    rows = np.flatnonzero(u.has)
    n_r = np.asarray(u.hmap[rows].sum(0)).ravel()  # [m] sequences per prefix
    N = len(rows)
    s = np.zeros((sims, u.P.shape[1]))  # Σ Z_i
    cross = np.zeros(sims)  # Σ_i π_{h_i}(x_i)
    for r in np.flatnonzero(n_r):
        C = rng.multinomial(int(n_r[r]), u.P[r] / u.P[r].sum(), size=sims)  # [sims, V']
        s += C - n_r[r] * u.P[r]
        cross += C @ u.P[r]
    z2 = N + n_r @ (u.P * u.P).sum(1) - 2 * cross
    return ((s * s).sum(1) - z2) / (N * N - N)


def per_unit(
    df: pd.DataFrame, laws: dict, n: int, sims: int = 0
) -> dict[tuple[str, int], UnitReadout]:
    """``{(config, position): UnitReadout}`` of one arm's samples frame."""
    out = {}
    rng = np.random.default_rng(0)
    for cell, X in sorted(_first(cell_matrices(df), n).items()):
        for t in range(X.shape[1]):
            u = _unit(X, t, laws, cell)
            if u is None:
                continue
            U, v = _u1(u, np.ones((1, len(X))))
            r = UnitReadout(float(U[0]), int(u.P.shape[0]), math.sqrt(max(float(v[0]), 0.0)))
            if sims:
                z = null_u1(u, sims, rng)
                p = (1 + int((z >= U[0]).sum())) / (1 + sims)
                r = UnitReadout(r.u1, r.prefixes, r.sd_plugin, float(z.std()), p)
            out[(f"{cell[0]}|{cell[1]}", t)] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--n", type=int, default=DEFAULT_SEQUENCES)
    ap.add_argument("--sims", type=int, default=0, help="null draws per unit (0: none)")
    a = ap.parse_args()
    samples = pd.read_parquet(a.run / "samples.parquet")
    laws, *_ = law_dict(pd.read_parquet(a.run / "teacher_laws.parquet"))
    arms = {
        arm: per_unit(samples[samples[schema.ARM] == arm], laws, a.n, a.sims)
        for arm in ("candidate", "reference")
    }
    print(
        f"{'arm':9s} {'cell':30s} {'pos':>3s} {'U1':>10s} {'prefixes':>8s} {'sd plug-in':>10s} "
        f"{'sd null':>9s} {'p null':>7s}"
    )
    for arm, d in arms.items():
        for key, r in sorted(d.items()):
            print(
                f"{arm:9s} {key[0]:30s} {key[1]:3d} {r.u1:+10.2e} {r.prefixes:8d} "
                f"{r.sd_plugin:10.2e} {r.sd_null:9.2e} {r.p:7.4f}"
            )
    for arm, d in arms.items():
        allu = [v.u1 for v in d.values()]
        later = [v.u1 for k, v in d.items() if k[1] >= 1]
        ps = [v.p for v in d.values()]
        least = min(ps)
        print(
            f"{arm}: U1 per unit {np.mean(allu):+.3e} over {len(allu)} units; positions >= 1: "
            f"{np.mean(later):+.3e} over {len(later)}; smallest p {least:.4f}, Šidák over "
            f"{len(ps)} units {1 - (1 - least) ** len(ps):.4f}"
        )


if __name__ == "__main__":
    main()
