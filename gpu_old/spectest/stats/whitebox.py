"""White-box exact tests from the target's (and draft's) probabilities along emitted sequences.

Owns: the randomized PIT (``pit_values``) and its uniformity tests (KS, Cramér–von Mises,
Anderson–Darling → ``UniformityResult``), the directed z-test on A_t = {q_t > p_t}
(``directed_z``), the acceptance-rate test against Σ min(p, q) (``acceptance_test``), the exact
support check (``support_check``), validation of the ``wb_*`` columns, ``whitebox_tests``
which runs all of them on each arm and returns a tidy DataFrame, and the α split inside the
family (``WHITEBOX_WEIGHTS``, ``weighted_bonferroni``; ``stats.analyze`` applies it per arm).

Does not know: how p_t / q_t were computed (``engines/teacher.py`` fills the ``wb_*`` columns,
see ``spectest.schema``), two-sample tests, multiplicity across families.

Facts relied on (STATS.md "White-box exact tests"): with V_t ~ U(0,1) independent of the data
and a token order depending only on the prefix, u_t = F_t(x_t⁻) + V_t·p_t(x_t) are iid U(0,1)
under H0 over all N·T emitted tokens, although the process is autoregressive (Rosenblatt 1952;
Brockwell 2007; Czado, Gneiting & Held 2009). p_t must be the post-temperature/top-k/top-p law.
Running every test on the plain (reference) arm too is the control on spectest's own p_t.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.errors import ConfigError, InputError


@dataclass(frozen=True)
class UniformityResult:
    """A test of u ~ U(0, 1)."""

    statistic: float
    pvalue: float
    test: str  # "ks" | "cvm" | "ad"
    n: int


@dataclass(frozen=True)
class DirectedZResult:
    """Z = Σ(1[x_t ∈ A_t] − p_t(A_t)) / √Σ p_t(A_t)(1 − p_t(A_t))."""

    statistic: float
    pvalue: float  # two-sided
    pvalue_greater: float  # one-sided, excess mass on A (what an over-accepting sampler does)
    n: int
    observed: float  # Σ 1[x_t ∈ A_t]
    expected: float  # Σ p_t(A_t)
    mde: float  # smallest mean excess per token detected with 80 % power (two-sided, α = 0.05)


@dataclass(frozen=True)
class AcceptanceResult:
    """Observed accepted draft tokens against their conditional expectation Σ min(p, q)."""

    statistic: float  # z
    pvalue: float  # two-sided
    observed_rate: float  # accepted / attempted draft slots
    expected_rate: float  # Σ overlap / attempted draft slots
    n_attempted: int


@dataclass(frozen=True)
class SupportResult:
    """Emitted tokens the target gives probability 0 (any is a hard failure: p-value 0)."""

    statistic: int  # count of emitted tokens with wb_p == 0
    pvalue: float  # 0.0 if statistic > 0 else 1.0
    n: int


def pit_values(cdf_lo: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Randomized PIT u = F(x⁻) + V·p(x), V ~ U(0, 1) from ``rng``: [n] → [n].

    NOTE: u is clipped into [0, 1]: F(x⁻) + p(x) can exceed 1 by float rounding.
    """
    cdf_lo = np.asarray(cdf_lo, dtype=np.float64)  # [n]
    p = np.asarray(p, dtype=np.float64)  # [n]
    assert cdf_lo.shape == p.shape and cdf_lo.ndim == 1
    return np.clip(cdf_lo + rng.random(cdf_lo.shape[0]) * p, 0.0, 1.0)


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


def directed_z(in_a: np.ndarray, p_a: np.ndarray) -> DirectedZResult:
    """Directed z on A_t = {q_t > p_t}: ``in_a`` [n] bool (x_t ∈ A_t), ``p_a`` [n] p_t(A_t).

    Notes
    -----
    Under H0, 1[x_t ∈ A_t] − p_t(A_t) is a martingale difference with conditional variance
    p_t(A_t)(1 − p_t(A_t)), so Z → N(0, 1) (martingale CLT) even along one autoregressive
    sequence. An ε-biased acceptor puts ε·p(A) extra mass on A (STATS.md: the most powerful
    test in its table, 0.89 at TV 0.023, N = 4000); ``pvalue_greater`` is that direction.
    NaN when Σ p(1 − p) = 0 (e.g. q unknown, p_a all 0).
    """
    x = np.asarray(in_a, dtype=np.float64)  # [n]
    pa = np.asarray(p_a, dtype=np.float64)  # [n]
    assert x.shape == pa.shape and x.ndim == 1
    var = float(np.sum(pa * (1.0 - pa)))
    obs, exp = float(x.sum()), float(pa.sum())
    n = int(x.shape[0])
    if var <= 0.0:
        nan = float("nan")
        return DirectedZResult(nan, nan, nan, n, obs, exp, nan)
    z = (obs - exp) / math.sqrt(var)
    mde = (stats.norm.isf(0.025) + stats.norm.ppf(0.8)) * math.sqrt(var) / n
    return DirectedZResult(
        z, float(2.0 * stats.norm.sf(abs(z))), float(stats.norm.sf(z)), n, obs, exp, float(mde)
    )


