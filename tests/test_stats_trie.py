"""Prefix-trie tests: node χ², chain-rule G², permutation calibration (spectest.stats.trie)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from test_stats_sim import markov, sample_plain, samples_frame

from spectest.stats import AnalysisOptions, analyze, tables, trie
from spectest.stats.histograms import prefix_nodes


def _tokens(rng, n=400, length=4, vocab=5):
    m = markov(vocab, rng, s=0.8)
    return sample_plain(m, n, length, rng)


def test_prefix_nodes_are_dense_sorted_and_shared_by_equal_prefixes():
    tok = np.array([[1, 2, 3], [1, 2, 4], [1, 3, 3], [0, 2, -1], [5, -1, -1]])
    nodes = prefix_nodes(tok, np.array([0, 0, 0, 1, 1]), 2)
    np.testing.assert_array_equal(nodes[:, 0], [0, 0, 0, 1, 1])  # roots = cells
    assert nodes[0, 2] == nodes[1, 2] != nodes[2, 2]  # (1, 2) shared, (1, 3) not
    assert nodes[4, 2] == -1 and nodes[4, 1] >= 0  # sequence of length 1 has no depth-2 node
    assert nodes[0, 1] < nodes[3, 1]  # ordered by cell, then prefix


@pytest.mark.parametrize("merge", [False, True])
def test_chain_rule_full_table_g2_equals_the_sum_of_node_g2(merge):
    """G² of the 2 × (distinct 3-token prefixes) table = Σ of node G² over depths 0..2
    (chain rule of the empirical mutual information), for several labelings."""
    rng = np.random.default_rng(0)
    tok = _tokens(rng)
    tt = trie.build_trie_table(tok, 2, merge_singletons=merge)
    lab = tables.label_matrix(170, 230, 4, rng)
    ref = tables.ref_counts(tt.table, lab)
    n_ref, n_cand = tables.stratum_arm_sizes(tt.table, ref)
    per_node = trie.g2_statistics(tt.table, ref, n_ref, n_cand)  # [S, 5]
    full_key = tok[:, 0] * 100 + tok[:, 1] * 10 + tok[:, 2]
    for b in range(5):
        is_ref = lab[:, b].astype(bool)
        keys = np.unique(full_key)
        a = np.array([np.sum(full_key[is_ref] == k) for k in keys])
        c = np.array([np.sum(full_key[~is_ref] == k) for k in keys])
        assert per_node[:, b].sum() == pytest.approx(trie.g2_table(a, c), rel=1e-9)


def test_node_g2_equals_scipy_per_node():
    rng = np.random.default_rng(1)
    tok = _tokens(rng, n=300, length=3)
    tt = trie.build_trie_table(tok, 1, merge_singletons=True)
    lab = tables.label_matrix(140, 160, 0, rng)
    ref = tables.ref_counts(tt.table, lab)
    n_ref, n_cand = tables.stratum_arm_sizes(tt.table, ref)
    g = trie.g2_statistics(tt.table, ref, n_ref, n_cand)[:, 0]
    is_ref = lab[:, 0].astype(bool)
    for s in range(tt.table.n_strata):
        d, rep = int(tt.node_depth[s]), int(tt.node_rep[s])
        through = np.all(tok[:, :d] == tok[rep, :d], axis=1)
        a = np.bincount(tok[through & is_ref, d], minlength=5)
        c = np.bincount(tok[through & ~is_ref, d], minlength=5)
        assert g[s] == pytest.approx(trie.g2_table(a, c), rel=1e-9, abs=1e-9)


def test_node_chi2_keeps_only_nodes_with_min_count_per_arm():
    """Seed 002's "t2 stratified by t1, strata ≥ 200": depth-1 nodes, ≥ 200 sequences per arm."""
    rng = np.random.default_rng(2)
    tok = _tokens(rng, n=2000, length=2)
    tt = trie.build_trie_table(tok, 1)
    ref = tables.ref_counts(tt.table, tables.label_matrix(1000, 1000, 0, rng))
    nodes = trie.node_chi2(tt, ref, min_count=200)
    assert len(nodes.node) >= 1
    assert (np.minimum(nodes.n_ref, nodes.n_cand) >= 200).all()
    assert (tt.node_depth[nodes.node] == 1).all()
    n_ref, n_cand = tables.stratum_arm_sizes(tt.table, ref)
    big = (tt.node_depth == 1) & (np.minimum(n_ref[:, 0], n_cand[:, 0]) >= 200)
    assert set(nodes.node.tolist()) == set(np.flatnonzero(big).tolist())


def test_equal_marginals_different_joints_found_by_the_trie_only():
    """docs/statistics.md's toy: V = 5, T = 2, uniform marginals in both arms; reference x0, x1
    independent, candidate x1 = x0 (joint TV 0.8). The trie (depth 1) rejects; the
    per-position marginals have the same law, so their χ² p-values are uniform. Fixed seed;
    the trie's false-failure (miss) rate is < 1e-6 at N = 1000."""
    rng = np.random.default_rng(3)
    ref = rng.integers(0, 5, size=(1000, 2))
    x0 = rng.integers(0, 5, size=1000)
    cand = np.stack([x0, x0], axis=1)
    df = samples_frame({("p", "c", "reference"): ref, ("p", "c", "candidate"): cand})
    a = analyze(
        df,
        reference="reference",
        candidate="candidate",
        options=AnalysisOptions(trie_depth=1, trie_min_count=50, null_permutations=99),
    )
    assert a.families["trie"].rejected and a.rejected
    chain = a.table("trie")[a.table("trie")["kind"] == "chain"]
    assert chain["pvalue"].iloc[0] == pytest.approx(1 / 100)
    nodes = a.table("trie")[a.table("trie")["kind"] == "node"]
    assert len(nodes) == 5 and nodes["reject"].all()


def test_chain_g2_and_node_chi2_are_calibrated_on_a_markov_model():
    """H0: both arms plain decode of one Markov model (V = 6, T = 3, 150 sequences per arm).
    300 replications, B = 99: the chain G² permutation p-value rejects at α = 0.05 with rate
    within 3σ of α (exact test up to ties: σ = 0.0126); the node χ² (depth 1–2, ≥ 20 per arm)
    over all node tests within 3σ as if independent (nodes at one depth are disjoint).
    Fixed seed; false-failure rate ≈ 0.3 % per check."""
    rng = np.random.default_rng(4)
    m = markov(6, rng)
    chain_hits, node_p = 0, []
    labels = tables.label_matrix(150, 150, 99, rng)
    for _ in range(300):
        tok = sample_plain(m, 300, 3, rng)
        tt = trie.build_trie_table(tok, 2)
        res = trie.chain_rule_g2(tt, labels, block=37)  # several blocks
        ref = tables.ref_counts(tt.table, labels)
        assert res.n_permutations == 99 and res.dof > 0
        chain_hits += res.pvalue <= 0.05
        nodes = trie.node_chi2(tt, ref[:, :1], min_count=20)
        node_p.extend(nodes.pvalue[nodes.testable].tolist())
    assert abs(chain_hits / 300 - 0.05) <= 3 * np.sqrt(0.05 * 0.95 / 300), chain_hits
    node_p = np.array(node_p)
    assert node_p.size > 800
    rate = np.mean(node_p <= 0.05)
    assert abs(rate - 0.05) <= 3 * np.sqrt(0.05 * 0.95 / node_p.size), rate
    # and uniform overall: KS of the node p-values (continuous enough at these sizes)
    assert stats.kstest(node_p, "uniform").pvalue > 1e-3
