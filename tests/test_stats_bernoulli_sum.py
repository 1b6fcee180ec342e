"""The count test behind the white-box acceptance and directed tests (``stats.bernoulli_sum``): its
exact law equals enumeration; above ``SMALL_VARIANCE`` it is the normal test it always was; where
acceptance is near-certain its false-alarm rate is at most α while the normal approximation's was
several times α (session 23: one rejection among 43 008 draft slots that each accepted with
probability ~0.999999 read as 4.7σ and failed a run's white-box control).

The exact checks have no false-failure rate. The simulations use fixed seeds; at their sizes a
correct test fails them with probability below 1e-4 (binomial tails, stated at each).
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import stats

from spectest.stats.bernoulli_sum import SMALL_VARIANCE, CountResult, count_test


def test_the_exact_law_is_the_enumerated_one() -> None:
    rng = np.random.default_rng(0)
    o = rng.uniform(0.0, 1.0, 10)
    o[:5] = [0.999, 0.001, 0.5, 0.0, 1.0]  # rare both ways, even, and two certain outcomes
    law: dict[int, float] = {}
    for xs in itertools.product([0, 1], repeat=10):
        x = np.array(xs)
        if (x[3] == 1) or (x[4] == 0):
            continue  # impossible outcomes of the certain ones
        law[int(x.sum())] = law.get(int(x.sum()), 0.0) + float(
            np.prod(np.where(x == 1, o, 1.0 - o))
        )
    for k in range(1, 10):
        x = np.array([0] * 10)
        x[4] = 1
        x[[i for i in range(10) if i not in (3, 4)][: k - 1]] = 1
        lower = sum(v for c, v in law.items() if c <= k)
        upper = sum(v for c, v in law.items() if c >= k)
        want = min(1.0, 2.0 * min(lower, upper))
        got = count_test(x.astype(float), o)
        assert abs(got.pvalue - want) <= 1e-12 * max(1.0, want), (k, got, want)
        assert abs(got.pvalue_greater - upper) <= 1e-12  # one-sided


def test_large_variance_is_the_normal_test_and_zero_variance_decides() -> None:
    rng = np.random.default_rng(1)
    o = rng.uniform(0.2, 0.8, 400)  # Σ o(1 − o) ≈ 80 ≥ SMALL_VARIANCE
    x = (rng.uniform(size=400) < o).astype(float)
    assert float(np.sum(o * (1 - o))) >= SMALL_VARIANCE
    want = (x.sum() - o.sum()) / np.sqrt(np.sum(o * (1 - o)))
    assert count_test(x, o) == CountResult(
        want, 2.0 * stats.norm.sf(abs(want)), stats.norm.sf(want)
    )
    assert count_test(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == CountResult(0.0, 1.0, 1.0)
    r = count_test(np.array([0.0, 0.0]), np.array([1.0, 0.0]))
    assert r.statistic == -np.inf and r.pvalue == 0.0


def test_one_rare_rejection_is_not_significant() -> None:
    """Session 23's white-box control: 43 008 slots, 25 % of them at o = 1 − 4e-6, the rest
    certain; one rejection (probability ~4 % under H0) was z = −4.7."""
    o = np.ones(43008)
    o[: 43008 // 4] = 1.0 - 4e-6
    x = np.ones_like(o)
    x[7] = 0.0
    r = count_test(x, o)
    z, p = r.statistic, r.pvalue
    mu = float(np.sum(1.0 - o))  # ≈ 0.043 expected rejections
    assert abs(p - min(1.0, 2.0 * (1.0 - np.exp(-mu)))) < 1e-3  # ≈ 2 P(≥ 1 rejection)
    assert p > 0.05 and -2.0 < z < 0.0
    normal = (x.sum() - o.sum()) / np.sqrt(np.sum(o * (1 - o)))
    assert normal < -4.5  # what the normal approximation said


def test_near_certain_acceptance_keeps_the_stated_rate() -> None:
    """4 000 null replicates of 300 live slots accepting with probability 0.9998–0.99999 (~0.03
    expected rejections), tested at α = 0.001 (one test's share after a family's correction):
    the exact test rejects at most α of them (a correct test exceeds the bound, the 1e-4 upper
    binomial quantile at 4 000, with probability < 1e-4); the normal approximation rejected
    every replicate with a rejection, more than 10α."""
    rng = np.random.default_rng(23)
    reps, n, alpha = 4000, 300, 0.001
    o = rng.uniform(0.9998, 0.99999, n)
    x = (rng.uniform(size=(reps, n)) < o[None, :]).astype(float)
    exact = np.array([count_test(row, o).pvalue for row in x])
    var = float(np.sum(o * (1 - o)))
    normal = 2.0 * stats.norm.sf(np.abs((x.sum(1) - o.sum()) / np.sqrt(var)))
    bound = stats.binom.isf(1e-4, reps, alpha) / reps
    assert (exact <= alpha).mean() <= bound
    assert (normal <= alpha).mean() > 10 * alpha
    # and it still sees a sampler that rejects a hundred times too often
    bad = (rng.uniform(size=(200, n)) < 1.0 - 100.0 * (1.0 - o)[None, :]).astype(float)
    assert np.mean([count_test(row, o).pvalue <= alpha for row in bad]) > 0.8
