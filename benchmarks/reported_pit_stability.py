"""How far the reported-p PIT's p-value moves when one row leaves an arm's reported set.

An engine that reports only some of its tokens (llama.cpp: those it sampled outside a draft)
changes which rows it reports when a draft acceptance flips in the last bit, which its batching
makes happen between two runs on the same seeds. The randomised PIT u = lo + V·width needs one
V per token; this measures the two ways of laying the V out on a stored run's candidate arm:

- ``per reported row`` (before session 21): V drawn for the reported rows only, so one row that
  leaves the set shifts every later row's V;
- ``per row`` (``reported_p.reported_pit``): one V per row of the arm, reported or not.

For ``--removals`` reported rows (chosen with a fixed seed among those at ``--position``), the
row is taken out of the reported set and the pooled CvM p-value recomputed with the same V
stream; printed: the base p and the median and largest factor |p / p_base| (either way) per
layout. Deterministic.

Usage: python benchmarks/reported_pit_stability.py RUN_DIR [--arm candidate] [--position 5]
    [--removals 50] [--seed 123]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.stats.pit import pit_interval


def cvm_p(df: pd.DataFrame, seed: int, per_row: bool) -> float:
    """The pooled CvM p-value of ``df``'s reported rows, the V laid out one way or the other."""
    rng = np.random.default_rng(seed)
    reported = df[sc.REP_P].notna().to_numpy()
    rep = df[reported]
    lo, width, ok = pit_interval(
        rep[sc.REP_P].to_numpy(np.float64),
        rep[sc.REP_CDF_LO].to_numpy(np.float64),
        rep[sc.REP_MASS].to_numpy(np.float64),
    )
    assert ok.all(), "a reported row without a PIT interval"
    v = rng.random(len(df))[reported] if per_row else rng.random(int(reported.sum()))
    return float(stats.cramervonmises(lo + v * width, "uniform").pvalue)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--arm", default="candidate")
    ap.add_argument("--position", type=int, default=5)
    ap.add_argument("--removals", type=int, default=50)
    ap.add_argument("--seed", type=int, default=123)
    a = ap.parse_args()
    s = pd.read_parquet(f"{a.run_dir}/samples.parquet")
    arm = s[s[sc.ARM] == a.arm].reset_index(drop=True)
    at = np.flatnonzero((arm[sc.POSITION] == a.position) & arm[sc.REP_P].notna())
    chosen = np.random.default_rng(7).choice(at, min(a.removals, len(at)), replace=False)
    record: dict[str, object] = {"run_dir": a.run_dir, "arm": a.arm, "removals": len(chosen)}
    for per_row, name in ((False, "per reported row"), (True, "per row")):
        base = cvm_p(arm, a.seed, per_row)
        factors = []
        for i in chosen:
            gone = arm.copy()
            gone.loc[i, [sc.REP_P, sc.REP_CDF_LO, sc.REP_MASS]] = np.nan
            p = cvm_p(gone, a.seed, per_row)
            factors.append(max(p / base, base / p))
        f = np.array(factors)
        print(
            f"V {name}: base CvM p {base:.4g}; one row out of {int(arm[sc.REP_P].notna().sum())}"
            f" reported: p moves by a factor of {np.median(f):.3f} (median), {f.max():.3f} (max)"
        )
        record[name] = {"base_p": base, "median_factor": float(np.median(f)), "max": float(f.max())}
    print(json.dumps(record))


if __name__ == "__main__":
    main()
