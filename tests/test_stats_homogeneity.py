"""Pooled two-sample χ² and the one-sample GOF χ² (spectest.stats.homogeneity)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from test_stats_sim import zipf

from spectest.errors import InputError
from spectest.stats import homogeneity as hm
from spectest.stats import tables


def test_textbook_table_closed_form():
    """[[10, 20, 30], [20, 20, 20]]: expected 15/20/25 per row, χ² = 2·(25/15 + 0 + 25/25)
    = 16/3, dof 2, p = exp(−χ²/2) = 0.069483 (χ²₂ survival is exp(−x/2); scipy:
    chi2_contingency([[10, 20, 30], [20, 20, 20]], correction=False)). Nothing is pooled:
    every combined count ≥ 30 > 10."""
    r = hm.pooled_chi2([10, 20, 30], [20, 20, 20])
    assert r.status == "ok" and r.dof == 2 and r.n_bins == 3 and r.pooled_tokens == 0
    assert r.statistic == pytest.approx(16 / 3, rel=1e-12)
    assert r.pvalue == pytest.approx(np.exp(-8 / 3), rel=1e-12)
    assert r.min_expected == pytest.approx(15.0)
    assert (r.n_ref, r.n_cand) == (60, 60)


def test_pooling_merges_a_small_other_bin_into_the_smallest_kept_bin():
    """Totals [30, 20, 4, 3, 1] at equal sizes (w = ½): keep 30 and 20 (≥ 10); other = 8,
    expected 4 < 5 → merged into the 20-bin: pooled table [[15, 10+2+1+1], [15, 10+2+2+0]]."""
    ref, cand = [15, 10, 2, 1, 1], [15, 10, 2, 2, 0]
    bins, _ = hm.pool_tokens(np.add(ref, cand), 29, 29)
    np.testing.assert_array_equal(bins, [0, 1, 1, 1, 1])
    r = hm.pooled_chi2(ref, cand)
    want = stats.chi2_contingency([[15, 14], [15, 14]], correction=False)
    assert r.n_bins == 2 and r.dof == 1 and r.pooled_tokens == 3
    assert r.statistic == pytest.approx(want.statistic, abs=1e-12)
    assert r.pvalue == pytest.approx(want.pvalue)


def test_pooling_keeps_a_large_other_bin_and_generalises_to_unequal_sizes():
    # equal sizes: other = 4+3+2+2+1 = 12 → expected 6 ≥ 5: its own bin
    bins, n = hm.pool_tokens(np.array([30, 20, 4, 3, 2, 2, 1]), 31, 31)
    np.testing.assert_array_equal(bins, [0, 1, 2, 2, 2, 2, 2])
    assert n == 3
    # n_ref = 100, n_cand = 300: w = ¼ → keep c ≥ 20 (expected 5 in the smaller arm); the 19
    # is pooled, its other bin has expected 4.75 < 5 and joins the smallest kept bin (20)
    bins, n = hm.pool_tokens(np.array([19, 20, 361]), 100, 300)
    np.testing.assert_array_equal(bins, [0, 0, 1])
    assert n == 2
    bins, n = hm.pool_tokens(np.array([19, 2, 20, 359]), 100, 300)  # other = 21: own bin
    np.testing.assert_array_equal(bins, [2, 2, 0, 1])
    # symmetric in the arms: swapping the sizes changes nothing
    np.testing.assert_array_equal(hm.pool_tokens(np.array([19, 2, 20, 359]), 300, 100)[0], bins)
    # zero-count tokens get no bin
    assert hm.pool_tokens(np.array([0, 50, 50]), 50, 50)[0][0] == -1


def test_single_category_and_empty_arm_are_untestable_never_a_pass():
    one = hm.pooled_chi2([500, 0], [500, 0])
    assert one.status == "untestable" and np.isnan(one.pvalue) and one.n_bins == 1
    rare = hm.pooled_chi2([1, 1, 1, 1], [1, 1, 1, 0])  # all rare: "other" alone
    assert rare.status == "untestable" and rare.n_bins == 1
    empty = hm.pooled_chi2([5, 6, 7], [0, 0, 0])
    assert empty.status == "untestable" and np.isnan(empty.statistic)


def test_bad_counts_raise_input_error():
    with pytest.raises(InputError, match="one shape"):
        hm.pooled_chi2([1, 2], [1, 2, 3])
    with pytest.raises(InputError, match=">= 0"):
        hm.pooled_chi2([1, -2], [1, 2])


def test_permutation_method_is_passed_to_scipy():
    """scipy ≥ 1.15: chi2_contingency(t, correction=False, method=PermutationMethod(...)). Its
    p-value is within Monte-Carlo error (4σ, B = 2000; false-failure rate < 1e-4) of the
    asymptotic one on a table where the asymptotics hold."""
    ref, cand = [40, 30, 20, 10], [30, 35, 20, 15]
    asym = hm.pooled_chi2(ref, cand)
    perm = hm.pooled_chi2(
        ref, cand, method=stats.PermutationMethod(n_resamples=2000, rng=np.random.default_rng(0))
    )
    assert perm.method == "PermutationMethod" and asym.method == "asymptotic"
    assert perm.statistic == pytest.approx(asym.statistic)
    assert (
        abs(perm.pvalue - asym.pvalue) < 4 * np.sqrt(asym.pvalue * (1 - asym.pvalue) / 2000) + 0.01
    )


def _random_strata(rng, n_strata=40, n_seq=400, vocab=300):
    w = zipf(vocab, 1.3)
    tok = rng.choice(vocab, size=(n_seq, n_strata), p=w)  # [n, S]
    seq, stratum = np.nonzero(np.ones_like(tok, dtype=bool))
    return stratum, tok[seq, stratum], seq


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("sizes", [(200, 200), (150, 250)])
def test_vectorised_pooling_and_chi2_equal_scipy_per_stratum_and_per_relabeling(merge, sizes):
    """The fast path (pool_table + chi2_statistics over [K, 1+B]) equals pool_tokens +
    chi2_contingency stratum by stratum, for the observed labeling and for relabelings."""
    rng = np.random.default_rng(7)
    stratum, token, seq = _random_strata(rng)
    t = tables.build_table(stratum, token, seq, n_seq=400, merge_singletons=merge)
    lab = tables.label_matrix(*sizes, 3, rng)
    ref = tables.ref_counts(t, lab)
    n_ref, n_cand = tables.stratum_arm_sizes(t, ref)
    bins = hm.pool_table(t, n_ref[:, 0], n_cand[:, 0])
    fast64 = hm.chi2_statistics(t, bins, ref[:, :1], n_ref[:, :1], n_cand[:, :1])[:, 0]
    fast32 = hm.chi2_statistics(t, bins, ref, n_ref, n_cand, np.float32)
    full = tables.build_table(stratum, token, seq, n_seq=400, merge_singletons=False)
    full_ref = tables.ref_counts(full, lab)
    for s in range(t.n_strata):
        rows = slice(full.stratum_start[s], full.stratum_start[s + 1])
        tot = full.key_total[rows]
        for b in range(lab.shape[1]):
            a = full_ref[rows, b].astype(np.int64)
            slow = hm.pooled_chi2(a, tot - a)
            if b == 0:
                assert bins.n_bins[s] == slow.n_bins and bins.pooled_tokens[s] == slow.pooled_tokens
                assert bins.min_expected[s] == pytest.approx(slow.min_expected)
                assert bins.testable[s] == (slow.status == "ok")
                if slow.status == "ok":
                    assert fast64[s] == pytest.approx(slow.statistic, rel=1e-10, abs=1e-10)
            if slow.status == "ok":
                assert fast32[s, b] == pytest.approx(slow.statistic, rel=1e-4, abs=1e-4)


def test_pooled_chi2_type_one_rate_within_three_sigma():
    """Calibration, Zipf(1.5) over 2000 tokens, 500 vs 500 draws, 600 replications (one
    stratum each, one vectorised call). Rate at α = 0.05 within 3σ of α (σ = √(α(1−α)/600)
    = 0.0089); false-failure rate of the 3σ check ≈ 0.3 %. Fixed seed."""
    rng = np.random.default_rng(11)
    reps, n = 600, 500
    tok = rng.choice(2000, size=(2 * n, reps), p=zipf(2000))  # column = replication
    seq, stratum = np.nonzero(np.ones_like(tok, dtype=bool))
    t = tables.build_table(stratum, tok[seq, stratum], seq, n_seq=2 * n)
    ref = tables.ref_counts(t, tables.label_matrix(n, n, 0, rng))
    n_ref, n_cand = tables.stratum_arm_sizes(t, ref)
    bins = hm.pool_table(t, n_ref[:, 0], n_cand[:, 0])
    chi = hm.chi2_statistics(t, bins, ref, n_ref, n_cand)[:, 0]
    p = stats.chi2.sf(chi, bins.n_bins - 1)
    rate = float(np.mean(p <= 0.05))
    assert abs(rate - 0.05) <= 3 * np.sqrt(0.05 * 0.95 / reps), rate


def test_gof_chi2_against_a_hand_computed_value():
    """counts [18, 22, 30, 30] vs p [.2, .2, .3, .3], n = 100: χ² = 4/20 + 4/20 = 0.4, dof 3;
    p = chi2.sf(0.4, 3) (= scipy.stats.chisquare([18, 22, 30, 30], [20, 20, 30, 30]))."""
    r = hm.gof_chi2(np.array([18, 22, 30, 30]), np.array([0.2, 0.2, 0.3, 0.3]))
    assert r.statistic == pytest.approx(0.4) and r.dof == 3 and r.status == "ok"
    assert r.pvalue == pytest.approx(stats.chi2.sf(0.4, 3))
    # pooling on the known p: expected [50, 30, 10, 4, 4, 2] → keep 4, other 10 ≥ 5 its own bin
    r = hm.gof_chi2(np.array([48, 33, 9, 5, 3, 2]), np.array([0.5, 0.3, 0.1, 0.04, 0.04, 0.02]))
    want = stats.chisquare([48, 33, 9, 10], [50, 30, 10, 10])
    assert r.n_bins == 4 and r.statistic == pytest.approx(want.statistic)


def test_gof_support_violation_and_bad_probs():
    r = hm.gof_chi2(np.array([5, 5, 1]), np.array([0.5, 0.5, 0.0]))
    assert r.status == "support_violation" and r.pvalue == 0.0 and np.isinf(r.statistic)
    with pytest.raises(InputError, match="sum to 1"):
        hm.gof_chi2(np.array([1, 2]), np.array([0.5, 0.6]))


def test_gof_against_the_reference_histogram_is_not_valid():
    """Documents the invalid use: plugging the reference arm's histogram in as known
    probabilities roughly doubles the null variance at equal sizes, so the rate at α = 0.05 is
    far above α (measured ≈ 0.3 here; asserted > 0.15, > 10σ above α). 300 replications,
    fixed seed."""
    rng = np.random.default_rng(12)
    p = zipf(20, 1.0)
    hits = 0
    for _ in range(300):
        a = rng.multinomial(2000, p)
        b = rng.multinomial(2000, p)
        hits += hm.gof_chi2(b, a / a.sum()).pvalue <= 0.05
    assert hits / 300 > 0.15
