"""The randomized probability integral transform (``pit_values``: u = F(x⁻) + V·p(x)), the PIT
interval of a token under a reported top-n list (``pit_interval``), each with its slow
reference, and the uniformity tests (KS, Cramér–von Mises, Anderson–Darling:
``uniformity_tests``). Knows no arms, roles or samples table. Why the u are iid U(0, 1) under
H0: docs/statistics.md ("White-box exact tests"), docs/engines-reported-p.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from spectest.errors import ConfigError


@dataclass(frozen=True)
class UniformityResult:
    """A test of u ~ U(0, 1)."""

    statistic: float
    pvalue: float
    test: str  # "ks" | "cvm" | "ad"
    n: int


def pit_values(cdf_lo: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Randomized PIT u = F(x⁻) + V·p(x), V ~ U(0, 1) from ``rng``: [n] → [n].

    NOTE: u is clipped into [0, 1]: F(x⁻) + p(x) can exceed 1 by float rounding.
    """
    cdf_lo = np.asarray(cdf_lo, dtype=np.float64)  # [n]
    p = np.asarray(p, dtype=np.float64)  # [n]
    assert cdf_lo.shape == p.shape and cdf_lo.ndim == 1
    return np.clip(cdf_lo + rng.random(cdf_lo.shape[0]) * p, 0.0, 1.0)


