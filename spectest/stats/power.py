"""Power and minimum detectable effects of the pooled χ² (``mde_tv``, ``seeds_for_tv``) and the
directed z (``directed_z_mde``), and testability at real vocabularies (``estimate_testability``).
Knows no samples, cells or multiplicity (callers pass the per-test α). docs/statistics.md
("Power and minimum detectable effect").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

from spectest.errors import ConfigError


def _check(alpha: float, power: float) -> None:
    if not (0.0 < alpha < 1.0):
        raise ConfigError(f"alpha must be in (0, 1), got {alpha!r}")
    if not (alpha < power < 1.0):
        raise ConfigError(f"power must be in (alpha, 1), got {power!r}")


@lru_cache(maxsize=4096)
def lambda_star(df: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """λ* with ``ncx2.sf(chi2.isf(alpha, df), df, λ*) == power`` (``brentq``, rtol 1e-10)."""
    _check(alpha, power)
    if isinstance(df, bool) or int(df) != df or df < 1:
        raise ConfigError(f"df must be an integer >= 1, got {df!r}")
    crit = stats.chi2.isf(alpha, df)
    hi = 1.0
    while stats.ncx2.sf(crit, df, hi) < power:
        hi *= 2.0
    return float(
        optimize.brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - power, 0.0, hi, rtol=1e-10)
    )


def mde_tv(
    n_ref: float | np.ndarray,
    n_cand: float | np.ndarray,
    df: int | np.ndarray,
    alpha: float = 0.05,
    power: float = 0.8,
) -> np.ndarray:
    """Smallest binned-law TV detected with ``power`` by the pooled χ² at level ``alpha``.

    Vectorised over ``n_ref``, ``n_cand``, ``df`` (broadcast); NaN where df < 1 or an arm is
    empty. MDE = √(λ*(df, α, power) / (2·N_eff)), N_eff = 2·n_ref·n_cand/(n_ref + n_cand).
    """
    na = np.asarray(n_ref, dtype=np.float64)
    nc = np.asarray(n_cand, dtype=np.float64)
    d = np.asarray(df)
    na, nc, d = np.broadcast_arrays(na, nc, d)
    out = np.full(na.shape, np.nan)
    good = (d >= 1) & (na > 0) & (nc > 0) & np.isfinite(d)
    if good.any():
        dfs = d[good].astype(np.int64)
        lam = np.array([lambda_star(int(k), float(alpha), float(power)) for k in np.unique(dfs)])
        lam_of = lam[np.searchsorted(np.unique(dfs), dfs)]
        n_eff = 2.0 * na[good] * nc[good] / (na[good] + nc[good])
        out[good] = np.sqrt(lam_of / (2.0 * n_eff))
    return out


def seeds_for_tv(tv: float, df: int, alpha: float = 0.05, power: float = 0.8) -> int:
    """Seeds per arm (equal arms) for the pooled χ² to detect ``tv`` with ``power``: ⌈λ*/(2·TV²)⌉.

    ``df`` is the pooled table's bins − 1 (more seeds keep more bins: iterate if needed).
    """
    if not (0.0 < tv <= 1.0):
        raise ConfigError(f"tv must be in (0, 1], got {tv!r}")
    return math.ceil(lambda_star(int(df), alpha, power) / (2.0 * tv * tv))


def directed_z_mde(
    n_tokens: float, p_a: float, alpha: float = 0.05, power: float = 0.8, *, two_sided: bool = True
) -> float:
    """Smallest shift of the mean of 1[x ∈ A] − p(A) the directed z detects with ``power``.

    (z_{1−α/2} + z_{power})·√(p_A(1 − p_A)/n_tokens) (one-sided: z_{1−α}); for the ε-biased
    acceptor the shift equals its TV (the excess mass on A = {q > p}).
    """
    _check(alpha, power)
    if not (0.0 < p_a < 1.0) or n_tokens <= 0:
        return float("nan")
    z_a = stats.norm.isf(alpha / 2 if two_sided else alpha)
    return float((z_a + stats.norm.ppf(power)) * math.sqrt(p_a * (1.0 - p_a) / n_tokens))


def directed_z_2s_mde(
    n_tokens: float,
    p_a: float,
    reference_multiplier: float,
    alpha: float = 0.05,
    power: float = 0.8,
    *,
    two_sided: bool = True,
) -> float:
    """``directed_z_mde`` of the two-sample (teacher-mode) directed z: candidate ``n_tokens``,
    reference m = ``reference_multiplier`` × as many (``seeds.reference_per_arm``): √(1 + 1/m) ×
    the one-sample MDE (docs/statistics.md "White-box tests under a teacher's numerics")."""
    if reference_multiplier <= 0:
        raise ConfigError(f"reference_multiplier must be > 0, got {reference_multiplier!r}")
    one = directed_z_mde(n_tokens, p_a, alpha, power, two_sided=two_sided)
    return float(one * math.sqrt(1.0 + 1.0 / reference_multiplier))


def reference_multiplier_for(mde_ratio: float) -> int:
    """Smallest integer m with √(1 + 1/m) ≤ ``mde_ratio``: the reference size (× ``per_arm``)
    at which the two-sample directed z's MDE is within ``mde_ratio`` of the one-sample MDE
    (1.10 → 5; ``directed_z_2s_mde``)."""
    if not mde_ratio > 1.0:
        raise ConfigError(f"mde_ratio must be > 1, got {mde_ratio!r}")
    return math.ceil(1.0 / (mde_ratio * mde_ratio - 1.0) - 1e-12)


# ----------------------------------------------------------------------------- testability
@dataclass(frozen=True)
class Testability:
    """How many seeds per arm would make cell-positions testable, at the observed laws.

    ``seeds_needed`` [K]: per cell-position, the seeds per arm N* at which the pooled χ²'s keep
    rule makes it testable (inf where it never would at the estimated law, or where the run
    cannot estimate it); ``seeds_for_share``: share s → the smallest N at which a share ≥ s of
    the K cell-positions has N* ≤ N (None where that N is infinite); ``seeds_at_least``: the
    same from the plug-in maximum share (biased upward, so a lower bound on the seeds — useful
    where the cross-fitted estimate is None); ``seeds_per_arm``: the run's mean observed seeds
    per arm (for comparison).
    """

    seeds_needed: np.ndarray
    seeds_for_share: dict[float, int | None]
    seeds_at_least: dict[float, int | None]
    seeds_per_arm: float


def cross_fitted_top_counts(
    ref: np.ndarray, cand: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per position, the count in each arm of the *other* arm's most frequent token.

    ``ref`` [n_r, T], ``cand`` [n_c, T] token ids (< 0 = missing). Returns
    ``(a, b, top, n_r, n_c)``, each [T]: a = count in ``cand`` of ref's top token, b = count in
    ``ref`` of cand's top token (ties: the lowest id), top = the largest combined count of one
    token (the plug-in maximum), and the arms' non-missing counts per position; a, b and top are
    0 where either arm has no token. Why cross-fitted: docs/statistics.md ("Seeds to testable").
    All positions at once, on (position, token) keys; ``cross_fitted_top_counts_loop`` is the
    reference, one position at a time.
    """
    T = int(ref.shape[1])
    width = int(max(ref.max(initial=-1), cand.max(initial=-1))) + 1  # key = t·width + token
    (kr, cr), (kc, cc) = _key_counts(ref, width), _key_counts(cand, width)
    n_r, n_c = (ref >= 0).sum(axis=0), (cand >= 0).sum(axis=0)
    both = (n_r > 0) & (n_c > 0)  # [T]
    a = np.where(both, _count_of(kc, cc, _top_keys(kr, cr, T, width)), 0)
    b = np.where(both, _count_of(kr, cr, _top_keys(kc, cc, T, width)), 0)
    keys = np.concatenate([kr, kc])
    uk, inv = np.unique(keys, return_inverse=True)
    combined = np.bincount(inv, weights=np.concatenate([cr, cc]), minlength=len(uk))
    top = np.zeros(T, dtype=np.int64)
    np.maximum.at(top, uk // max(width, 1), combined.astype(np.int64))
    return a.astype(np.int64), b.astype(np.int64), np.where(both, top, 0), n_r, n_c


def _key_counts(x: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct (position, token) keys ``t·width + token`` of ``x``'s tokens, counts."""
    t = np.broadcast_to(np.arange(int(x.shape[1]), dtype=np.int64), x.shape)
    ok = x >= 0
    return np.unique(t[ok] * width + x[ok].astype(np.int64), return_counts=True)


def _top_keys(keys: np.ndarray, counts: np.ndarray, T: int, width: int) -> np.ndarray:
    """[T]: per position the key of its most frequent token, the lowest id on ties; -1 if none."""
    t = keys // max(width, 1)
    order = np.lexsort((keys, -counts, t))  # by position, count descending, then token id
    ts = t[order]
    first = np.r_[True, ts[1:] != ts[:-1]] if len(ts) else np.zeros(0, dtype=bool)
    out = np.full(T, -1, dtype=np.int64)
    out[ts[first]] = keys[order][first]
    return out


def _count_of(keys: np.ndarray, counts: np.ndarray, q: np.ndarray) -> np.ndarray:
    """[len(q)]: the count of each key ``q`` in the sorted ``keys`` (0 if absent or q < 0)."""
    if not len(keys):
        return np.zeros(len(q), dtype=np.int64)
    i = np.clip(np.searchsorted(keys, q), 0, len(keys) - 1)
    return np.where((keys[i] == q) & (q >= 0), counts[i], 0)


def cross_fitted_top_counts_loop(
    ref: np.ndarray, cand: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Slow reference of ``cross_fitted_top_counts``: the same counts, one position at a time."""
    T = int(ref.shape[1])
    a, b = np.zeros(T, dtype=np.int64), np.zeros(T, dtype=np.int64)
    top = np.zeros(T, dtype=np.int64)
    for t in range(T):
        x, y = ref[:, t], cand[:, t]
        x, y = x[x >= 0], y[y >= 0]
        if x.size and y.size:
            ux, cx = np.unique(x, return_counts=True)
            uy, cy = np.unique(y, return_counts=True)
            a[t] = int(np.sum(y == ux[np.argmax(cx)]))
            b[t] = int(np.sum(x == uy[np.argmax(cy)]))
            top[t] = int(np.unique(np.r_[x, y], return_counts=True)[1].max())
    return a, b, top, (ref >= 0).sum(axis=0), (cand >= 0).sum(axis=0)


def seeds_to_testable(top_share: np.ndarray, min_expected: float = 5.0) -> np.ndarray:
    """Seeds per arm N* at which a cell-position with top-token share π becomes testable.

    Notes
    -----
    N* = ⌈min_expected / min(π, 1 − π)⌉ from ``homogeneity.pool_table``'s keep rule with expected
    counts plugged in (inf when π is 0 or 1); it counts the *smaller* arm's seeds. Derivation:
    docs/statistics.md ("Seeds to testable").
    """
    pi = np.asarray(top_share, dtype=np.float64)
    m = np.minimum(pi, 1.0 - pi)
    with np.errstate(divide="ignore"):
        return np.where(m > 0, np.ceil(min_expected / np.where(m > 0, m, 1.0) - 1e-9), np.inf)


def estimate_testability(
    top_ref_in_cand: np.ndarray,
    top_cand_in_ref: np.ndarray,
    top_combined: np.ndarray,
    n_ref: np.ndarray,
    n_cand: np.ndarray,
    min_expected: float,
    shares: tuple[float, ...],
) -> Testability:
    """``Testability`` from ``cross_fitted_top_counts`` of every cell-position ([K] each).

    π̂ = (a/n_c + b/n_r)/2 (the two cross-fitted estimates averaged); N* from
    ``seeds_to_testable``; for a share s, the ⌈s·K⌉-th smallest N*. ``seeds_at_least`` uses
    the plug-in share top/(n_r + n_c) instead.
    """
    a = np.asarray(top_ref_in_cand, dtype=np.float64)
    b = np.asarray(top_cand_in_ref, dtype=np.float64)
    nr = np.asarray(n_ref, dtype=np.float64)
    nc = np.asarray(n_cand, dtype=np.float64)
    ok = (nr > 0) & (nc > 0)
    pi = np.where(ok, 0.5 * (a / np.maximum(nc, 1) + b / np.maximum(nr, 1)), 0.0)
    need = np.where(ok, seeds_to_testable(pi, min_expected), np.inf)  # [K]
    plug = np.where(ok, np.asarray(top_combined, dtype=np.float64) / np.maximum(nr + nc, 1), 0.0)
    need_lo = np.where(ok, seeds_to_testable(plug, min_expected), np.inf)  # [K]
    K = int(need.shape[0])
    # N* counts the smaller arm's seeds (``seeds_to_testable``): report that arm's size
    seeds = float(np.mean(np.minimum(nr, nc))) if K else float("nan")
    return Testability(need, _quantiles(need, shares), _quantiles(need_lo, shares), seeds)


def _quantiles(need: np.ndarray, shares: tuple[float, ...]) -> dict[float, int | None]:
    """Share s → the ⌈s·K⌉-th smallest of ``need`` [K] (None if infinite or K = 0)."""
    K = int(need.shape[0])
    srt = np.sort(need)
    out: dict[float, int | None] = {}
    for s in shares:
        v = srt[max(0, math.ceil(s * K) - 1)] if K else np.inf
        out[s] = int(v) if np.isfinite(v) else None
    return out
