"""A count of Bernoulli outcomes against its probabilities (``count_test``): the two-sided
p-value of Σ x_i given P(x_i = 1) = o_i — the normal approximation where its variance is large,
the exact Poisson-binomial law where it is small (``SMALL_VARIANCE``). Knows nothing about
draft slots or tokens: ``whitebox``'s acceptance and directed tests call it. Why: docs/roles.md
"The per-slot acceptance test".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

# Σ o(1 − o) below which the p-value is the exact Poisson-binomial one: there the count is a
# handful of rare outcomes, and the normal approximation calls one rejection among draft slots
# that each accept with probability 0.999999 a 4.7σ event (its probability was 4 %)
SMALL_VARIANCE = 25.0
# DFT points: at least twice m + 12√m + 30 for m expected rare outcomes (≤ 2·SMALL_VARIANCE):
# the deviation's mass beyond half of them, folded back by the DFT, is below 1e-20 (Chernoff)
_MIN_POINTS = 64
_CHUNK = 8192  # outcomes per block of the characteristic function


@dataclass(frozen=True)
class CountResult:
    """Σ x against Σ o: z (``statistic``), two-sided ``pvalue``, ``pvalue_greater`` (more 1s)."""

    statistic: float
    pvalue: float
    pvalue_greater: float


def count_test(x: np.ndarray, o: np.ndarray) -> CountResult:
    """Σ x (0/1 outcomes) against the probabilities ``o`` (same shape), both tails at once.

    While Σ o(1 − o) ≥ ``SMALL_VARIANCE``: z = (Σ x − Σ o)/√Σ o(1 − o) and its normal
    p-values. Below it: the exact law of Σ x when the x_i are independent Bernoulli(o_i)
    (Poisson-binomial) — two-sided p twice the smaller tail (at most 1), one-sided P(Σ X ≥ Σ x)
    — and z the normal quantile with that two-sided p-value and the sign of Σ x − Σ o. Zero
    variance: z = 0 and p = 1 when they agree, ±inf and 0 when not (impossible under H0).

    Notes
    -----
    Where the o_i are predictable rather than fixed (each known before its outcome, as a
    verifier's acceptance probability is), the exact law is that of independent outcomes; the
    normal approximation is the martingale CLT. Both are asymptotically the same; the exact law
    keeps the stated rate where the count is small (tests/test_stats_bernoulli_sum.py).
    """
    x = np.asarray(x, dtype=np.float64)
    o = np.asarray(o, dtype=np.float64)
    var = float(np.sum(o * (1.0 - o)))
    excess = float(x.sum() - o.sum())
    if var <= 0.0:
        if np.all(x == o):
            return CountResult(0.0, 1.0, 1.0)
        return CountResult(math.copysign(math.inf, excess), 0.0, 0.0 if excess > 0 else 1.0)
    z = excess / math.sqrt(var)
    if var >= SMALL_VARIANCE:
        return CountResult(z, float(2.0 * stats.norm.sf(abs(z))), float(stats.norm.sf(z)))
    lower, upper = _exact_tails(x, o)
    p = min(1.0, 2.0 * min(lower, upper))
    zq = float(stats.norm.isf(p / 2.0)) if p < 1.0 else 0.0
    return CountResult(math.copysign(zq, excess), p, upper)


def _exact_tails(x: np.ndarray, o: np.ndarray) -> tuple[float, float]:
    """``(P(Σ X ≤ Σ x), P(Σ X ≥ Σ x))`` under independent Bernoulli(o_i): the count written as
    the likely outcomes' sum plus D = (rare 1s) − (rare 0s), D's law by the inverse DFT of its
    characteristic function on P points (``_MIN_POINTS`` or more)."""
    live = (o > 0.0) & (o < 1.0)  # the certain outcomes carry nothing (and agree: var > 0 here)
    x, o = x[live], o[live]
    likely = o >= 0.5  # [n] the more probable outcome of each: 1 here, 0 elsewhere
    u = np.where(likely, 1.0 - o, o)  # [n] probability of the rare outcome, ≤ 1/2
    step = np.where(likely, -1.0, 1.0)  # [n] the rare outcome moves D by −1 (a 0) or +1 (a 1)
    m = float(u.sum())
    P = max(_MIN_POINTS, 1 << math.ceil(math.log2(2.0 * (m + 12.0 * math.sqrt(m) + 30.0))))
    theta = 2.0 * math.pi * np.arange(P) / P  # [P]
    log_cf = np.zeros(P, dtype=np.complex128)  # log E e^{iθD}
    for lo in range(0, u.shape[0], _CHUNK):
        ub, sb = u[lo : lo + _CHUNK, None], step[lo : lo + _CHUNK, None]  # [c, 1]
        log_cf += np.log1p(ub * (np.exp(1j * sb * theta[None, :]) - 1.0)).sum(0)
    law = np.fft.fft(np.exp(log_cf)).real / P  # [P] P(D ≡ d mod P), d = 0..P−1
    law = np.clip(np.roll(law, P // 2), 0.0, None)  # d = −P/2 .. P/2 − 1
    d_obs = round(float(x.sum()) - float(likely.sum()))
    at = d_obs + P // 2
    if not 0 <= at < P:  # beyond the support: that tail's mass is below double precision
        return (0.0, 1.0) if at < 0 else (1.0, 0.0)
    return min(1.0, float(law[: at + 1].sum())), min(1.0, float(law[at:].sum()))
