"""BH / BY / Holm via statsmodels and Westfall–Young max-T (spectest.stats.multiplicity)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from spectest.errors import ConfigError, InputError
from spectest.stats import multiplicity as mt

# Benjamini & Hochberg (1995), section 4: the 15 p-values of their example; BH at q = 0.05
# rejects the four smallest.
BH95 = np.array(
    [
        0.0001,
        0.0004,
        0.0019,
        0.0095,
        0.0201,
        0.0278,
        0.0298,
        0.0344,
        0.0459,
        0.3240,
        0.4262,
        0.5719,
        0.6528,
        0.7590,
        1.0000,
    ]
)
# R: p.adjust(p, "BH") = pmin(1, cummin(n / i * p[o]))[ro], hand-computed from that definition:
BH95_ADJ = np.array(
    [
        0.0015,
        0.0030,
        0.0095,
        0.035625,
        0.0603,
        0.0638571428571,
        0.0638571428571,
        0.0645,
        0.0765,
        0.486,
        0.581181818182,
        0.714875,
        0.753230769231,
        0.813214285714,
        1.0,
    ]
)


def test_bh_on_the_published_example():
    r = mt.adjust(BH95, "bh", 0.05)
    np.testing.assert_allclose(r.pvalue_adjusted, BH95_ADJ, rtol=1e-9)
    assert r.n_rejected == 4 and r.reject[:4].all() and not r.reject[4:].any()
    assert r.method == "bh" and "fdr_bh" in r.procedure and r.n_tests == 15


def test_by_and_holm_against_outside_numbers():
    # scipy's independent implementation: false_discovery_control(p, method='by')
    r = mt.adjust(BH95, "by", 0.05)
    np.testing.assert_allclose(
        r.pvalue_adjusted, stats.false_discovery_control(BH95, method="by"), rtol=1e-12
    )
    c15 = np.sum(1.0 / np.arange(1, 16))  # BY = BH × Σ 1/i, then capped at 1
    np.testing.assert_allclose(r.pvalue_adjusted[:4], np.minimum(1, BH95_ADJ[:4] * c15), rtol=1e-9)
    assert (
        "fdr_by" in r.procedure and r.n_rejected == 3
    )  # p_(4): 0.0095 × 15/4 × 3.318 = 0.118 > 0.05
    # Holm by hand: sorted p × (m − i + 1), running max
    h = mt.adjust(BH95, "holm", 0.05)
    want = np.minimum(1, np.maximum.accumulate(BH95 * np.arange(15, 0, -1)))
    np.testing.assert_allclose(h.pvalue_adjusted, want, rtol=1e-12)


def test_edge_cases_one_pvalue_empty_and_nan():
    for method in ("bh", "by", "holm", "bonferroni"):
        r = mt.adjust([0.03], method, 0.05)
        assert r.pvalue_adjusted[0] == pytest.approx(0.03) and r.reject[0]
    e = mt.adjust(np.array([]), "bh")
    assert e.n_tests == 0 and e.pvalue_adjusted.shape == (0,) and e.n_rejected == 0
    r = mt.adjust([0.01, np.nan, 0.04], "bh", 0.05)
    assert np.isnan(r.pvalue_adjusted[1]) and not r.reject[1] and r.n_tests == 2
    np.testing.assert_allclose(r.pvalue_adjusted[[0, 2]], [0.02, 0.04])


def test_bad_method_alpha_or_pvalues_raise():
    with pytest.raises(ConfigError, match="'hs'"):
        mt.adjust([0.1], "hs")  # statsmodels' default is Holm–Šidák: never used silently
    with pytest.raises(ConfigError, match="alpha"):
        mt.adjust([0.1], "bh", alpha=1.5)
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        mt.adjust([0.1, 1.2], "bh")
    with pytest.raises(InputError, match="null must be"):
        mt.maxt_adjust(np.zeros(3), np.zeros((10, 2)))


def test_maxt_single_step_equals_a_direct_loop_and_step_down_is_never_larger():
    rng = np.random.default_rng(0)
    obs = rng.standard_normal(12) + np.r_[3.0, 2.5, np.zeros(10)]
    null = rng.standard_normal((199, 12))
    ss = mt.maxt_adjust(obs, null, step_down=False)
    for j in range(12):
        want = (1 + sum(null[b].max() >= obs[j] for b in range(199))) / 200
        assert ss.pvalue_adjusted[j] == pytest.approx(want)
    sd = mt.maxt_adjust(obs, null)
    assert (sd.pvalue_adjusted <= ss.pvalue_adjusted + 1e-15).all()
    assert sd.method == "maxT" and "step-down" in sd.procedure
    # the most extreme hypothesis gets the same adjusted p from both
    top = int(np.argmax(obs))
    assert sd.pvalue_adjusted[top] == ss.pvalue_adjusted[top]
    # monotone in the observed order
    order = np.argsort(-obs)
    assert np.all(np.diff(sd.pvalue_adjusted[order]) >= 0)


def test_maxt_one_hypothesis_nan_and_floor():
    r = mt.maxt_adjust(np.array([2.0]), np.array([[1.0], [3.0], [2.0], [0.0]]))
    assert r.pvalue_adjusted[0] == pytest.approx((1 + 2) / 5)  # ties count as extreme
    r = mt.maxt_adjust(np.array([np.nan, 9.0]), np.array([[1.0, np.nan], [2.0, 1.0]]))
    assert np.isnan(r.pvalue_adjusted[0]) and r.pvalue_adjusted[1] == pytest.approx(1 / 3)
    assert r.n_tests == 1


def test_maxt_fwer_is_exact_under_exchangeability():
    """Under H0 the observed statistics are exchangeable with the B permuted ones, so the
    single-step max-T rejects anything with probability floor(α(B+1))/(B+1) = 5/100 at
    B = 99, α = 0.05 (step-down: the same event for the first rejection). 1000 replications,
    m = 8 correlated statistics; rate within 3σ (σ = 0.0069); false-failure rate ≈ 0.3 %."""
    rng = np.random.default_rng(1)
    cov = 0.5 + 0.5 * np.eye(8)
    chol = np.linalg.cholesky(cov)
    hits = 0
    for _ in range(1000):
        z = rng.standard_normal((100, 8)) @ chol.T  # row 0 observed, rows 1.. null
        hits += mt.maxt_adjust(z[0], z[1:], 0.05).n_rejected > 0
    assert abs(hits / 1000 - 0.05) <= 3 * np.sqrt(0.05 * 0.95 / 1000), hits
