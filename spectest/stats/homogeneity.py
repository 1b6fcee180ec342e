"""Two-sample Pearson χ² with symmetric pooling of rare tokens (``pooled_chi2``, vectorised over
strata and labelings in ``chi2_statistics``), and the one-sample GOF χ² (``gof_chi2``). The
pooling rule depends on combined counts only, so it is relabeling-invariant: docs/statistics.md
("Two-sample χ² on sparse tables"). Knows no counts' origin, multiplicity or DataFrames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy import stats

from spectest.errors import InputError
from spectest.stats.tables import StrataTable, segment_sum

OK = "ok"
UNTESTABLE = "untestable"
SUPPORT_VIOLATION = "support_violation"

# a pooled χ² test's columns in the families' tables (cells, trie, lengths), in this order
CHI2_COLUMNS = ["statistic", "pvalue", "p_adj", "reject", "dof", "n_ref", "n_cand", "n_bins"]


@dataclass(frozen=True)
class HomogeneityResult:
    """Pooled two-sample Pearson χ² of one (reference, candidate) table.

    ``statistic``/``pvalue`` are NaN and ``status`` is "untestable" when fewer than two bins
    remain after pooling or an arm is empty. ``min_expected`` is the smallest expected count
    of any bin in the smaller arm; ``pooled_tokens`` the number of distinct tokens pooled.
    """

    statistic: float
    pvalue: float
    dof: int
    n_ref: int
    n_cand: int
    n_bins: int
    pooled_tokens: int
    min_expected: float
    status: str
    method: str = "asymptotic"


def pool_tokens(
    totals: np.ndarray, n_ref: int, n_cand: int, min_expected: float = 5.0
) -> tuple[np.ndarray, int]:
    """The pooling rule of the module docstring, written plainly for one table.

    Returns (bin index per token [J], -1 for tokens with zero count; number of bins).
    """
    totals = np.asarray(totals, dtype=np.int64)  # [J]
    n = n_ref + n_cand
    w = min(n_ref, n_cand) / n if n > 0 else 0.0
    bins = np.full(totals.shape, -1, dtype=np.int64)
    kept = [j for j in range(len(totals)) if totals[j] > 0 and totals[j] * w >= min_expected]
    other = [j for j in range(len(totals)) if totals[j] > 0 and j not in set(kept)]
    for b, j in enumerate(kept):
        bins[j] = b
    if not other:
        return bins, len(kept)
    other_total = int(totals[other].sum())
    if other_total * w >= min_expected:
        bins[other] = len(kept)
        return bins, len(kept) + 1
    if kept:
        smallest = min(kept, key=lambda j: (totals[j], j))
        bins[other] = bins[smallest]
        return bins, len(kept)
    bins[other] = 0
    return bins, 1


def _two_counts(ref_counts: np.ndarray, cand_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two arms' counts [J] as int64; ``InputError`` unless two 1-D arrays of one shape,
    every count ≥ 0."""
    ref = np.asarray(ref_counts, dtype=np.int64)
    cand = np.asarray(cand_counts, dtype=np.int64)
    if ref.shape != cand.shape or ref.ndim != 1:
        raise InputError(
            "pooled_chi2: counts must be two 1-D arrays of one shape, "
            f"got {ref.shape!r} and {cand.shape!r}"
        )
    if (ref < 0).any() or (cand < 0).any():
        raise InputError("pooled_chi2: counts must be >= 0")
    return ref, cand