def support_check(p: np.ndarray) -> SupportResult:
    """Count emitted tokens with target probability exactly 0 (``wb_p`` [n])."""
    p = np.asarray(p, dtype=np.float64)
    bad = int(np.sum(p == 0.0))
    return SupportResult(bad, 0.0 if bad else 1.0, int(p.shape[0]))


def acceptance_test(rounds: pd.DataFrame, samples: pd.DataFrame, arm: str) -> AcceptanceResult:
    """Accepted draft tokens of ``arm`` against Σ min(p, q) along its emitted sequences.

    Each round of the rounds table (``spectest.schema``) starting at position s attempts draft
    slots j = 0..min(accepted, drafted − 1); slot j is accepted iff j < accepted, with
    conditional probability ``wb_overlap`` at position s + j of the emitted sequence (the
    accepted drafts are the emitted tokens before it, so that is the prefix the verifier saw).
    Slots whose position is not in ``samples`` (past the length budget) are dropped.

    Notes
    -----
    z = (Σ accepted − Σ overlap) / √Σ overlap(1 − overlap), a martingale CLT as in
    ``directed_z``. An always-accept sampler gives rate 1 against Σ min(p, q) < 1.
    """
    need = [sc.PROMPT_ID, sc.CONFIG_ID, sc.ARM, sc.SEED, sc.POSITION, "drafted", "accepted"]
    for col in need:
        if col not in rounds.columns:
            raise InputError(f"rounds: missing column {col!r}")
    r = rounds[rounds[sc.ARM] == arm]
    if len(r) == 0:
        nan = float("nan")
        return AcceptanceResult(nan, nan, nan, nan, 0)
    drafted = r["drafted"].to_numpy(dtype=np.int64)
    accepted = r["accepted"].to_numpy(dtype=np.int64)
    if ((accepted < 0) | (accepted > drafted)).any():
        raise InputError("rounds: column 'accepted' must lie in [0, drafted]")
    n_slots = np.where(drafted > 0, np.minimum(accepted + 1, drafted), 0)  # [R]
    idx = np.repeat(np.arange(len(r)), n_slots)  # [M]
    j = np.arange(idx.shape[0]) - np.repeat(np.cumsum(n_slots) - n_slots, n_slots)  # [M]
    slots = pd.DataFrame(
        {
            sc.PROMPT_ID: r[sc.PROMPT_ID].to_numpy()[idx],
            sc.CONFIG_ID: r[sc.CONFIG_ID].to_numpy()[idx],
            sc.SEED: r[sc.SEED].to_numpy(dtype=np.int64)[idx],
            sc.POSITION: r[sc.POSITION].to_numpy(dtype=np.int64)[idx] + j,
            "acc": (j < accepted[idx]).astype(np.float64),
        }
    )
    s = samples.loc[
        samples[sc.ARM] == arm, [sc.PROMPT_ID, sc.CONFIG_ID, sc.SEED, sc.POSITION, sc.WB_OVERLAP]
    ]
    s = s.astype({sc.SEED: np.int64, sc.POSITION: np.int64})
    m = slots.merge(s, on=[sc.PROMPT_ID, sc.CONFIG_ID, sc.SEED, sc.POSITION], how="inner")
    o = m[sc.WB_OVERLAP].to_numpy(dtype=np.float64)
    acc = m["acc"].to_numpy()
    keep = np.isfinite(o)
    o, acc = o[keep], acc[keep]
    n = int(o.shape[0])
    var = float(np.sum(o * (1.0 - o)))
    if n == 0:
        nan = float("nan")
        return AcceptanceResult(nan, nan, nan, nan, 0)
    if var <= 0.0:
        # every slot had overlap 0 or 1: any disagreement is impossible under H0
        z = 0.0 if np.all(acc == o) else math.copysign(math.inf, float(acc.sum() - o.sum()))
    else:
        z = float((acc.sum() - o.sum()) / math.sqrt(var))
    p = float(2.0 * stats.norm.sf(abs(z)))
    return AcceptanceResult(z, p, float(acc.mean()), float(o.mean()), n)


