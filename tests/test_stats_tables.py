"""Key-row tables and sequence relabelings (spectest.stats.tables), against plain pandas counts."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from spectest.stats import tables
from spectest.stats.tables import SINGLETONS


def _entries(rng: np.random.Generator, n_seq: int = 300, n_strata: int = 6, vocab: int = 40):
    """Every sequence has one entry in a random subset of strata; tokens Zipf-like."""
    seq, stratum = np.nonzero(rng.random((n_seq, n_strata)) < 0.8)  # row-major: sorted by seq
    w = 1.0 / np.arange(1, vocab + 1) ** 1.3
    token = rng.choice(vocab, size=seq.size, p=w / w.sum())
    return stratum * 7 + 3, token, seq  # stratum labels need not be dense


@pytest.mark.parametrize("merge", [False, True])
def test_build_table_counts_equal_pandas_groupby(merge):
    rng = np.random.default_rng(0)
    stratum, token, seq = _entries(rng)
    t = tables.build_table(stratum, token, seq, n_seq=300, merge_singletons=merge)
    ref = (
        pd.Series(1, index=pd.MultiIndex.from_arrays([stratum, token])).groupby(level=[0, 1]).sum()
    )
    assert list(t.strata) == sorted(set(stratum.tolist()))
    assert t.stratum_total.sum() == seq.size
    got = {}
    for k in range(t.n_keys):
        got[(int(t.strata[t.key_stratum[k]]), int(t.key_token[k]))] = int(t.key_total[k])
    if not merge:
        assert got == {k: int(v) for k, v in ref.items()}
        assert not t.is_singleton_row.any()
    else:
        want = {k: int(v) for k, v in ref.items() if v > 1}
        singles = ref[ref == 1].groupby(level=0).size()
        for s, c in singles.items():
            want[(int(s), SINGLETONS)] = int(c)
        assert got == want
    # each key row's indicator column sum is its total; each sequence appears once per stratum
    np.testing.assert_array_equal(np.asarray(t.indicator.sum(axis=1)).ravel(), t.key_total)
    assert np.all(np.diff(t.key_stratum) >= 0)


@pytest.mark.parametrize("merge", [False, True])
def test_build_table_with_sparse_huge_ids_is_the_relabelled_table(merge):
    """Keys are built on dense token codes: "tokens" spread up to 2**62 (the sequence family's
    consecutive-pair codes x_t * (max id + 1) + x_{t+1} are that large for a stored id of
    2**31 - 1) give the table of the dense ids, rows in the same order, ids mapped back.
    Before: OverflowError "stratum x token key does not fit int64" (fuzz case byo-02075)."""
    rng = np.random.default_rng(1)
    stratum, token, seq = _entries(rng)
    spread = np.unique(rng.integers(0, 2**62, size=60))[:40]
    assert spread.size == 40
    big = tables.build_table(stratum * 50_000_000, spread[token], seq, n_seq=300,
                             merge_singletons=merge)  # fmt: skip
    small = tables.build_table(stratum, token, seq, n_seq=300, merge_singletons=merge)
    np.testing.assert_array_equal(big.key_stratum, small.key_stratum)
    np.testing.assert_array_equal(big.key_total, small.key_total)
    want = np.where(small.key_token == SINGLETONS, SINGLETONS, spread[small.key_token])
    np.testing.assert_array_equal(big.key_token, want)
    assert (big.indicator != small.indicator).nnz == 0


def test_label_matrix_columns_keep_sizes_and_start_with_the_observed_labels():
    rng = np.random.default_rng(3)
    lab = tables.label_matrix(7, 5, 50, rng)
    assert lab.shape == (12, 51) and lab.dtype == np.uint16
    np.testing.assert_array_equal(lab[:, 0], [1] * 7 + [0] * 5)
    np.testing.assert_array_equal(lab.sum(axis=0), np.full(51, 7))
    assert len({tuple(c) for c in lab.T}) > 40  # not all the same relabeling
    again = tables.label_matrix(7, 5, 50, np.random.default_rng(3))
    np.testing.assert_array_equal(lab, again)  # the passed-in generator decides everything


def test_ref_counts_equal_a_plain_loop_for_every_labeling():
    rng = np.random.default_rng(4)
    stratum, token, seq = _entries(rng, n_seq=60)
    t = tables.build_table(stratum, token, seq, n_seq=60)
    lab = tables.label_matrix(25, 35, 20, rng)
    got = tables.ref_counts(t, lab)  # [K, 21]
    local = np.searchsorted(t.strata, stratum)
    for b in range(lab.shape[1]):
        want = np.zeros(t.n_keys, dtype=np.int64)
        for s, tok, q in zip(local, token, seq, strict=True):
            if lab[q, b]:
                rows = np.flatnonzero((t.key_stratum == s) & (t.key_token == tok))
                if rows.size == 0:  # merged singleton
                    rows = np.flatnonzero((t.key_stratum == s) & (t.key_token == SINGLETONS))
                want[rows[0]] += 1
        np.testing.assert_array_equal(got[:, b], want)
    n_ref, n_cand = tables.stratum_arm_sizes(t, got)
    np.testing.assert_array_equal(
        n_ref + n_cand, np.broadcast_to(t.stratum_total[:, None], n_ref.shape)
    )


def test_segment_sum_paths_agree_and_empty_input():
    rng = np.random.default_rng(5)
    x = rng.random((50, 20))
    starts = np.array([0, 3, 4, 20, 50])
    want = np.stack([x[a:b].sum(axis=0) for a, b in itertools.pairwise(starts)])
    np.testing.assert_allclose(tables.segment_sum(x, starts), want, rtol=1e-12)  # sparse path
    np.testing.assert_allclose(tables.segment_sum(x[:, :3], starts), want[:, :3], rtol=1e-12)
    assert tables.segment_sum(np.zeros((0, 4)), np.array([0])).shape == (0, 4)
    empty = tables.build_table(np.zeros(0), np.zeros(0), np.zeros(0), n_seq=4)
    assert empty.n_strata == 0 and empty.n_keys == 0 and empty.n_seq == 4