def pooled_chi2(
    ref_counts: np.ndarray,
    cand_counts: np.ndarray,
    *,
    min_expected: float = 5.0,
    method: stats.PermutationMethod | stats.MonteCarloMethod | None = None,
) -> HomogeneityResult:
    """Two-sample Pearson χ² on the pooled 2 × bins table (scipy ``chi2_contingency``).

    Parameters
    ----------
    ref_counts, cand_counts : int arrays [J]
        Counts of the same J tokens in the two arms.
    min_expected : float
        Pooling threshold on the smaller arm's expected count (module docstring).
    method : scipy ``PermutationMethod`` / ``MonteCarloMethod``, optional
        Resampling p-value instead of the asymptotic χ²(bins − 1) one, for sparse tables or a
        lowered ``min_expected``. Passed to ``chi2_contingency(..., correction=False,
        method=method)`` (scipy ≥ 1.15).

    Notes
    -----
    The tokens of each arm are iid draws (one per sequence) from that arm's law; H0: the laws
    are equal. The asymptotic p-value needs every bin's smaller expected count ≥
    ``min_expected`` (Cochran's rule; this pooling's type-I rate: docs/statistics.md). No Yates
    correction: it only applies to 2 × 2 tables and makes them conservative.
    """
    ref, cand = _two_counts(ref_counts, cand_counts)
    n_ref, n_cand = int(ref.sum()), int(cand.sum())
    bins, n_bins = pool_tokens(ref + cand, n_ref, n_cand, min_expected)
    used = bins >= 0
    # NOTE: integer tables: scipy's permutation path untabulates them into observations.
    ref_b = np.bincount(bins[used], weights=ref[used], minlength=n_bins).astype(np.int64)
    cand_b = np.bincount(bins[used], weights=cand[used], minlength=n_bins).astype(np.int64)
    n = n_ref + n_cand
    w = min(n_ref, n_cand) / n if n else 0.0
    min_exp = float(((ref_b + cand_b) * w).min()) if n_bins else 0.0
    totals = ref + cand
    pooled = int(used.sum()) - int(((totals > 0) & (totals * w >= min_expected)).sum())
    name = "asymptotic" if method is None else type(method).__name__
    if n_bins < 2 or n_ref == 0 or n_cand == 0:
        return HomogeneityResult(
            np.nan, np.nan, 0, n_ref, n_cand, n_bins, pooled, min_exp, UNTESTABLE, name
        )
    res = stats.chi2_contingency(np.vstack([ref_b, cand_b]), correction=False, method=method)
    return HomogeneityResult(
        float(res.statistic),
        float(res.pvalue),
        n_bins - 1,
        n_ref,
        n_cand,
        n_bins,
        pooled,
        min_exp,
        OK,
        name,
    )


@dataclass(frozen=True)
class PooledBins:
    """The pooling of every stratum of a ``StrataTable`` (bins sorted by stratum)."""

    key_bin: np.ndarray  # [K] int64 bin of each key row
    bin_start: np.ndarray  # [S+1] int64 bin offsets per stratum
    bin_total: np.ndarray  # [NB] int64 combined count per bin
    n_bins: np.ndarray  # [S] int64
    pooled_tokens: np.ndarray  # [S] int64 distinct tokens not kept as their own bin
    min_expected: np.ndarray  # [S] float64 smallest expected count of a bin in the smaller arm
    testable: np.ndarray  # [S] bool: >= 2 bins and both arms non-empty