def pit_values_slow(cdf_lo: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The reference of ``pit_values``: one token at a time."""
    v = rng.random(len(p))
    return np.array(
        [min(max(lo + vi * pi, 0.0), 1.0) for lo, pi, vi in zip(cdf_lo, p, v, strict=True)]
    )


def pit_interval(
    p: np.ndarray, cdf_lo: np.ndarray, mass: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each token's PIT interval [lo, lo + width) under the law it was reported from, and
    whether one exists: [n] × 3 → (lo, width, ok), all [n].

    ``cdf_lo`` known (the full law, or a token inside a reported top-n list, whose cdf_lo is
    the mass of the entries listed before it): [cdf_lo, cdf_lo + p). ``cdf_lo`` unknown and a
    list mass S < 1 stated (a token outside the top-n list): the *coarsened* law — the list's
    tokens, then one "rest" outcome of mass 1 − S — gives it [S, 1). Otherwise (p alone, or
    no p) no exact PIT: ``ok`` False. For a token drawn from the reported law the first two are
    exactly uniform (the coarsened law is a function of the token; docs/engines-reported-p.md).
    """
    p, lo, m = (np.asarray(a, np.float64) for a in (p, cdf_lo, mass))
    known = np.isfinite(p) & np.isfinite(lo)
    rest = np.isfinite(p) & ~np.isfinite(lo) & np.isfinite(m) & (m < 1.0)
    start = np.where(known, lo, np.where(rest, m, 0.0))
    width = np.where(known, p, np.where(rest, 1.0 - m, 0.0))
    return np.clip(start, 0.0, 1.0), np.clip(width, 0.0, 1.0), known | rest


def pit_interval_slow(p: float, cdf_lo: float, mass: float) -> tuple[float, float, bool]:
    """The reference of ``pit_interval``: one token."""
    if np.isfinite(p) and np.isfinite(cdf_lo):
        return min(max(cdf_lo, 0.0), 1.0), min(max(p, 0.0), 1.0), True
    if np.isfinite(p) and np.isfinite(mass) and mass < 1.0:
        return min(max(mass, 0.0), 1.0), min(max(1.0 - mass, 0.0), 1.0), True
    return 0.0, 0.0, False


def _adinf(z: np.ndarray) -> np.ndarray:
    """Marsaglia & Marsaglia (2004) limiting CDF of A² (|error| < 2e-6)."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        lo = (
            np.exp(-1.2337141 / z)
            / np.sqrt(z)
            * (
                2.00012
                + (0.247105 - (0.0649821 - (0.0347962 - (0.011672 - 0.00168691 * z) * z) * z) * z)
                * z
            )
        )
        hi = np.exp(
            -np.exp(
                1.0776
                - (2.30695 - (0.43424 - (0.082433 - (0.008056 - 0.0003146 * z) * z) * z) * z) * z
            )
        )
    return np.where(z <= 0, 0.0, np.where(z < 2.0, lo, hi))


def _ad_errfix(n: int, x: float) -> float:
    """Marsaglia & Marsaglia (2004) finite-n correction to ``_adinf``."""
    if x > 0.8:
        return (
            -130.2137
            + (745.2337 - (1705.091 - (1950.646 - (1116.360 - 255.7844 * x) * x) * x) * x) * x
        ) / n
    c = 0.01265 + 0.1757 / n
    if x < c:
        t = x / c
        t = math.sqrt(t) * (1.0 - t) * (49.0 * t - 102.0)
        return t * (0.0037 / (n * n) + 0.00078 / n + 0.00006) / n
    t = (x - c) / (0.8 - c)
    t = -0.00022633 + (6.54034 - (14.6538 - (14.458 - (8.259 - 1.91864 * t) * t) * t) * t) * t
    return t * (0.04213 + 0.01365 / n) / n


def anderson_darling_uniform(u: np.ndarray) -> UniformityResult:
    """Anderson–Darling test of u ~ U(0, 1) with known parameters.

    Notes
    -----
    A² = −n − (1/n)·Σ (2i − 1)·[ln u_(i) + ln(1 − u_(n+1−i))]; p = 1 − AD_n(A²) with the
    Marsaglia & Marsaglia (2004, J. Stat. Softw. 9(2)) ADinf approximation plus their finite-n
    error fix (accurate to ~5 digits for n ≥ 5). NOTE: preferred over
    ``scipy.stats.goodness_of_fit(stats.uniform, u, known_params={'loc': 0, 'scale': 1},
    statistic='ad')``, whose Monte-Carlo null costs n_mc_samples × n draws (minutes at
    n = 10⁶); the statistic equals scipy's and the p-value agrees with its Monte-Carlo p within
    MC error (tests/test_stats_whitebox.py). u is clipped to [1e-300, 1 − 1e-16] for the logs.
    """
    x = np.sort(np.clip(np.asarray(u, dtype=np.float64), 1e-300, 1.0 - 1e-16))  # [n]
    n = x.shape[0]
    if n == 0:
        return UniformityResult(float("nan"), float("nan"), "ad", 0)
    i = np.arange(1, n + 1, dtype=np.float64)
    a2 = float(-n - np.sum((2.0 * i - 1.0) * (np.log(x) + np.log1p(-x[::-1]))) / n)
    cdf = float(_adinf(np.array(a2)))
    cdf = cdf + _ad_errfix(n, cdf)
    return UniformityResult(a2, float(min(max(1.0 - cdf, 0.0), 1.0)), "ad", n)


def uniformity_tests(
    u: np.ndarray, *, tests: Sequence[str] = ("ks", "cvm", "ad")
) -> list[UniformityResult]:
    """KS (``scipy.stats.kstest(u, 'uniform')``), Cramér–von Mises
    (``scipy.stats.cramervonmises(u, 'uniform')``) and Anderson–Darling
    (``anderson_darling_uniform``) tests of u ~ U(0, 1)."""
    u = np.asarray(u, dtype=np.float64)  # [n]
    out = []
    for name in tests:
        if name not in ("ks", "cvm", "ad"):
            raise ConfigError(f"uniformity test must be 'ks', 'cvm' or 'ad', got {name!r}")
        if u.size == 0:
            out.append(UniformityResult(float("nan"), float("nan"), name, 0))
        elif name == "ks":
            r = stats.kstest(u, "uniform")
            out.append(UniformityResult(float(r.statistic), float(r.pvalue), "ks", u.size))
        elif name == "cvm":
            r = stats.cramervonmises(u, "uniform")
            out.append(
                UniformityResult(
                    float(r.statistic), float(min(max(r.pvalue, 0.0), 1.0)), "cvm", u.size
                )
            )
        else:
            out.append(anderson_darling_uniform(u))
    return out
