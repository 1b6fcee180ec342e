"""The sequence-level family (spectest.stats.sequence): fast path = slow reference, exactness of
the min-p combination, calibration under H0 with dependent positions, power where per-position
marginals are blind, and its place in ``analyze``."""

from __future__ import annotations

import numpy as np
import pytest
from test_stats_sim import markov, sample_plain, samples_frame, zipf

from spectest.stats import AnalysisOptions, analyze, sequence, tables


@pytest.mark.parametrize("trial", range(6))
def test_cell_statistics_equal_the_slow_reference(trial):
    """Observed column of every statistic equals the dict/loop/scipy reference (exact maths),
    with absent tokens (odd trials) and the three pooling regimes (merged singletons or not)."""
    rng = np.random.default_rng(100 + trial)
    na, nb, T, V = 40 + trial, 37, 5, 6 + 3 * trial
    tok = rng.integers(0, V, size=(na + nb, T)).astype(np.int32)
    if trial % 2:
        tok[rng.random(tok.shape) < 0.1] = -1
    me = [5.0, 2.0, 0.5][trial % 3]
    labels = tables.label_matrix(na, nb, 3, rng)
    fast = sequence.cell_statistics(tok, labels, min_expected=me)
    slow = sequence.cell_statistics_reference(tok[:na], tok[na:], min_expected=me)
    np.testing.assert_allclose(fast[:, 0], slow, rtol=1e-9, atol=1e-12)
    # a relabeling column equals the reference on the relabeled arms
    ref_rows = labels[:, 2].astype(bool)
    slow2 = sequence.cell_statistics_reference(tok[ref_rows], tok[~ref_rows], min_expected=me)
    np.testing.assert_allclose(fast[:, 2], slow2, rtol=1e-9, atol=1e-12)


def test_block_size_does_not_change_the_statistics():
    rng = np.random.default_rng(7)
    tok = rng.integers(0, 9, size=(60, 4)).astype(np.int32)
    labels = tables.label_matrix(30, 30, 20, rng)
    a = sequence.cell_statistics(tok, labels, block=3)
    b = sequence.cell_statistics(tok, labels)
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_prefix_ids_identify_equal_prefixes():
    tok = np.array([[1, 2, 3], [1, 2, 4], [1, 5, 3], [2, 2, -1], [1, 2, 3]])
    ids = sequence.prefix_ids(tok)
    assert ids[0, 0] == ids[1, 0] == ids[2, 0] == ids[4, 0] != ids[3, 0]
    assert ids[0, 1] == ids[1, 1] == ids[4, 1] != ids[2, 1]
    assert ids[0, 2] == ids[4, 2] and len({ids[0, 2], ids[1, 2], ids[2, 2]}) == 3
    assert ids[3, 2] == -1


def test_pair_codes_are_distinct_per_pair():
    tok = np.array([[0, 1, 2], [1, 0, -1]])
    codes = sequence.pair_codes(tok)
    assert codes.shape == (2, 2) and codes[1, 1] == -1
    assert len({codes[0, 0], codes[0, 1], codes[1, 0]}) == 3


def test_combine_exact_extremes():
    """Observed column strictly largest in every cell and statistic: every p-value is 1/(B+1);
    a statistic constant over the columns contributes z = 0 (no division by zero)."""
    B = 19
    rng = np.random.default_rng(3)
    cells = []
    for _ in range(3):
        v = rng.random((5, B + 1))
        v[:, 0] = 2.0
        v[4] = 1.0  # constant
        cells.append(v)
    res = sequence.combine(cells)
    assert res.n_permutations == B
    np.testing.assert_allclose(res.stat_pvalue[:4], 1 / (B + 1))
    assert res.stat_pvalue[4] == 1.0 and res.z[4] == 0.0
    assert res.pvalue == pytest.approx(1 / (B + 1)) and res.statistic > 0
    assert (res.stat_adjusted >= res.stat_pvalue).all()
    assert res.stat_adjusted.min() == pytest.approx(res.pvalue)
    empty = sequence.combine([])
    assert np.isnan(empty.pvalue) and empty.cell_pvalue.shape == (0, 5)


def _h0_pvalues(reps: int, rng: np.random.Generator, B: int = 49) -> np.ndarray:
    """[reps, 1 + J]: family p then each statistic's p, both arms from one Markov chain
    (strong dependence between positions), 3 cells × 60 sequences per arm × 6 positions."""
    out = np.zeros((reps, 1 + len(sequence.STATISTICS)))
    chains = [markov(6, rng) for _ in range(3)]
    for r in range(reps):
        cells = []
        for m in chains:
            tok = np.vstack([sample_plain(m, 60, 6, rng), sample_plain(m, 60, 6, rng)])
            labels = tables.label_matrix(60, 60, B, rng)
            cells.append(sequence.cell_statistics(tok, labels, min_expected=5.0))
        res = sequence.combine(cells)
        out[r, 0] = res.pvalue
        out[r, 1:] = res.stat_pvalue
    return out