def pool_table(
    table: StrataTable, n_ref: np.ndarray, n_cand: np.ndarray, min_expected: float = 5.0
) -> PooledBins:
    """``pool_tokens`` applied to every stratum at once (vectorised; tested equal).

    ``n_ref``, ``n_cand``: [S] observed arm sizes per stratum. Tables built with merged
    singletons need ``min_expected > 0.5`` (a merged row is never kept on its own).
    """
    n_ref = np.asarray(n_ref, dtype=np.int64)  # [S]
    n_cand = np.asarray(n_cand, dtype=np.int64)  # [S]
    S, K = table.n_strata, table.n_keys
    assert n_ref.shape == n_cand.shape == (S,)
    starts, ks = table.stratum_start, table.key_stratum
    n = n_ref + n_cand
    w = np.divide(np.minimum(n_ref, n_cand), n, out=np.zeros(S), where=n > 0)  # [S]
    single = table.is_singleton_row
    assert not (single.any() and min_expected <= 0.5), "merged singletons need min_expected > 0.5"
    kept = (table.key_total * w[ks] >= min_expected) & ~single  # [K]
    n_kept = segment_sum(kept.astype(np.int64), starts)  # [S]
    other_total = segment_sum(np.where(kept, 0, table.key_total), starts)  # [S]
    has_other = other_total > 0
    other_sep = has_other & (other_total * w >= min_expected)
    other_merge = has_other & ~other_sep & (n_kept > 0)
    other_alone = has_other & ~other_sep & (n_kept == 0)
    n_bins = n_kept + other_sep + other_alone  # [S]
    bin_start = np.concatenate([[0], np.cumsum(n_bins)]).astype(np.int64)  # [S+1]
    kept_cum = np.cumsum(kept) - kept  # [K] kept rows before this one (global)
    kept_rank = kept_cum - kept_cum[starts[:-1]][ks]  # [K] rank within stratum
    key_bin = np.full(K, -1, dtype=np.int64)
    key_bin[kept] = bin_start[ks[kept]] + kept_rank[kept]
    other_bin = np.full(S, -1, dtype=np.int64)
    other_bin[other_sep] = bin_start[:-1][other_sep] + n_kept[other_sep]
    other_bin[other_alone] = bin_start[:-1][other_alone]
    if other_merge.any():
        # smallest kept row per stratum: order kept rows by (stratum, total, token)
        kidx = np.flatnonzero(kept)
        order = np.lexsort((table.key_token[kidx], table.key_total[kidx], ks[kidx]))
        first = kidx[order]
        first_of = np.full(S, -1, dtype=np.int64)
        # the first occurrence of each stratum in the ordered list
        strata_in_order = ks[first]
        is_first = np.concatenate([[True], strata_in_order[1:] != strata_in_order[:-1]])
        first_of[strata_in_order[is_first]] = first[is_first]
        other_bin[other_merge] = key_bin[first_of[other_merge]]
    key_bin[~kept] = other_bin[ks[~kept]]
    assert (key_bin >= 0).all()
    bin_total = np.bincount(key_bin, weights=table.key_total, minlength=int(bin_start[-1]))
    bin_total = bin_total.astype(np.int64)
    bin_stratum = np.repeat(np.arange(S), n_bins)
    min_exp = np.minimum.reduceat(bin_total * w[bin_stratum], bin_start[:-1]) if S else np.zeros(0)
    pooled = segment_sum(np.where(kept, 0, np.where(single, table.key_total, 1)), starts)
    testable = (n_bins >= 2) & (n_ref > 0) & (n_cand > 0)
    return PooledBins(key_bin, bin_start, bin_total, n_bins, pooled, min_exp, testable)


def chi2_statistics(
    table: StrataTable,
    bins: PooledBins,
    ref: np.ndarray,
    n_ref: np.ndarray,
    n_cand: np.ndarray,
    dtype: type[np.floating] = np.float64,
) -> np.ndarray:
    """Pooled Pearson χ² of every stratum under every labeling: [S, L] (NaN if untestable).

    ``ref``: [K, L] reference counts per key row (``tables.ref_counts``); ``n_ref``,
    ``n_cand``: [S, L] arm sizes under each labeling. Bins come from the observed labeling
    (``pool_table``), which is what a permutation test of the pooled statistic needs.

    Notes
    -----
    Per bin with combined count c and reference count a: (a − E_a)²/E_a + (b − E_b)²/E_b
    = (a − c·n_a/n)² · n² / (c·n_a·n_b), since b − E_b = −(a − E_a).
    NOTE: the permutation columns use float32 (``dtype``) to halve memory traffic; a χ² is a
    sum of ~10²–10³ positive terms, so the relative error (~1e-6) is far below the resolution
    of any p-value from B ≤ 10⁴ permutations. The observed column is recomputed in float64.
    """
    K, L = ref.shape
    assert K == table.n_keys and n_ref.shape == (table.n_strata, L) == n_cand.shape
    nb_total = int(bins.bin_start[-1])
    # [NB, K] 0/1 aggregation; a bin's reference count is at most the stratum's size, so the
    # product in ref's dtype cannot overflow.
    agg = sp.csr_matrix(
        (np.ones(K, dtype=ref.dtype), (bins.key_bin, np.arange(K))), shape=(nb_total, K)
    )
    a = np.asarray(agg @ ref).astype(dtype)  # [NB, L]
    bin_stratum = np.repeat(np.arange(table.n_strata), bins.n_bins)  # [NB]
    fixed = L <= 1 or bool((n_ref == n_ref[:, :1]).all())
    na = (n_ref[:, :1] if fixed else n_ref)[bin_stratum].astype(np.float64)  # [NB, 1 or L]
    nb = (n_cand[:, :1] if fixed else n_cand)[bin_stratum].astype(np.float64)
    n = na + nb
    c = bins.bin_total.astype(np.float64)[:, None]  # [NB, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        expect = (c * na / n).astype(dtype)
        weight = (n * n / (c * na * nb)).astype(dtype)
        a -= expect
        a *= a
        a *= weight  # [NB, L]
    out = segment_sum(a, bins.bin_start)  # [S, L]
    out[~bins.testable] = np.nan
    out[(n_ref == 0) | (n_cand == 0)] = np.nan
    return out