def validate_whitebox(samples: pd.DataFrame) -> tuple[bool, bool, bool]:
    """Check the ``wb_*`` columns present; return (has PIT columns, has A columns, has overlap).

    NaN means "not computed" (e.g. an arm that was not teacher-forced) and is allowed here;
    ``whitebox_tests`` skips an arm whose values are all NaN and rejects a partly-NaN arm.
    Raises ``InputError`` naming the column and the first bad value.
    """
    has_pit = sc.WB_P in samples.columns and sc.WB_CDF_LO in samples.columns
    has_a = sc.WB_P_A in samples.columns and sc.WB_IN_A in samples.columns
    has_overlap = sc.WB_OVERLAP in samples.columns
    for col in (sc.WB_P, sc.WB_CDF_LO, sc.WB_P_A):
        if col in samples.columns:
            v = samples[col].to_numpy(dtype=np.float64)
            bad = np.isinf(v) | (v < 0.0) | (v > 1.0 + 1e-9)
            if bad.any():
                raise InputError(
                    f"samples: column {col!r} must be in [0, 1] (or NaN), got {v[bad][0]!r}"
                )
    if has_pit:
        total = samples[sc.WB_CDF_LO].to_numpy(dtype=np.float64) + samples[sc.WB_P].to_numpy(
            dtype=np.float64
        )
        if (total > 1.0 + 1e-6).any():
            raise InputError(
                f"samples: wb_cdf_lo + wb_p must be <= 1, got {total[total > 1 + 1e-6][0]!r}"
            )
    if has_overlap:
        v = samples[sc.WB_OVERLAP].to_numpy(dtype=np.float64)
        bad = np.isfinite(v) & ((v < 0.0) | (v > 1.0 + 1e-9))
        if bad.any():
            raise InputError(
                f"samples: column {sc.WB_OVERLAP!r} must be in [0, 1] or NaN, got {v[bad][0]!r}"
            )
    return has_pit, has_a, has_overlap


def _complete(values: np.ndarray, column: str, arm: str) -> bool:
    """True if every value is finite, False if none is (not computed); else ``InputError``."""
    finite = np.isfinite(values)
    if finite.all():
        return values.size > 0
    if not finite.any():
        return False
    raise InputError(f"samples: column {column!r} is NaN for some but not all rows of arm {arm!r}")


WHITEBOX_COLUMNS = ["arm", "test", "statistic", "pvalue", "pvalue_one_sided", "n", "mde", "detail"]

# The α split inside the exact white-box family (weighted Bonferroni, ``weighted_bonferroni``):
# each test's share of the family's α, renormalised over the tests that ran (no rounds → no
# acceptance test; no q → no directed z). "support" is not in it (a hard failure). Chosen from
# measured power on three alternatives — the ε = 0.05 acceptor, a verifier at the wrong
# temperature, a wrong reported q — as the split maximising the worst ratio of the family's
# power to the best single test's (results/LOG.md, 2026-11-30 h10; the reasoning in
# ``stats.whitebox_teacher``'s Notes, "The α split": the p/q-ordered PIT's Anderson–Darling sees
# acceptance bias in the upper tail nearly as well as the directed z, and law errors it cannot).
# Measured family power (ε / temperature / wrong q): equal split 0.70 / 0.445 / 0.35, these
# weights 0.72 / 0.675 / 0.405.
WHITEBOX_WEIGHTS: dict[str, float] = {
    "directed_z": 0.15,
    "pit_ks": 0.05,
    "pit_cvm": 0.05,
    "pit_ad": 0.65,
    "acceptance": 0.10,
}


