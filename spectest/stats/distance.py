"""Plug-in total variation per table, its permutation null, and the excess over the null
(``tv_test`` → ``TVResult``; ``tv_statistics`` for many strata and labelings). Knows no
multiplicity, cells or DataFrames. Why a raw TV is never reported alone: docs/statistics.md
("Total variation").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spectest.errors import ConfigError, InputError
from spectest.stats.tables import StrataTable, per_key, segment_sum


@dataclass(frozen=True)
class TVResult:
    """Plug-in TV of one table against its sequence-permutation null."""

    statistic: float  # plug-in TV between the two empirical histograms
    pvalue: float  # (1 + #{null >= statistic}) / (B + 1)
    null_mean: float
    null_quantile: float  # the ``quantile`` quantile of the null
    excess: float  # statistic − null_mean
    n_permutations: int
    quantile: float


def tv_distance(a: np.ndarray, b: np.ndarray) -> float:
    """½ Σ |a/Σa − b/Σb| of two non-negative histograms over one token set (NaN if one is empty)."""
    a = np.asarray(a, dtype=np.float64)  # [J]
    b = np.asarray(b, dtype=np.float64)  # [J]
    if a.shape != b.shape:
        raise InputError(f"tv_distance: shapes differ: {a.shape!r} vs {b.shape!r}")
    sa, sb = a.sum(), b.sum()
    if sa <= 0 or sb <= 0:
        return float("nan")
    return float(0.5 * np.abs(a / sa - b / sb).sum())


def summarize_null(
    observed: np.ndarray, null: np.ndarray, quantile: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Null mean, null quantile and permutation p-value per row: ``observed`` [S], ``null`` [S, B].

    NOTE: the quantile uses numpy's default linear interpolation. NOTE: compare like with like —
    pass an ``observed`` computed by the same arithmetic (dtype, summation order) as ``null``,
    e.g. column 0 of a ``tv_statistics`` call whose label matrix starts with the observed
    labeling, so that a relabeling equal to the observed one ties exactly.
    """
    assert null.ndim == 2 and null.shape[0] == observed.shape[0]
    B = null.shape[1]
    if B == 0:
        nan = np.full(observed.shape, np.nan)
        return nan, nan.copy(), nan.copy()
    with np.errstate(invalid="ignore"):
        mean = null.mean(axis=1)
        q = np.quantile(null, quantile, axis=1)
        p = (1.0 + (null >= observed[:, None]).sum(axis=1)) / (B + 1.0)
    p = np.where(np.isfinite(observed), p, np.nan)
    return mean, q, p


def tv_test(
    ref_counts: np.ndarray,
    cand_counts: np.ndarray,
    rng: np.random.Generator,
    *,
    n_permutations: int = 200,
    quantile: float = 0.95,
) -> TVResult:
    """Plug-in TV of one (reference, candidate) table and its permutation null.

    Parameters
    ----------
    ref_counts, cand_counts : int arrays [J]
    rng : numpy Generator (the caller's; never a global)
    n_permutations : int
        B relabelings of the pooled tokens between the arms (sizes kept).
    quantile : float
        Upper quantile of the null reported (0.95).

    Notes
    -----
    For one table, relabeling the n = n_ref + n_cand tokens uniformly at random gives
    reference counts with the multivariate hypergeometric law of the combined counts, which
    is drawn directly (``rng.multivariate_hypergeometric``). For several positions of the same
    sequences, ``analyze`` permutes whole sequences instead (``tv_statistics``); both give the
    same per-position null (tested). The excess is a debiased effect size, not a test; the
    p-value is reported for information.
    """
    if not isinstance(n_permutations, int) or n_permutations < 1:
        raise ConfigError(f"n_permutations must be an integer >= 1, got {n_permutations!r}")
    if not (0.0 < quantile < 1.0):
        raise ConfigError(f"quantile must be in (0, 1), got {quantile!r}")
    ref = np.asarray(ref_counts, dtype=np.int64)  # [J]
    cand = np.asarray(cand_counts, dtype=np.int64)  # [J]
    if ref.shape != cand.shape or ref.ndim != 1 or (ref < 0).any() or (cand < 0).any():
        raise InputError("tv_test: counts must be two non-negative 1-D arrays of one shape")
    n_ref, n_cand = int(ref.sum()), int(cand.sum())
    obs = tv_distance(ref, cand)
    if not np.isfinite(obs):
        nan = float("nan")
        return TVResult(nan, nan, nan, nan, nan, n_permutations, quantile)
    total = ref + cand
    sim_ref = rng.multivariate_hypergeometric(total, n_ref, size=n_permutations)  # [B, J]
    sim = 0.5 * np.abs(sim_ref / n_ref - (total - sim_ref) / n_cand).sum(axis=1)  # [B]
    mean, q, p = summarize_null(np.array([obs]), sim[None, :], quantile)
    return TVResult(
        obs,
        float(p[0]),
        float(mean[0]),
        float(q[0]),
        obs - float(mean[0]),
        n_permutations,
        quantile,
    )


def tv_statistics(
    table: StrataTable,
    ref: np.ndarray,
    n_ref: np.ndarray,
    n_cand: np.ndarray,
    dtype: type[np.floating] = np.float64,
) -> np.ndarray:
    """Plug-in TV of every stratum under every labeling: [S, L] (NaN where an arm is empty).

    ``ref``: [K, L] reference counts per key row; ``n_ref``, ``n_cand``: [S, L] arm sizes.
    A merged singleton row (c tokens seen once) contributes a/n_ref + (c − a)/n_cand, exactly
    the sum of its tokens' |·| terms. NOTE: float32 for the permutation columns as in
    ``homogeneity.chi2_statistics``; TV sums ≤ 10⁴ terms of one sign pattern each, relative
    error ~1e-6.
    """
    K, L = ref.shape
    assert K == table.n_keys and n_ref.shape == (table.n_strata, L) == n_cand.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_a = 1.0 / per_key(n_ref, table).astype(dtype)  # [K, 1] or [K, L]
        inv_b = 1.0 / per_key(n_cand, table).astype(dtype)
        single = table.is_singleton_row[:, None]  # [K, 1]
        c = table.key_total.astype(dtype)[:, None]  # [K, 1]
        # |a/n_a − (c − a)/n_b| = |a·(1/n_a + 1/n_b) − c/n_b|; a merged singleton row:
        # a/n_a + (c − a)/n_b = a·(1/n_a − 1/n_b) + c/n_b (already >= 0)
        slope = np.where(single, inv_a - inv_b, inv_a + inv_b).astype(dtype)
        offset = np.where(single, c * inv_b, -c * inv_b).astype(dtype)
        term = ref.astype(dtype)  # [K, L]
        term *= slope
        term += offset
        np.abs(term, out=term)
    out = 0.5 * segment_sum(term, table.stratum_start)  # [S, L]
    out[(n_ref == 0) | (n_cand == 0)] = np.nan
    return out