@dataclass(frozen=True)
class GofResult:
    """One-sample goodness-of-fit χ² of observed counts against known probabilities."""

    statistic: float
    pvalue: float
    dof: int
    n: int
    n_bins: int
    pooled_tokens: int
    min_expected: float
    status: str


def gof_chi2(counts: np.ndarray, probs: np.ndarray, *, min_expected: float = 5.0) -> GofResult:
    """Pearson χ² of ``counts`` [V] against the known law ``probs`` [V] (``scipy.stats.chisquare``).

    Tokens with expected count n·p < ``min_expected`` are pooled into "other" (decided on the
    known p, not on the data); an "other" bin still below the threshold is merged into the kept
    bin with the smallest p. A token observed with p = 0 is a support violation: statistic
    inf, p-value 0.

    Notes
    -----
    Valid only when ``probs`` is *known* (computed exactly from the target). Plugging in the
    reference arm's histogram treats an estimate as exact and roughly doubles the null variance
    at equal arm sizes (a liberal test, tests/test_stats_homogeneity.py): use ``pooled_chi2``
    for two samples.
    """
    counts = np.asarray(counts, dtype=np.int64)  # [V]
    probs = np.asarray(probs, dtype=np.float64)  # [V]
    if counts.shape != probs.shape or counts.ndim != 1:
        raise InputError(
            "gof_chi2: counts and probs must be 1-D of one shape, "
            f"got {counts.shape!r} and {probs.shape!r}"
        )
    if (counts < 0).any():
        raise InputError("gof_chi2: counts must be >= 0")
    if not np.all(np.isfinite(probs)) or (probs < 0).any() or abs(probs.sum() - 1.0) > 1e-6:
        raise InputError(
            f"gof_chi2: probs must be finite, >= 0 and sum to 1, got sum {probs.sum()!r}"
        )
    n = int(counts.sum())
    outside = int(counts[probs == 0].sum())
    if outside:
        return GofResult(np.inf, 0.0, 0, n, 0, 0, 0.0, SUPPORT_VIOLATION)
    exp = n * probs
    kept = np.flatnonzero((exp >= min_expected) & (probs > 0))
    other = np.flatnonzero((exp < min_expected) & (probs > 0))
    obs_b = [int(counts[j]) for j in kept]
    exp_b = [float(exp[j]) for j in kept]
    if other.size:
        o_obs, o_exp = int(counts[other].sum()), float(exp[other].sum())
        if o_exp >= min_expected or not kept.size:
            obs_b.append(o_obs)
            exp_b.append(o_exp)
        else:
            j = int(np.argmin(exp_b))  # first minimum: the smallest p, lowest token id
            obs_b[j] += o_obs
            exp_b[j] += o_exp
    n_bins = len(obs_b)
    min_exp = float(min(exp_b)) if exp_b else 0.0
    if n_bins < 2 or n == 0:
        return GofResult(np.nan, np.nan, 0, n, n_bins, int(other.size), min_exp, UNTESTABLE)
    res = stats.chisquare(np.asarray(obs_b, float), np.asarray(exp_b, float))
    return GofResult(
        float(res.statistic), float(res.pvalue), n_bins - 1, n, n_bins, int(other.size), min_exp, OK
    )
