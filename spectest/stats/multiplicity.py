"""Multiple-testing corrections → ``MultiplicityResult``: BH, BY, Holm, Bonferroni through
statsmodels ``multipletests`` with the method always named (its default is Holm–Šidák), and
Westfall–Young step-down max-T (``maxt_adjust``). Knows no cells or DataFrames.
docs/statistics.md ("Multiplicity").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from statsmodels.stats.multitest import multipletests

from spectest.errors import ConfigError, InputError

# spectest name → statsmodels multipletests method (always passed explicitly)
STATSMODELS_METHOD = {"bh": "fdr_bh", "by": "fdr_by", "holm": "holm", "bonferroni": "bonferroni"}
METHODS = (*STATSMODELS_METHOD, "maxT")


@dataclass(frozen=True)
class MultiplicityResult:
    """Adjusted p-values and decisions for m hypotheses (NaN inputs stay NaN, never rejected)."""

    pvalue_adjusted: np.ndarray  # [m] float64
    reject: np.ndarray  # [m] bool
    method: str  # one of METHODS
    alpha: float
    n_tests: int  # hypotheses with a finite p-value / statistic
    n_rejected: int
    procedure: str  # the call that produced it, e.g. "multipletests(method='fdr_bh')"


def _check_alpha(alpha: float) -> None:
    if not isinstance(alpha, (int, float)) or not (0.0 < alpha < 1.0):
        raise ConfigError(f"alpha must be in (0, 1), got {alpha!r}")


def adjust(pvalues: np.ndarray, method: str, alpha: float = 0.05) -> MultiplicityResult:
    """Adjust ``pvalues`` [m] by 'bh', 'by', 'holm' or 'bonferroni'.

    Notes
    -----
    Calls ``statsmodels.stats.multitest.multipletests(p, alpha, method=...)`` on the finite
    p-values with the method named explicitly ('fdr_bh', 'fdr_by', 'holm', 'bonferroni').
    """
    _check_alpha(alpha)
    if method not in STATSMODELS_METHOD:
        raise ConfigError(
            f"multiplicity method must be one of {sorted(STATSMODELS_METHOD)!r}, got {method!r}"
        )
    p = np.asarray(pvalues, dtype=np.float64).reshape(-1)  # [m]
    finite = np.isfinite(p)
    if ((p[finite] < 0) | (p[finite] > 1)).any():
        raise InputError(
            f"p-values must lie in [0, 1], got {p[finite][(p[finite] < 0) | (p[finite] > 1)][0]!r}"
        )
    sm_method = STATSMODELS_METHOD[method]
    adj = np.full(p.shape, np.nan)
    rej = np.zeros(p.shape, dtype=bool)
    if finite.any():
        r, padj, _, _ = multipletests(p[finite], alpha=alpha, method=sm_method)
        adj[finite] = padj
        rej[finite] = r
    return MultiplicityResult(
        adj,
        rej,
        method,
        float(alpha),
        int(finite.sum()),
        int(rej.sum()),
        f"statsmodels multipletests(method={sm_method!r})",
    )


def maxt_adjust(
    observed: np.ndarray, null: np.ndarray, alpha: float = 0.05, *, step_down: bool = True
) -> MultiplicityResult:
    """Westfall–Young max-T adjusted p-values from permutation statistics.

    Parameters
    ----------
    observed : [m] float
        Statistic of each hypothesis, larger = more extreme, on a common scale (analyze passes
        −log of the asymptotic p-value, i.e. the min-P variant). NaN = not tested.
    null : [B, m] float
        The same statistics under B sequence permutations (NaN counts as −inf).
    step_down : bool
        Step-down (Westfall & Young 1993, Algorithm 2.8) — uniformly more powerful than the
        single-step max-T, with the same FWER control.

    Notes
    -----
    Adjusted p of the j-th most extreme hypothesis: (1 + #{b : max_{k ≥ j} T_b,(k) ≥ T_(j)})
    / (B + 1), made monotone; the +1 counts the observed labeling, which keeps the test exact
    at finite B. The smallest attainable adjusted p is 1/(B + 1).
    """
    _check_alpha(alpha)
    obs = np.asarray(observed, dtype=np.float64).reshape(-1)  # [m]
    nul = np.asarray(null, dtype=np.float64)  # [B, m]
    if nul.ndim != 2 or nul.shape[1] != obs.shape[0]:
        raise InputError(
            f"maxt_adjust: null must be [B, m] with m = {obs.shape[0]}, got {nul.shape!r}"
        )
    B = nul.shape[0]
    finite = np.isfinite(obs)
    adj = np.full(obs.shape, np.nan)
    rej = np.zeros(obs.shape, dtype=bool)
    idx = np.flatnonzero(finite)
    if idx.size:
        order = idx[np.argsort(-obs[idx], kind="stable")]  # most extreme first
        s = obs[order]  # [m']
        t = np.where(np.isnan(nul[:, order]), -np.inf, nul[:, order])  # [B, m']
        if step_down:
            q = np.maximum.accumulate(t[:, ::-1], axis=1)[:, ::-1]  # max over ranks >= j
        else:
            q = np.broadcast_to(t.max(axis=1, keepdims=True), t.shape)
        raw = (1.0 + (q >= s[None, :]).sum(axis=0)) / (B + 1.0)  # [m']
        padj = np.maximum.accumulate(raw) if step_down else raw
        adj[order] = padj
        rej[order] = padj <= alpha
    kind = "step-down" if step_down else "single-step"
    return MultiplicityResult(
        adj,
        rej,
        "maxT",
        float(alpha),
        int(finite.sum()),
        int(rej.sum()),
        f"Westfall-Young {kind} max-T over {B} sequence permutations",
    )