def weighted_bonferroni(
    tests: Sequence[str], pvalues: np.ndarray, weights: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted Bonferroni over one arm's tests: ``(p_adj, w)``, each ``[len(tests)]``.

    w_i = weights[test_i] / Σ_j weights[test_j] over the ``tests`` given (the tests that ran:
    a missing one's share goes to the others), p_adj_i = min(1, p_i / w_i); reject at
    p_adj_i ≤ α. Raises ``ConfigError`` for a test without a positive weight.

    Notes
    -----
    Valid by the union bound for any dependence between the tests: under H0,
    P(∃ i: p_i ≤ w_i·α) ≤ Σ_i w_i·α = α when each p_i is valid (P(p_i ≤ x) ≤ x) and Σ w_i = 1
    (Holm 1979; Westfall & Young 1993 §2.3 — the equal split w_i = 1/k is the Bonferroni
    factor k). Unequal weights move power to the tests that see the likely alternatives without
    costing level; the weights must be fixed before the data (here: module constants chosen on
    simulated alternatives, never from the run being analysed).
    """
    names = list(tests)
    raw = np.array([float(weights.get(t, 0.0)) for t in names], dtype=np.float64)
    if names and not (raw > 0).all():
        missing = [t for t, v in zip(names, raw, strict=True) if not v > 0]
        raise ConfigError(f"white-box test(s) without a positive α weight: {missing!r}")
    w = raw / raw.sum() if names else raw
    p = np.asarray(pvalues, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        p_adj = np.minimum(1.0, p / np.where(w > 0, w, 1.0))
    return p_adj, w


def whitebox_tests(
    samples: pd.DataFrame,
    arms: Sequence[str],
    rng: np.random.Generator,
    *,
    rounds: pd.DataFrame | None = None,
    uniformity: Sequence[str] = ("ks", "cvm", "ad"),
) -> pd.DataFrame:
    """Every white-box test on every arm in ``arms``: a tidy DataFrame, one row per (arm, test).

    Tests: "support" (always, when wb_p is present), "pit_ks", "pit_cvm", "pit_ad" (wb_p and
    wb_cdf_lo), "directed_z" (wb_p_a, wb_in_a; skipped when q is unknown, i.e. Σ p_A(1 − p_A)
    = 0), "acceptance" (``rounds`` given and wb_overlap finite). Columns: ``WHITEBOX_COLUMNS``;
    ``pvalue_one_sided`` is the directed z's excess-on-A p-value and ``mde`` its minimum
    detectable mean excess per token (NaN for the other tests).
    The PIT's V_t come from ``rng``, drawn per arm in table order.
    """
    has_pit, has_a, has_overlap = validate_whitebox(samples)
    rows: list[dict[str, object]] = []
    nan = float("nan")
    for arm in arms:
        sub = samples[samples[sc.ARM] == arm]
        if has_pit:
            p = sub[sc.WB_P].to_numpy(dtype=np.float64)
            if not _complete(p, sc.WB_P, arm):
                continue
            sup = support_check(p)
            rows.append(
                dict(
                    arm=arm,
                    test="support",
                    statistic=float(sup.statistic),
                    pvalue=sup.pvalue,
                    pvalue_one_sided=nan,
                    n=sup.n,
                    mde=nan,
                    detail="count of emitted tokens with wb_p == 0",
                )
            )
            u = pit_values(sub[sc.WB_CDF_LO].to_numpy(dtype=np.float64), p, rng)
            for res in uniformity_tests(u, tests=uniformity):
                rows.append(
                    dict(
                        arm=arm,
                        test=f"pit_{res.test}",
                        statistic=res.statistic,
                        pvalue=res.pvalue,
                        pvalue_one_sided=nan,
                        n=res.n,
                        mde=nan,
                        detail="randomized PIT vs U(0,1)",
                    )
                )
        p_a = sub[sc.WB_P_A].to_numpy(dtype=np.float64) if has_a else np.zeros(0)
        if has_a and _complete(p_a, sc.WB_P_A, arm):
            dz = directed_z(sub[sc.WB_IN_A].fillna(False).to_numpy(dtype=bool), p_a)
            if np.isfinite(dz.statistic):
                rows.append(
                    dict(
                        arm=arm,
                        test="directed_z",
                        statistic=dz.statistic,
                        pvalue=dz.pvalue,
                        pvalue_one_sided=dz.pvalue_greater,
                        n=dz.n,
                        mde=dz.mde,
                        detail=f"in A: {dz.observed:.1f} observed, {dz.expected:.1f} expected",
                    )
                )
        if has_overlap and rounds is not None:
            acc = acceptance_test(rounds, samples, arm)
            if acc.n_attempted > 0 and not np.isnan(acc.statistic):
                rows.append(
                    dict(
                        arm=arm,
                        test="acceptance",
                        statistic=acc.statistic,
                        pvalue=acc.pvalue,
                        pvalue_one_sided=nan,
                        n=acc.n_attempted,
                        mde=nan,
                        detail=f"rate {acc.observed_rate:.4f} vs Σmin(p,q) {acc.expected_rate:.4f}",
                    )
                )
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in WHITEBOX_COLUMNS})
    return pd.DataFrame(rows, columns=WHITEBOX_COLUMNS)
