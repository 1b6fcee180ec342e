"""Many two-arm token tables in one sparse key-row form (``StrataTable``: one row per (stratum,
token), a 0/1 indicator [rows, sequences]), the labelings (``label_matrix``) and the reference
counts under every labeling (``ref_counts``): every statistic of ``homogeneity``, ``distance``
and ``trie`` reads (table, counts), so a value and its permutation null share one path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

SINGLETONS = -1  # key_token of the merged row holding every token seen once in its stratum


@dataclass(frozen=True)
class StrataTable:
    """Two-arm token tables of many strata, one key row per distinct (stratum, token).

    Every stratum has at least one key row, and key rows are sorted by stratum, so per-stratum
    sums are ``np.add.reduceat`` over ``stratum_start``.
    """

    strata: np.ndarray  # [S] int64: the caller's stratum label of each stratum, ascending
    stratum_start: np.ndarray  # [S+1] int64 key-row offsets
    key_stratum: np.ndarray  # [K] int64 local stratum index 0..S-1 (non-decreasing)
    key_token: np.ndarray  # [K] int64 token id, SINGLETONS for the merged row
    key_total: np.ndarray  # [K] int64 combined count of the row (both arms)
    indicator: sp.csc_matrix  # [K, n_seq] 0/1: entry of sequence j in this row

    @property
    def n_strata(self) -> int:
        return int(self.strata.shape[0])

    @property
    def n_keys(self) -> int:
        return int(self.key_token.shape[0])

    @property
    def n_seq(self) -> int:
        return int(self.indicator.shape[1])

    @property
    def is_singleton_row(self) -> np.ndarray:  # [K] bool
        return self.key_token == SINGLETONS

    @property
    def stratum_total(self) -> np.ndarray:  # [S] int64 entries per stratum (both arms)
        return segment_sum(self.key_total, self.stratum_start)


def segment_sum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sum ``x`` [K, ...] over the consecutive, non-empty segments ``starts`` [S+1] → [S, ...].

    The result keeps ``x``'s dtype; callers summing counts rely on a segment's sum fitting it.
    """
    assert starts.ndim == 1 and starts[0] == 0 and starts[-1] == x.shape[0]
    n_seg = starts.shape[0] - 1
    if n_seg == 0:
        return np.zeros((0, *x.shape[1:]), dtype=x.dtype)
    # NOTE: reduceat returns x[i] (not 0) for an empty segment; build_table guarantees none.
    assert np.all(np.diff(starts) > 0), "empty segment"
    if x.ndim == 2 and x.shape[1] > 8 and x.size > 100_000:
        # NOTE: np.add.reduceat along axis 0 of a wide C-order array is ~7x slower than a
        # sparse [S, K] 0/1 matrix product (measured at K = 2e4, L = 201); for small arrays
        # the sparse matrix's construction overhead dominates instead.
        seg = sp.csr_matrix(
            (np.ones(x.shape[0], dtype=x.dtype), np.arange(x.shape[0]), starts),
            shape=(n_seg, x.shape[0]),
        )
        return np.asarray(seg @ x)
    return np.add.reduceat(x, starts[:-1], axis=0)


def _empty_table(n_seq: int) -> StrataTable:
    """The table of no entries over ``n_seq`` sequences."""
    return StrataTable(
        strata=np.zeros(0, np.int64),
        stratum_start=np.zeros(1, np.int64),
        key_stratum=np.zeros(0, np.int64),
        key_token=np.zeros(0, np.int64),
        key_total=np.zeros(0, np.int64),
        indicator=sp.csc_matrix((0, n_seq), dtype=_count_dtype(n_seq)),
    )


