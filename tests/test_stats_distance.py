"""Plug-in TV and its permutation null (spectest.stats.distance)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from spectest.errors import ConfigError, InputError
from spectest.stats import distance, tables


def exact_null_mean(ref: np.ndarray, cand: np.ndarray) -> float:
    """E[TV] under relabeling the pooled tokens, by enumeration: by linearity it is
    ½ Σ_j E|a_j/n_a − (c_j − a_j)/n_b| with a_j ~ Hypergeom(n, c_j, n_a)."""
    na, nb = int(ref.sum()), int(cand.sum())
    total = 0.0
    for c in (ref + cand).tolist():
        a = np.arange(max(0, c - nb), min(c, na) + 1)
        total += np.sum(stats.hypergeom.pmf(a, na + nb, c, na) * np.abs(a / na - (c - a) / nb))
    return 0.5 * total


def test_tv_distance_values_and_bad_input():
    assert distance.tv_distance([1, 1], [1, 1]) == 0.0
    assert distance.tv_distance([1, 0], [0, 3]) == 1.0
    assert distance.tv_distance([3, 1], [1, 1]) == pytest.approx(0.25)  # ½(|.75−.5|+|.25−.5|)
    assert np.isnan(distance.tv_distance([0, 0], [1, 1]))
    with pytest.raises(InputError, match="shapes differ"):
        distance.tv_distance([1], [1, 2])


REF = np.array([30, 20, 10, 5, 3, 1, 1, 0])
CAND = np.array([25, 22, 12, 4, 2, 2, 0, 3])


def test_tv_test_null_mean_matches_the_exact_permutation_mean():
    """B = 20 000 hypergeometric draws: |mean − exact| < 4 standard errors (false-failure
    rate 6e-5). Fixed seed."""
    r = distance.tv_test(REF, CAND, np.random.default_rng(0), n_permutations=20_000)
    exact = exact_null_mean(REF, CAND)
    assert r.statistic == pytest.approx(distance.tv_distance(REF, CAND))
    assert r.excess == pytest.approx(r.statistic - r.null_mean)
    assert r.null_quantile > r.null_mean
    assert 0.0 < r.pvalue <= 1.0
    # the SD of the null TV is below 0.1 here, so SE < 0.1/√20000
    assert abs(r.null_mean - exact) < 4 * 0.1 / np.sqrt(20_000)


def test_sequence_permutation_null_has_the_same_marginal_law():
    """The fast path (whole sequences relabeled, one stratum) has the exact null mean too."""
    rng = np.random.default_rng(1)
    # one token per sequence; sequences 0..n_ref-1 are the reference arm (label_matrix)
    tok = np.r_[np.repeat(np.arange(8), REF), np.repeat(np.arange(8), CAND)]
    seq = np.arange(tok.size)
    t = tables.build_table(np.zeros(tok.size), tok, seq, n_seq=tok.size)
    lab = tables.label_matrix(int(REF.sum()), int(CAND.sum()), 20_000, rng)
    ref = tables.ref_counts(t, lab)
    n_ref, n_cand = tables.stratum_arm_sizes(t, ref)
    tv = distance.tv_statistics(t, ref, n_ref, n_cand, np.float32)[0]  # [1+B]
    assert tv[0] == pytest.approx(distance.tv_distance(REF, CAND), rel=1e-6)
    assert abs(tv[1:].mean() - exact_null_mean(REF, CAND)) < 4 * 0.1 / np.sqrt(20_000)
    _, _, p = distance.summarize_null(tv[:1], tv[None, 1:])
    assert p[0] == pytest.approx((1 + np.sum(tv[1:] >= tv[0])) / 20_001)


@pytest.mark.parametrize("merge", [False, True])
def test_tv_statistics_equal_tv_distance_per_stratum_and_labeling(merge):
    rng = np.random.default_rng(2)
    n, S = 300, 10
    w = 1.0 / np.arange(1, 201) ** 1.2
    tok = rng.choice(200, size=(n, S), p=w / w.sum())
    seq, stratum = np.nonzero(np.ones_like(tok, dtype=bool))
    t = tables.build_table(stratum, tok[seq, stratum], seq, n_seq=n, merge_singletons=merge)
    lab = tables.label_matrix(130, 170, 5, rng)
    ref = tables.ref_counts(t, lab)
    n_ref, n_cand = tables.stratum_arm_sizes(t, ref)
    fast = distance.tv_statistics(t, ref, n_ref, n_cand)
    for s in range(S):
        for b in range(6):
            is_ref = lab[:, b].astype(bool)
            a = np.bincount(tok[is_ref, s], minlength=200)
            c = np.bincount(tok[~is_ref, s], minlength=200)
            assert fast[s, b] == pytest.approx(distance.tv_distance(a, c), rel=1e-12)


def test_tv_test_bad_options_and_empty_arm():
    rng = np.random.default_rng(3)
    with pytest.raises(ConfigError, match="n_permutations"):
        distance.tv_test(REF, CAND, rng, n_permutations=0)
    r = distance.tv_test(REF, np.zeros_like(CAND), rng)
    assert np.isnan(r.statistic) and np.isnan(r.null_mean)
