"""Sequence-level statistics of one cell under many labelings (``cell_statistics``, the
``STATISTICS``), combined over cells by single-step max-T (``combine`` → ``SequenceResult``).
Knows no DataFrames, arm names or other families. Why exact whatever the dependence between
positions: docs/families.md ("Why the sequence family is exact").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import stats

from spectest.stats.homogeneity import chi2_statistics, pool_table
from spectest.stats.tables import (
    StrataTable,
    build_table,
    ref_counts,
    stratum_arm_sizes,
)

STATISTICS = ("position_chi2", "unigram", "transition", "hamming_mmd", "prefix_mmd")
# NOTE the default set: why these three, docs/statistics.md ("The sequence family's choices")
DEFAULT = ("transition", "hamming_mmd", "prefix_mmd")
TV_STATISTICS = ("position_chi2", "unigram", "transition")  # resolution stated as a TV
# the effect size each statistic's resolution is stated in (see ``resolution``)
UNITS = {
    "position_chi2": "TV per position (every cell-position shifted alike)",
    "unigram": "TV of the position-pooled token law",
    "transition": "TV of the position-pooled consecutive-pair law",
    "hamming_mmd": "RMS over positions of the L2 distance between per-position laws",
    "prefix_mmd": "RMS over positions of the L2 distance between prefix laws",
}
_BLOCK = 256  # label columns per block: memory O(K·block)


# ----------------------------------------------------------------------------- tables
def prefix_ids(tokens: np.ndarray) -> np.ndarray:
    """Id of the prefix x_0..x_t of every sequence at every position: [n, T] int64.

    Ids are dense per position (equal ids ⇔ equal prefixes), -1 from the first missing token on.
    """
    assert tokens.ndim == 2
    n, T = tokens.shape
    out = np.full((n, T), -1, dtype=np.int64)  # [n, T]
    prev = np.zeros(n, dtype=np.int64)  # the empty prefix
    n_tok = int(max(tokens.max(initial=0), 0)) + 1
    for t in range(T):
        alive = (prev >= 0) & (tokens[:, t] >= 0)
        if not alive.any():
            break
        key = prev[alive] * n_tok + tokens[alive, t].astype(np.int64)
        ids, _ = pd.factorize(key)
        out[alive, t] = ids
        prev = out[:, t]
    return out


def _strata_table(values: np.ndarray, merge: bool) -> StrataTable:
    """Position-stratified table of ``values`` [n, T'] (-1 = absent): stratum = column."""
    seq, pos = np.nonzero(values >= 0)  # row-major: sorted by sequence
    return build_table(pos, values[seq, pos], seq, n_seq=values.shape[0], merge_singletons=merge)


def pair_codes(tokens: np.ndarray) -> np.ndarray:
    """Code of each consecutive pair (x_t, x_{t+1}): [n, T-1] int64, -1 if either is absent."""
    a = tokens[:, :-1].astype(np.int64)
    b = tokens[:, 1:].astype(np.int64)
    v = int(max(tokens.max(initial=0), 0)) + 1
    return np.where((a >= 0) & (b >= 0), a * v + b, -1)


def _by_token(table: StrataTable) -> tuple[sp.csr_matrix, np.ndarray]:
    """Aggregation [U, K] of a position-stratified table's key rows into position-pooled bins.

    Rows of the same token share a bin; every merged-singleton row (tokens seen once at their
    position) goes into one extra bin. The grouping depends on combined counts only, so it is
    label-invariant. Returns (matrix, combined count per bin [U]).
    """
    single = table.is_singleton_row
    codes, uniq = pd.factorize(table.key_token[~single])
    bin_of = np.empty(table.n_keys, dtype=np.int64)
    bin_of[~single] = codes
    n_bins = len(uniq) + int(single.any())
    bin_of[single] = len(uniq)
    agg = sp.csr_matrix(
        (np.ones(table.n_keys), (bin_of, np.arange(table.n_keys))), shape=(n_bins, table.n_keys)
    )
    totals = np.bincount(bin_of, weights=table.key_total, minlength=n_bins)
    return agg, totals


# ----------------------------------------------------------------------------- statistics
def pooled_chi2_columns(
    a: np.ndarray, totals: np.ndarray, w: float, min_expected: float
) -> np.ndarray:
    """Pearson χ² of a 2 × U table under every labeling: [L] float64.

    ``a``: [U, L] reference counts per bin, ``totals``: [U] combined counts, ``w``: the
    smaller arm's share of *sequences*. Bins with w·total < ``min_expected`` are pooled into one
    bin, dropped when that bin is itself below the threshold (a label-invariant choice: the
    permutation calibration stays exact). The entries are not independent (a sequence gives
    several), so the χ² reference law does not apply: only permutation p-values are used.
    """
    totals = np.asarray(totals, dtype=np.float64)
    keep = totals * w >= min_expected
    other = ~keep & (totals > 0)
    rows = [a[keep]]
    tot = [totals[keep]]
    if other.any() and totals[other].sum() * w >= min_expected:
        rows.append(a[other].sum(axis=0, keepdims=True))
        tot.append(totals[other].sum(keepdims=True))
    A = np.concatenate(rows, axis=0).astype(np.float64)  # [U', L]
    c = np.concatenate(tot)[:, None]  # [U', 1]
    if A.shape[0] < 2:
        return np.zeros(a.shape[1])
    n = c.sum()
    na = A.sum(axis=0)  # [L] reference entries under each labeling
    nb = n - na
    with np.errstate(invalid="ignore", divide="ignore"):
        x2 = (n * n / (na * nb)) * (((A - c * (na / n)) ** 2) / c).sum(axis=0)
    return np.where((na > 0) & (nb > 0), x2, 0.0)


def mmd_columns(table: StrataTable, ref: np.ndarray, n_ref: int, n_cand: int) -> np.ndarray:
    """Unbiased MMD² with the kernel Σ_strata 1[value equal], divided by the number of strata
    (positions), under every labeling: [L] float64.

    ``ref``: [K, L] reference counts of ``table`` (one entry per sequence and stratum);
    ``n_ref``, ``n_cand``: the arms' sequence counts (fixed under relabeling).

    Notes
    -----
    Per stratum with reference counts a_v and candidate counts b_v: Σ_{i≠j∈ref} k = Σ a_v² − A
    (A = Σ a_v: a sequence matches itself once per stratum where it has a value), so
    MMD²_u = (Σa² − A)/(n_a(n_a−1)) + (Σb² − B)/(n_b(n_b−1)) − 2 Σab/(n_a n_b). A merged
    singleton row holds tokens seen once: their a_v ∈ {0, 1}, so Σa_v² over them is the row's
    count and Σa_v·b_v over them is 0. Tested equal to the explicit Gram-matrix MMD.
    """
    if table.n_keys == 0 or n_ref < 2 or n_cand < 2:
        return np.zeros(ref.shape[1])
    single = table.is_singleton_row
    keep = np.flatnonzero(~single)
    a = ref[keep].astype(np.float64)  # [K', L]
    c = table.key_total[keep].astype(np.float64)  # [K']
    # NOTE: with b = c − a, Σb² = Σc² − 2Σca + Σa² and Σab = Σca − Σa²: two reductions of a
    # instead of three full-size temporaries.
    sa2 = np.einsum("kl,kl->l", a, a)  # [L]
    sca = c @ a  # [L]
    s_a = a.sum(axis=0)  # [L]
    a1 = ref[single].sum(axis=0, dtype=np.float64)  # [L] reference tokens among singletons
    c1 = float(table.key_total[single].sum())
    aa = sa2 + a1  # Σ a_v² (a singleton's a_v² = a_v)
    bb = float(c @ c) - 2.0 * sca + sa2 + (c1 - a1)
    ab = sca - sa2
    A = s_a + a1  # reference entries
    B = float(c.sum()) + c1 - A
    mmd = (aa - A) / (n_ref * (n_ref - 1.0)) + (bb - B) / (n_cand * (n_cand - 1.0))
    mmd -= 2.0 * ab / (n_ref * n_cand)
    return mmd / max(table.n_strata, 1)


def cell_statistics(
    tokens: np.ndarray, labels: np.ndarray, *, min_expected: float = 5.0, block: int = _BLOCK
) -> np.ndarray:
    """The ``STATISTICS`` of one cell under every labeling: [J, 1+B] float64.

    ``tokens``: [n, T] int token matrix (-1 = absent); ``labels``: [n, 1+B] reference
    indicators, column 0 the observed labeling (``tables.label_matrix``).

    Notes
    -----
    Cost: three sparse products (position, pair and prefix tables) of O(n·T·(1+B)) each, done
    ``block`` label columns at a time. Pooling decisions use the observed arm sizes and the
    combined counts (label-invariant: module docstring).
    """
    assert tokens.ndim == 2 and labels.ndim == 2 and labels.shape[0] == tokens.shape[0]
    n, T = tokens.shape
    L = labels.shape[1]
    n_ref = int(labels[:, 0].sum())
    n_cand = n - n_ref
    out = np.zeros((len(STATISTICS), L))
    if n_ref == 0 or n_cand == 0 or T == 0:
        return out
    merge = min_expected > 0.5
    w = min(n_ref, n_cand) / n
    pos = _strata_table(tokens, merge)
    ref0 = ref_counts(pos, labels[:, :1])
    nr0, nc0 = stratum_arm_sizes(pos, ref0)
    bins = pool_table(pos, nr0[:, 0], nc0[:, 0], min_expected)
    uni_agg, uni_tot = _by_token(pos)
    pairs = _strata_table(pair_codes(tokens), merge)  # empty when T < 2
    pair_agg, pair_tot = _by_token(pairs)
    prefix = _strata_table(prefix_ids(tokens), merge)
    for lo in range(0, L, block):
        lab = labels[:, lo : lo + block]
        cols = slice(lo, lo + lab.shape[1])
        ref = ref_counts(pos, lab)  # [K, l]
        nr, nc = stratum_arm_sizes(pos, ref)
        chi = chi2_statistics(pos, bins, ref, nr, nc)  # [S, l]
        out[0, cols] = np.where(bins.testable[:, None], chi, 0.0).sum(axis=0)
        out[1, cols] = pooled_chi2_columns(uni_agg @ ref, uni_tot, w, min_expected)
        if pairs.n_keys:
            out[2, cols] = pooled_chi2_columns(
                pair_agg @ ref_counts(pairs, lab), pair_tot, w, min_expected
            )
        out[3, cols] = mmd_columns(pos, ref, n_ref, n_cand)
        out[4, cols] = mmd_columns(prefix, ref_counts(prefix, lab), n_ref, n_cand)
    return out


# ----------------------------------------------------------------------------- combination
@dataclass(frozen=True)
class SequenceResult:
    """The sequence family over all cells: one decision from the max-T of its J statistics."""

    statistic: float  # observed max over statistics of the standardized Σ_cells statistic
    pvalue: float  # P_perm(max-T ≥ observed): the family's p-value
    names: tuple[str, ...]  # the J statistics
    z: np.ndarray  # [J] observed Σ_cells standardized statistic
    stat_pvalue: np.ndarray  # [J] each pooled statistic's own permutation p-value
    stat_adjusted: np.ndarray  # [J] single-step max-T adjusted p-values
    cell_pvalue: np.ndarray  # [C, J] per-cell permutation p-values (diagnostic only)
    cell_observed: np.ndarray  # [C, J] observed per-cell statistics (natural units)
    cell_null_mean: np.ndarray  # [C, J]
    cell_null_sd: np.ndarray  # [C, J]
    z_null_sd: np.ndarray  # [J] sd of the Σ_cells statistic over the 1+B columns
    n_permutations: int


def _rank_pvalues(x: np.ndarray) -> np.ndarray:
    """p[..., b] = #{b' : x[..., b'] ≥ x[..., b]} / L along the last axis (L = columns)."""
    L = x.shape[-1]
    srt = np.sort(x, axis=-1)
    flat_s = srt.reshape(-1, L)
    flat_x = x.reshape(-1, L)
    out = np.empty_like(flat_x, dtype=np.float64)
    for i in range(flat_x.shape[0]):
        out[i] = (L - np.searchsorted(flat_s[i], flat_x[i], side="left")) / L
    return out.reshape(x.shape)


def combine(cells: list[np.ndarray], names: tuple[str, ...] = STATISTICS) -> SequenceResult:
    """Pool the cells' statistics ([J, 1+B] each) into the family's decision.

    Notes
    -----
    Each cell's statistic standardized over the 1 + B columns (a constant one contributes 0),
    summed over cells, standardized again; the family's statistic is the largest of the J sums,
    calibrated by its own permutation distribution (single-step max-T, Westfall & Young 1993;
    exact: docs/families.md ("Why the sequence family is exact"); not min-p: docs/statistics.md
    "The sequence family's choices"). p-values have resolution 1/(1 + B).
    """
    if not cells:
        J = len(names)
        nan = np.full(J, np.nan)
        empty = np.zeros((0, J))
        return SequenceResult(
            np.nan, np.nan, names, nan, nan, nan, empty, empty, empty, empty, nan, 0
        )
    v = np.stack(cells)  # [C, J, 1+B]
    C, J, L = v.shape
    assert J == len(names)
    mean = v.mean(axis=2, keepdims=True)
    sd = v.std(axis=2, keepdims=True)
    z = np.divide(v - mean, sd, out=np.zeros_like(v), where=sd > 1e-12 * np.maximum(1, abs(mean)))
    zsum = z.sum(axis=0)  # [J, L]
    p = _rank_pvalues(zsum)  # [J, L]
    zsd = zsum.std(axis=1, keepdims=True)  # [J, 1]
    zs = np.divide(zsum, zsd, out=np.zeros_like(zsum), where=zsd > 0)  # [J, L]
    tmax = zs.max(axis=0)  # [L]
    fam_p = float(np.mean(tmax >= tmax[0])) if L > 1 else float("nan")
    adj = np.array([np.mean(tmax >= zs[j, 0]) for j in range(J)]) if L > 1 else np.full(J, np.nan)
    cell_p = _rank_pvalues(v)[:, :, 0] if L > 1 else np.full((C, J), np.nan)
    return SequenceResult(
        statistic=float(tmax[0]),
        pvalue=fam_p,
        names=names,
        z=zsum[:, 0],
        stat_pvalue=p[:, 0] if L > 1 else np.full(J, np.nan),
        stat_adjusted=adj,
        cell_pvalue=cell_p,
        cell_observed=v[:, :, 0],
        cell_null_mean=mean[:, :, 0],
        cell_null_sd=sd[:, :, 0],
        z_null_sd=zsd[:, 0],
        n_permutations=L - 1,
    )


def resolution(
    result: SequenceResult,
    n_ref: np.ndarray,
    n_cand: np.ndarray,
    n_positions: int,
    alpha: float,
    power: float = 0.8,
) -> np.ndarray:
    """The smallest effect (in ``UNITS``) each statistic detects with ``power``: [J].

    ``n_ref``, ``n_cand``: [C] sequences per arm in each cell; ``alpha``: the family's level,
    split by Bonferroni over the J statistics (a bound on the max-T step's cost).

    Notes
    -----
    An approximation for planning and for the verdict's "resolution", not a guarantee: the
    Σ_cells statistic is taken as normal with the permutation null's sd under the alternative
    too, and every cell's statistic shifted alike by the effect e (derivation:
    docs/statistics.md, "The sequence family's choices"). A TV MDE refers to the binned laws.
    """
    J = len(result.names)
    out = np.full(J, np.nan)
    sd = result.cell_null_sd  # [C, J]
    if sd.shape[0] == 0 or not np.isfinite(result.z_null_sd).any():
        return out
    n_ref = np.asarray(n_ref, dtype=np.float64)
    n_cand = np.asarray(n_cand, dtype=np.float64)
    n_eff = np.divide(2 * n_ref * n_cand, n_ref + n_cand, out=np.zeros(len(n_ref)), where=n_ref > 0)
    need = (stats.norm.isf(alpha / J) + stats.norm.ppf(power)) * result.z_null_sd  # [J]
    T = float(n_positions)
    per_unit = {  # shift of a cell's statistic per unit of e² (lower bound for χ²)
        "position_chi2": 2.0 * n_eff * T,
        "unigram": 2.0 * n_eff * T,
        "transition": 2.0 * n_eff * max(T - 1.0, 0.0),
        "hamming_mmd": np.ones_like(n_eff),
        "prefix_mmd": np.ones_like(n_eff),
    }
    for j, name in enumerate(result.names):
        ok = sd[:, j] > 0
        gain = float(np.sum(per_unit[name][ok] / sd[ok, j]))  # Σ_c shift_c / sd_c per e²
        if gain > 0 and np.isfinite(need[j]):
            out[j] = float(np.sqrt(need[j] / gain))
    return out


# ----------------------------------------------------------------------------- slow references
def cell_statistics_reference(
    ref_tokens: np.ndarray, cand_tokens: np.ndarray, *, min_expected: float = 5.0
) -> np.ndarray:
    """``cell_statistics``' observed column written plainly (dicts, loops, scipy): [J].

    ``ref_tokens`` [n_a, T], ``cand_tokens`` [n_b, T] (-1 = absent). Slow; for tests.
    """
    from spectest.stats.homogeneity import pooled_chi2

    ra, cb = np.asarray(ref_tokens), np.asarray(cand_tokens)
    na, nb = ra.shape[0], cb.shape[0]
    T = ra.shape[1]
    w = min(na, nb) / (na + nb)
    merge = min_expected > 0.5
    out = np.zeros(len(STATISTICS))
    for t in range(T):
        va, vb = ra[:, t][ra[:, t] >= 0], cb[:, t][cb[:, t] >= 0]
        toks = np.union1d(va, vb)
        res = pooled_chi2(
            np.array([np.sum(va == x) for x in toks]),
            np.array([np.sum(vb == x) for x in toks]),
            min_expected=min_expected,
        )
        out[0] += res.statistic if np.isfinite(res.statistic) else 0.0
    out[1] = _chi2_of(*_pooled_bins(ra, cb, merge), w, min_expected)
    if T >= 2:
        out[2] = _chi2_of(*_pooled_bins(pair_codes(ra), pair_codes(cb), merge), w, min_expected)
    out[3] = _mmd(ra, cb)
    pref = _prefix_ids(np.vstack([ra, cb]))
    out[4] = _mmd(pref[:na], pref[na:])
    return out


def _chi2_of(counts_a: Counter, counts_b: Counter, w: float, min_expected: float) -> float:
    """Pearson χ² of two bin counters, bins below ``min_expected`` (at weight ``w``) pooled."""
    keys = sorted(set(counts_a) | set(counts_b), key=str)
    tot = {k: counts_a[k] + counts_b[k] for k in keys}
    kept = [k for k in keys if tot[k] * w >= min_expected]
    other = [k for k in keys if k not in set(kept)]
    rows = [(counts_a[k], counts_b[k]) for k in kept]
    if other and sum(tot[k] for k in other) * w >= min_expected:
        rows.append((sum(counts_a[k] for k in other), sum(counts_b[k] for k in other)))
    t = np.array(rows, dtype=np.float64).T  # [2, U']
    if t.shape[1] < 2 or (t.sum(axis=1) == 0).any():
        return 0.0
    return float(stats.chi2_contingency(t, correction=False).statistic)


def _pooled_bins(
    values_a: np.ndarray, values_b: np.ndarray, merge: bool
) -> tuple[Counter, Counter]:
    """Each arm's bin counts: an occurrence's bin is its value, or "rare" when seen once at its
    position and ``merge``."""
    ca: Counter = Counter()
    cb: Counter = Counter()
    for t in range(values_a.shape[1]):
        col = Counter(v for v in values_a[:, t] if v >= 0) + Counter(
            v for v in values_b[:, t] if v >= 0
        )
        for arr, cnt in ((values_a, ca), (values_b, cb)):
            for v in arr[:, t]:
                if v >= 0:
                    cnt["rare" if merge and col[v] == 1 else int(v)] += 1
    return ca, cb


def _mmd(values_a: np.ndarray, values_b: np.ndarray) -> float:
    """Unbiased MMD² of two [n, T] code matrices under the matching-positions kernel."""
    na, nb, T = values_a.shape[0], values_b.shape[0], values_a.shape[1]

    def k(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # [n, m] Gram
        return ((x[:, None, :] == y[None, :, :]) & (x[:, None, :] >= 0)).sum(axis=2) / T

    kaa, kbb, kab = k(values_a, values_a), k(values_b, values_b), k(values_a, values_b)
    return float(
        (kaa.sum() - np.trace(kaa)) / (na * (na - 1))
        + (kbb.sum() - np.trace(kbb)) / (nb * (nb - 1))
        - 2 * kab.mean()
    )


def _prefix_ids(both: np.ndarray) -> np.ndarray:
    """Each sequence's prefix at every position as an id (equal ids ⇔ equal prefixes; −1 past
    its end)."""
    pref = np.full(both.shape, -1, dtype=np.int64)
    ids: dict[tuple[int, ...], int] = {}
    for i in range(both.shape[0]):
        for t in range(both.shape[1]):
            if both[i, t] < 0:
                break
            pref[i, t] = ids.setdefault(tuple(both[i, : t + 1].tolist()), len(ids))
    return pref