def _local_strata(stratum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct labels [S] of ``stratum`` [m] and each entry's index into them [m]."""
    m = stratum.shape[0]
    hi = int(stratum.max())
    if hi < 4 * m + (1 << 20):
        # NOTE: small non-negative labels: a presence table beats sorting the m entries.
        present = np.zeros(hi + 1, dtype=bool)
        present[stratum] = True
        strata = np.flatnonzero(present)  # [S]
        stratum_local = (np.cumsum(present, dtype=np.int64) - 1)[stratum]  # [m]
        return strata, stratum_local
    strata, stratum_local = np.unique(stratum, return_inverse=True)
    return strata, stratum_local


def _merge_singletons(
    codes: np.ndarray,
    total: np.ndarray,
    key_stratum: np.ndarray,
    key_token: np.ndarray,
    n_tok: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Key rows [K0] with each stratum's count-1 tokens merged into one ``SINGLETONS`` row [K]:
    the entries' new row codes [m], and the rows' totals, strata and tokens."""
    single = total == 1  # [K0]
    # New rows: per stratum one SINGLETONS row (if any singleton) first, then the rest.
    # Sort key (stratum, token) with SINGLETONS = -1 sorts first within its stratum.
    new_tok = np.where(single, SINGLETONS, key_token)
    new_key = key_stratum * (n_tok + 1) + (new_tok + 1)
    new_codes, new_uniq = pd.factorize(new_key, sort=True)  # [K0], [K]
    codes = new_codes.astype(np.int64)[codes]
    total = np.bincount(codes, minlength=len(new_uniq)).astype(np.int64)
    return codes, total, new_uniq // (n_tok + 1), new_uniq % (n_tok + 1) - 1


def _key_rows(
    stratum_local: np.ndarray, token: np.ndarray, n_strata: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each entry's key row, each row's total, stratum and token code (rows sorted by
    (stratum, token)), and the token ids of the codes.

    Notes
    -----
    Keys are built on dense token codes (0..distinct−1 in id order), not on the ids, so a
    stratum × (max id + 1) key cannot overflow int64 whatever the ids.
    """
    token_code, token_ids = pd.factorize(token, sort=True)  # [m], [distinct]
    n_tok = len(token_ids)
    if n_strata * (n_tok + 1) >= 2**62:
        raise OverflowError("stratum x token key does not fit int64")
    key = stratum_local * n_tok + token_code.astype(np.int64)
    codes, uniq = pd.factorize(key, sort=True)  # [m], [K0]
    codes = codes.astype(np.int64)
    total = np.bincount(codes, minlength=len(uniq)).astype(np.int64)  # [K0]
    return codes, total, uniq // n_tok, uniq % n_tok, np.asarray(token_ids)


def build_table(
    stratum: np.ndarray,
    token: np.ndarray,
    seq: np.ndarray,
    *,
    n_seq: int,
    merge_singletons: bool = True,
) -> StrataTable:
    """Key-row tables from entries (one per sequence and stratum).

    Parameters
    ----------
    stratum, token, seq : int arrays [m]
        Stratum label (any non-negative int64), token id (>= 0) and sequence index
        (0..n_seq-1) of each entry, sorted by ``seq`` (non-decreasing). A sequence has at most
        one entry per stratum.
    n_seq : int
        Number of sequences (columns of the indicator).
    merge_singletons : bool
        Merge the tokens seen once in their stratum into one ``SINGLETONS`` row.

    Notes
    -----
    Merging singletons leaves every statistic here unchanged under every labeling; callers must
    not merge when their pooling rule could keep a count-1 token (``min_expected <= 0.5``; why:
    docs/statistics.md).
    """
    stratum = np.asarray(stratum, dtype=np.int64)  # [m]
    token = np.asarray(token, dtype=np.int64)  # [m]
    seq = np.asarray(seq, dtype=np.int64)  # [m]
    assert stratum.shape == token.shape == seq.shape and stratum.ndim == 1
    m = stratum.shape[0]
    if m == 0:
        return _empty_table(n_seq)
    assert token.min() >= 0 and stratum.min() >= 0 and seq.min() >= 0 and seq.max() < n_seq
    assert np.all(np.diff(seq) >= 0), "entries must be sorted by sequence"
    strata, stratum_local = _local_strata(stratum)
    codes, total, key_stratum, key_token, token_ids = _key_rows(stratum_local, token, len(strata))
    n_tok = len(token_ids)
    if merge_singletons:
        codes, total, key_stratum, key_token = _merge_singletons(
            codes, total, key_stratum, key_token, n_tok
        )
    key_token = np.where(key_token == SINGLETONS, SINGLETONS, np.asarray(token_ids)[key_token])
    n_keys = int(key_token.shape[0])
    stratum_start = np.searchsorted(key_stratum, np.arange(len(strata) + 1)).astype(np.int64)
    dtype = _count_dtype(n_seq)
    # NOTE: entries arrive sorted by sequence, so the CSC form (one column per sequence) needs
    # no sort at all: column pointers are the cumulative entry counts per sequence.
    indptr = np.concatenate([[0], np.cumsum(np.bincount(seq, minlength=n_seq))]).astype(np.int64)
    indicator = sp.csc_matrix((np.ones(m, dtype=dtype), codes, indptr), shape=(n_keys, n_seq))
    return StrataTable(
        strata=strata.astype(np.int64),
        stratum_start=stratum_start,
        key_stratum=key_stratum.astype(np.int64),
        key_token=key_token.astype(np.int64),
        key_total=total,
        indicator=indicator,
    )


def label_matrix(
    n_ref: int, n_cand: int, n_permutations: int, rng: np.random.Generator
) -> np.ndarray:
    """Reference-arm indicators [n_ref + n_cand, 1 + B]: column 0 is the observed labeling
    (the first ``n_ref`` sequences are the reference arm), columns 1..B uniform random
    relabelings that keep the arm sizes (whole sequences move between arms). One matrix serves
    every cell with the same arm sizes: docs/statistics.md
    "One relabeling matrix shared by cells"."""
    assert n_ref >= 0 and n_cand >= 0 and n_permutations >= 0
    n = n_ref + n_cand
    dtype = _count_dtype(n)
    observed = np.zeros(n, dtype=dtype)
    observed[:n_ref] = 1
    out = np.empty((n, 1 + n_permutations), dtype=dtype)  # [n, 1+B]
    out[:, 0] = observed
    if n_permutations:
        perms = rng.permuted(np.broadcast_to(observed, (n_permutations, n)), axis=1)  # [B, n]
        out[:, 1:] = perms.T
    return out


def ref_counts(table: StrataTable, labels: np.ndarray) -> np.ndarray:
    """Reference-arm count of every key row under every labeling: [K, L] = indicator @ labels."""
    assert labels.ndim == 2 and labels.shape[0] == table.n_seq, (labels.shape, table.n_seq)
    ind = table.indicator
    if ind.dtype != labels.dtype:
        ind = ind.astype(labels.dtype)
    # NOTE: uint16 (not float) halves the memory traffic of the gather in the sparse product,
    # which dominates analyze(); counts cannot overflow because a key row's count is at most
    # the number of sequences (the dtype is chosen from it by _count_dtype).
    return np.asarray(ind @ labels)


def stratum_arm_sizes(table: StrataTable, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-stratum arm sizes (n_ref [S, L], n_cand [S, L]) under each labeling of ``ref``.

    A sequence has at most one entry per stratum, so a stratum's sum fits ``ref``'s dtype.
    """
    n_ref = segment_sum(ref, table.stratum_start).astype(np.int64)  # [S, L]
    n_cand = table.stratum_total[:, None] - n_ref
    return n_ref, n_cand


def per_key(values: np.ndarray, table: StrataTable) -> np.ndarray:
    """Broadcast per-stratum ``values`` [S, L] to key rows: [K, 1] when every column is equal
    (fixed arm sizes, the usual case: cheap broadcasting), else [K, L]."""
    if values.shape[1] <= 1 or bool((values == values[:, :1]).all()):
        return values[table.key_stratum, :1]
    return values[table.key_stratum]


def _count_dtype(n: int) -> type[np.unsignedinteger]:
    return np.uint16 if n <= np.iinfo(np.uint16).max else np.uint32