def test_h0_rejection_rates_are_alpha():
    """120 H0 replications: at α = 0.1 (= 5/50 exactly with B = 49) the family and each
    statistic reject at a rate within 3σ (σ = √(0.1·0.9/120) = 0.027) of 0.1. Fixed seed; the
    false-failure rate of each of the 6 bands is ≈ 0.3 %, of the test ≈ 1.6 %."""
    p = _h0_pvalues(120, np.random.default_rng(11))
    rate = (p <= 0.1 + 1e-12).mean(axis=0)
    sigma = np.sqrt(0.1 * 0.9 / 120)
    assert (np.abs(rate - 0.1) <= 3 * sigma).all(), rate


@pytest.mark.slow
def test_h0_family_pvalue_is_uniform():
    """600 H0 replications: the family p-value's rate at α ∈ {0.02, 0.1, 0.2} within 3σ —
    at 0.02 = 1/(B + 1) too, which a min-p over rank p-values cannot reach (``combine`` NOTE).
    Fixed seed; false-failure ≈ 1 %."""
    p = _h0_pvalues(600, np.random.default_rng(12))[:, 0]
    for a in (0.02, 0.1, 0.2):
        sigma = np.sqrt(a * (1 - a) / 600)
        assert abs((p <= a + 1e-12).mean() - a) <= 3 * sigma, (a, (p <= a).mean())


def _sticky(n: int, T: int, V: int, stay: float, rng: np.random.Generator) -> np.ndarray:
    """Uniform start, then keep the previous token with probability ``stay`` else uniform:
    every position's marginal is uniform whatever ``stay`` (only the joint law moves)."""
    tok = np.empty((n, T), dtype=np.int64)
    tok[:, 0] = rng.integers(0, V, n)
    for t in range(1, T):
        keep = rng.random(n) < stay
        tok[:, t] = np.where(keep, tok[:, t - 1], rng.integers(0, V, n))
    return tok


def test_transitions_see_what_marginals_cannot():
    """Reference iid uniform (stay 0), candidate sticky (stay 0.1): equal marginals at every
    position. 300 sequences per arm, 8 positions, V = 5: the transition statistic's excess is
    ~0.1·0.8·2100 ≈ 170 pairs, z ≈ 10: rejected (fixed seed; false-failure ≪ 1e-3)."""
    rng = np.random.default_rng(5)
    tok = np.vstack([_sticky(300, 8, 5, 0.0, rng), _sticky(300, 8, 5, 0.1, rng)])
    labels = tables.label_matrix(300, 300, 99, rng)
    res = sequence.combine([sequence.cell_statistics(tok, labels)])
    j = sequence.STATISTICS.index("transition")
    assert res.stat_pvalue[j] == pytest.approx(0.01) and res.pvalue <= 0.02


def test_analyze_pools_a_small_bias_spread_over_every_cell_position():
    """4 cells × 8 positions, 256 sequences per arm, Zipf(1.2) over 30 tokens; the candidate
    mixes in 8 % of a fixed other law at every position (TV ≈ 0.05 each, far below the per-cell
    MDE ≈ 0.2). The sequence family rejects (z-sums ≈ 6 here; fixed seed, false-failure
    < 1 %); it reports a resolution below the per-cell one."""
    rng = np.random.default_rng(21)
    p = zipf(30, 1.2)
    o = p[::-1].copy()
    bias = 0.92 * p + 0.08 * o
    arms = {}
    for prompt in ("a", "b"):
        for config in ("x", "y"):
            arms[(prompt, config, "reference")] = rng.choice(30, size=(256, 8), p=p)
            arms[(prompt, config, "candidate")] = rng.choice(30, size=(256, 8), p=bias)
    a = analyze(
        samples_frame(arms),
        reference="reference",
        candidate="candidate",
        options=AnalysisOptions(null_permutations=199, trie_depth=0),
    )
    seq = a.families["sequence"]
    assert seq.rejected and a.rejected
    assert seq.alpha == pytest.approx(0.025) and seq.pvalue <= 0.025
    pooled = seq.table[seq.table["scope"] == "pooled"].set_index("test")
    assert list(pooled.index) == list(sequence.DEFAULT)
    assert pooled.loc["transition", "mde"] == pytest.approx(seq.resolution)
    assert seq.resolution < a.mde_tv and "pair" in seq.resolution_unit
    off = analyze(
        samples_frame(arms),
        reference="reference",
        candidate="candidate",
        options=AnalysisOptions(null_permutations=199, trie_depth=0, sequence=False),
    )
    assert off.families["sequence"].alpha == 0.0 and len(off.table("sequence")) == 0
    assert off.families["cells"].alpha == 0.05


def test_sequence_family_needs_permutations():
    rng = np.random.default_rng(1)
    arms = {("a", "x", r): rng.integers(0, 5, size=(50, 3)) for r in ("reference", "candidate")}
    a = analyze(
        samples_frame(arms),
        reference="reference",
        candidate="candidate",
        options=AnalysisOptions(null_permutations=0, trie_depth=0),
    )
    assert a.families["sequence"].alpha == 0.0 and not a.families["sequence"].rejected
    assert any("sequence family off" in n for n in a.notes)
