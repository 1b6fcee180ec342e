"""Issue 31 item 4: claim (b)'s lower bound split between the drift and the floor
(``stats.drift.split_lcb``, Bonferroni over two one-sample bootstrap-t bounds): its closed form
on exact and normal inputs, the draws ``decide_drift`` makes (the UCB's unchanged), and its miss
rate under a right-skewed floor where the paired bootstrap-t bound misses more than α."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from spectest.stats.drift import _bounds, bootstrap_t, decide_drift, split_lcb


def _table(d: np.ndarray, f: np.ndarray) -> pd.DataFrame:
    """One position per sequence: TV ``d``; the first ``len(f)`` sequences have floor ``f``."""
    floor = np.full(len(d), np.nan)
    floor[: len(f)] = f
    return pd.DataFrame({"prompt_id": "p0", "config_id": "a", "seed": np.arange(len(d)),
                         "position": 0, "tv": d, "flip": False, "floor_tv": floor})  # fmt: skip


def test_split_lcb_without_variance_is_the_difference() -> None:
    """Constant parts (binary-exact): both one-sample bounds are their means, exactly."""
    rng = np.random.default_rng(0)
    assert split_lcb(np.full(8, 0.75), np.full(4, 0.25), 0.05, rng, 200) == 0.5


def test_split_lcb_against_the_normal_closed_form() -> None:
    """Normal parts of 4 000 sequences: bootstrap-t's t* is N(0, 1) to O(n^-1/2), so the bound
    is mean(d) − z_{1−α/2}·se_d − (mean(f) + z_{1−α/2}·se_f). Tolerance 0.15·(se_d + se_f): the
    Monte Carlo sd of the 2.5 % quantile of 4 000 resamples is 0.04 in z units (fixed seed)."""
    rng = np.random.default_rng(31)
    d, f = rng.normal(0.009, 0.003, 4000), rng.normal(0.004, 0.002, 4000)
    se_d, se_f = d.std(ddof=1) / np.sqrt(len(d)), f.std(ddof=1) / np.sqrt(len(f))
    z = stats.norm.ppf(0.975)
    want = d.mean() - z * se_d - (f.mean() + z * se_f)
    got = split_lcb(d, f, 0.05, np.random.default_rng(1), 4000)
    assert got == pytest.approx(want, abs=0.15 * (se_d + se_f))
    # the union bound's price: wider than the paired (here independent) bound at α
    _, paired, _ = bootstrap_t([d / len(d), -f / len(f)], 0.05, np.random.default_rng(2), 4000)
    assert got < paired


def test_decide_drift_lcb_is_the_lower_of_paired_and_split() -> None:
    """The draws ``decide_drift`` makes, replayed: the readouts, then the paired bound (its UCB
    is the decision's, unchanged by the split), then ``split_lcb``; the LCB is the lower."""
    rng = np.random.default_rng(5)
    d = 0.009 * rng.exponential(size=64) + 0.05 * (rng.random(64) < 0.05)
    f = 0.004 * rng.exponential(size=32) + 0.05 * (rng.random(32) < 0.05)
    r = decide_drift(_table(d, f), margin=0.002, alpha=0.05, rng=np.random.default_rng(9),
                     resamples=500)  # fmt: skip
    assert r is not None
    g = np.random.default_rng(9)
    for x in (d, d, f):  # drift, Σ_t TV_t (one position: the same terms), floor
        _bounds(x, 0.05, g, 500)
    strata = [d[:32] / 64 - f / 32, d[32:] / 64]
    _, lcb_p, ucb_p = bootstrap_t(strata, 0.05, g, 500)
    lcb_s = split_lcb(d, f, 0.05, g, 500)
    assert r.ucb == ucb_p and r.lcb == min(lcb_p, lcb_s) and lcb_s < lcb_p


def test_split_lcb_misses_at_most_alpha_under_a_skewed_floor() -> None:
    """64 drift / 32 floor sequences, each part exponential plus a rare jump (the floor: 0.05
    with probability 0.02, the nucleus-boundary flips of the toy calibration), true D in
    closed form. Over 400 replications (fixed seed) the paired bootstrap-t LCB misses 36
    (9 %: the problem), the split bound 4. False-failure rate of the ≤ 20 check if the split
    bound's miss were 1.5 %: P(Bin(400, 0.015) > 20) = 1e-6."""
    rng = np.random.default_rng(2026)
    true_d = (0.009 + 0.05 * 0.02) - (0.004 + 0.02 * 0.05)
    paired = split = 0
    for _ in range(400):
        d = 0.009 * rng.exponential(size=64) + 0.02 * (rng.random(64) < 0.05)
        f = 0.004 * rng.exponential(size=32) + 0.05 * (rng.random(32) < 0.02)
        _, lcb_p, _ = bootstrap_t([d / 64, -f / 32], 0.05, rng, 1000)
        paired += lcb_p > true_d
        split += min(lcb_p, split_lcb(d, f, 0.05, rng, 1000)) > true_d
    assert paired > 20 and split <= 20
