"""Claim (b) teacher-forced, unit by unit: where a run's U1 comes from (issue 31).

Usage: python tools/gpu/teacher_forced_positions.py RUN_DIR [--n 1500]

RUN_DIR: a finished ``spectest run`` with ``arms.floor.teacher_forced`` (its samples.parquet and
teacher_laws.parquet). Prints, per (config, position), U1 = the unbiased ‖E(e_x − π(h))‖² of the
candidate and of the reference (the control), the number of distinct prefixes, and the mean of
U1 over all units and over positions ≥ 1 — position 0 has one prefix (the prompt), so a
verify-vs-prefill numerics difference there is not averaged over prefixes. A readout, not a test.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from spectest import schema
from spectest.stats.teacher_forced import DEFAULT_SEQUENCES, _first, _u1, _unit, law_dict
from spectest.stats.token_drift import _cells


def per_unit(df: pd.DataFrame, laws: dict, n: int) -> dict[tuple[str, int], tuple[float, int]]:
    """``{(config, position): (U1, distinct prefixes)}`` of one arm's samples frame."""
    out = {}
    for cell, X in sorted(_first(_cells(df), n).items()):
        for t in range(X.shape[1]):
            u = _unit(X, t, laws, cell)
            if u is not None:
                U, _ = _u1(u, np.ones((1, len(X))))
                out[(f"{cell[0]}|{cell[1]}", t)] = (float(U[0]), int(u.P.shape[0]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--n", type=int, default=DEFAULT_SEQUENCES)
    a = ap.parse_args()
    samples = pd.read_parquet(a.run / "samples.parquet")
    laws, _ = law_dict(pd.read_parquet(a.run / "teacher_laws.parquet"))
    arms = {
        arm: per_unit(samples[samples[schema.ARM] == arm], laws, a.n)
        for arm in ("candidate", "reference")
    }
    print(f"{'cell':40s} {'pos':>3s} {'U1 candidate':>13s} {'U1 reference':>13s} {'prefixes':>8s}")
    for key in sorted(arms["candidate"]):
        c, m = arms["candidate"][key]
        r = arms["reference"].get(key, (float("nan"), 0))[0]
        print(f"{key[0]:40s} {key[1]:3d} {c:+13.3e} {r:+13.3e} {m:8d}")
    for arm, d in arms.items():
        allu = [v[0] for v in d.values()]
        later = [v[0] for k, v in d.items() if k[1] >= 1]
        print(
            f"{arm}: U1 per unit {np.mean(allu):+.3e} over {len(allu)} units; positions >= 1: "
            f"{np.mean(later):+.3e} over {len(later)}"
        )


if __name__ == "__main__":
    main()
