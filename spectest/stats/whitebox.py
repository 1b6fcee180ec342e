"""White-box exact tests of one arm from the target's (and draft's) probabilities along its
emitted sequences (``whitebox_tests``: PIT, directed z, acceptance, support, role tests) and the
α split inside the family (``WHITEBOX_WEIGHTS``, ``weighted_bonferroni``). Knows not how p_t was
computed. Why each test is exact: docs/statistics.md ("White-box exact tests"), docs/roles.md.
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
from spectest.stats import whitebox_roles as roles
from spectest.stats.bernoulli_sum import count_test
from spectest.stats.pit import pit_values, uniformity_tests


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
class SlotAcceptanceResult:
    """Per-slot accepted drafts against Σ min(p, q): χ² = Σ_j z_j² over the slots that ran."""

    statistic: float  # Σ z_j² (inf: a slot disagreed where every overlap was 0 or 1)
    pvalue: float
    dof: int  # slots with a finite z
    z: tuple[float, ...]  # per slot j = 0..K−1 (NaN: slot not attempted or zero variance)
    observed_rate: tuple[float, ...]
    expected_rate: tuple[float, ...]
    n_attempted: tuple[int, ...]


@dataclass(frozen=True)
class SupportResult:
    """Emitted tokens the target gives probability 0 (any is a hard failure: p-value 0)."""

    statistic: int  # count of emitted tokens with wb_p == 0
    pvalue: float  # 0.0 if statistic > 0 else 1.0
    n: int


def directed_z(in_a: np.ndarray, p_a: np.ndarray) -> DirectedZResult:
    """Directed z on A_t = {q_t > p_t}: ``in_a`` [n] bool (x_t ∈ A_t), ``p_a`` [n] p_t(A_t).

    Notes
    -----
    Under H0, 1[x_t ∈ A_t] − p_t(A_t) is a martingale difference with conditional variance
    p_t(A_t)(1 − p_t(A_t)), so Z → N(0, 1) (martingale CLT) even along one autoregressive
    sequence. An ε-biased acceptor puts extra mass on A (``pvalue_greater``; its power:
    docs/statistics.md "White-box exact tests"). NaN when Σ p(1 − p) = 0 (q unknown). Below
    ``bernoulli_sum.SMALL_VARIANCE`` (A rarely hit: near-degenerate laws) the p-values are the
    exact Poisson-binomial ones and z the two-sided one's normal quantile (``count_test``).
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
    c = count_test(x, pa)  # the exact law where the count is small, as the acceptance's
    mde = (stats.norm.isf(0.025) + stats.norm.ppf(0.8)) * math.sqrt(var) / n
    return DirectedZResult(c.statistic, c.pvalue, c.pvalue_greater, n, obs, exp, float(mde))


def support_check(p: np.ndarray) -> SupportResult:
    """Count emitted tokens with target probability exactly 0 (``wb_p`` [n])."""
    p = np.asarray(p, dtype=np.float64)
    bad = int(np.sum(p == 0.0))
    return SupportResult(bad, 0.0 if bad else 1.0, int(p.shape[0]))


def _attempted_slots(
    rounds: pd.DataFrame, samples: pd.DataFrame, arm: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(accepted [M], overlap [M], slot [M])`` of every attempted draft slot of ``arm`` whose
    position is in ``samples`` with a finite ``wb_overlap`` (``acceptance_test``'s Notes)."""
    need = [sc.PROMPT_ID, sc.CONFIG_ID, sc.ARM, sc.SEED, sc.POSITION, "drafted", "accepted"]
    for col in need:
        if col not in rounds.columns:
            raise InputError(f"rounds: missing column {col!r}")
    r = rounds[rounds[sc.ARM] == arm]
    empty = np.zeros(0)
    if len(r) == 0:
        return empty, empty, empty.astype(np.int64)
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
            "slot": j.astype(np.int64),
        }
    )
    s = samples.loc[
        samples[sc.ARM] == arm, [sc.PROMPT_ID, sc.CONFIG_ID, sc.SEED, sc.POSITION, sc.WB_OVERLAP]
    ]
    s = s.astype({sc.SEED: np.int64, sc.POSITION: np.int64})
    m = slots.merge(s, on=[sc.PROMPT_ID, sc.CONFIG_ID, sc.SEED, sc.POSITION], how="inner")
    o = m[sc.WB_OVERLAP].to_numpy(dtype=np.float64)
    keep = np.isfinite(o)
    return m["acc"].to_numpy()[keep], o[keep], m["slot"].to_numpy(dtype=np.int64)[keep]


Slots = tuple[np.ndarray, np.ndarray, np.ndarray]  # ``_attempted_slots``: accepted, overlap, slot


def acceptance_test(
    rounds: pd.DataFrame, samples: pd.DataFrame, arm: str, *, slots: Slots | None = None
) -> AcceptanceResult:
    """Accepted draft tokens of ``arm`` against Σ min(p, q) along its emitted sequences
    (``slots``: ``_attempted_slots`` of the same arguments when the caller has them).

    Each round of the rounds table (``spectest.schema``) starting at position s attempts draft
    slots j = 0..min(accepted, drafted − 1); slot j is accepted iff j < accepted, with
    conditional probability ``wb_overlap`` at position s + j of the emitted sequence (the
    accepted drafts are the emitted tokens before it, so that is the prefix the verifier saw).
    Slots whose position is not in ``samples`` (past the length budget) are dropped.

    Notes
    -----
    z = (Σ accepted − Σ overlap) / √Σ overlap(1 − overlap), a martingale CLT as in
    ``directed_z``, while that variance is at least ``bernoulli_sum.SMALL_VARIANCE``; below it
    the p-value is the exact Poisson-binomial one and z its normal quantile
    (``bernoulli_sum.count_test``: a near-certain acceptance made one rejection a 4.7σ event).
    An always-accept sampler gives rate 1 against Σ min(p, q) < 1.
    """
    acc, o, _ = slots if slots is not None else _attempted_slots(rounds, samples, arm)
    n = int(o.shape[0])
    if n == 0:
        nan = float("nan")
        return AcceptanceResult(nan, nan, nan, nan, 0)
    c = count_test(acc, o)
    return AcceptanceResult(c.statistic, c.pvalue, float(acc.mean()), float(o.mean()), n)


def acceptance_by_slot(
    rounds: pd.DataFrame, samples: pd.DataFrame, arm: str, *, slots: Slots | None = None
) -> SlotAcceptanceResult:
    """``acceptance_test`` stratified by the slot j of the draft in its round: z_j per slot and
    χ² = Σ_j z_j² on as many degrees of freedom as slots with a finite z (``slots`` as there).

    Notes
    -----
    Σ z_j² → χ²_K under H0: the slots' martingale differences never share a term
    (docs/roles.md "The per-slot acceptance test"). A zero-variance slot that disagrees
    (z = ±inf) gives p = 0.
    """
    acc, o, slot = slots if slots is not None else _attempted_slots(rounds, samples, arm)
    nan = float("nan")
    if o.shape[0] == 0:
        return SlotAcceptanceResult(nan, nan, 0, (), (), (), ())
    K = int(slot.max()) + 1
    z, obs, exp, n = [], [], [], []
    for j in range(K):
        at = slot == j
        n.append(int(at.sum()))
        if not at.any():
            z.append(nan)
            obs.append(nan)
            exp.append(nan)
            continue
        obs.append(float(acc[at].mean()))
        exp.append(float(o[at].mean()))
        zj = count_test(acc[at], o[at]).statistic
        if zj == 0.0 and float(np.sum(o[at] * (1.0 - o[at]))) <= 0.0:
            zj = nan  # every overlap 0 or 1 and no disagreement: the slot carries nothing
        z.append(zj)
    zz = np.array([v for v in z if not math.isnan(v)], dtype=np.float64)
    if zz.size == 0:
        return SlotAcceptanceResult(nan, nan, 0, tuple(z), tuple(obs), tuple(exp), tuple(n))
    chi2 = float(np.sum(zz**2))
    p = 0.0 if not np.isfinite(chi2) else float(stats.chi2.sf(chi2, zz.size))
    return SlotAcceptanceResult(chi2, p, int(zz.size), tuple(z), tuple(obs), tuple(exp), tuple(n))


def validate_whitebox(samples: pd.DataFrame) -> tuple[bool, bool, bool]:
    """Check the ``wb_*`` columns present; return (has PIT columns, has A columns, has overlap).

    NaN means "not computed" (e.g. an arm that was not teacher-forced) and is allowed here;
    ``whitebox_tests`` skips an arm whose values are all NaN and rejects a partly-NaN arm.
    Raises ``InputError`` naming the column and the first bad value.
    """
    has_pit = sc.WB_P in samples.columns and sc.WB_CDF_LO in samples.columns
    has_a = sc.WB_P_A in samples.columns and sc.WB_IN_A in samples.columns
    has_overlap = sc.WB_OVERLAP in samples.columns
    roles.check_probabilities(samples, (sc.WB_P, sc.WB_CDF_LO, sc.WB_P_A), (sc.WB_CDF_LO, sc.WB_P))
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

# The α split inside the exact white-box family (``weighted_bonferroni``): each test's share,
# fixed before any data, renormalised over the tests that ran; "support" is a hard failure, not
# in it. Why these shares: docs/families.md (pooled), docs/roles.md (with the role tests).
WHITEBOX_WEIGHTS: dict[str, float] = {  # the pooled split (no role tests)
    "directed_z": 0.15,
    "pit_ks": 0.05,
    "pit_cvm": 0.05,
    "pit_ad": 0.65,
    "acceptance": 0.10,
}
ROLE_WEIGHTS: dict[str, float] = {
    "role_pit_accepted": 0.05,
    "role_pit_recovered": 0.05,
    "role_pit_bonus": 0.05,
    "reuse_recovered": 0.05,
    "reuse_bonus": 0.05,
    "acceptance_slots": 0.05,
}
WHITEBOX_ROLE_WEIGHTS: dict[str, float] = {  # with the role tests
    "directed_z": 0.12,
    "pit_ks": 0.05,
    "pit_cvm": 0.05,
    "pit_ad": 0.43,
    "acceptance": 0.05,
    **ROLE_WEIGHTS,
}


def exact_weights(tests: Sequence[str]) -> dict[str, float]:
    """The exact-mode split for one arm's ``tests``: ``WHITEBOX_ROLE_WEIGHTS`` when any role
    test ran, else the pooled split ``WHITEBOX_WEIGHTS`` (every arm without role columns).
    Chosen from which tests ran, never from p-values."""
    return WHITEBOX_ROLE_WEIGHTS if any(t in ROLE_WEIGHTS for t in tests) else WHITEBOX_WEIGHTS


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
    P(∃ i: p_i ≤ w_i·α) ≤ Σ_i w_i·α = α when each p_i is valid and Σ w_i = 1 (Holm 1979;
    Westfall & Young 1993 §2.3). Assumes the weights are fixed before the data (module
    constants; why these: docs/families.md "White-box tests", docs/roles.md).
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


def row(
    arm: str,
    test: str,
    statistic: float,
    pvalue: float,
    n: int,
    detail: str,
    *,
    one_sided: float = float("nan"),
    mde: float = float("nan"),
) -> dict[str, object]:
    """One row of ``whitebox_tests``' table (``WHITEBOX_COLUMNS``)."""
    values = (arm, test, statistic, pvalue, one_sided, n, mde, detail)
    return dict(zip(WHITEBOX_COLUMNS, values, strict=True))


def _pit_rows(
    arm: str,
    sub: pd.DataFrame,
    p: np.ndarray,
    rng: np.random.Generator,
    uniformity: Sequence[str],
) -> list[dict[str, object]]:
    """The support check and the PIT uniformity tests of one arm's rows ``sub`` (``p`` = wb_p)."""
    sup = support_check(p)
    detail = "count of emitted tokens with wb_p == 0"
    rows = [row(arm, "support", float(sup.statistic), sup.pvalue, sup.n, detail)]
    u = pit_values(sub[sc.WB_CDF_LO].to_numpy(dtype=np.float64), p, rng)
    for res in uniformity_tests(u, tests=uniformity):
        rows.append(
            row(
                arm, f"pit_{res.test}", res.statistic, res.pvalue, res.n, "randomized PIT vs U(0,1)"
            )
        )
    return rows


def _role_rows(
    arm: str,
    sub: pd.DataFrame,
    rng: np.random.Generator,
    rounds: pd.DataFrame | None,
    alpha: float,
    slots: Slots | None,
) -> list[dict[str, object]]:
    """The role tests of one arm whose role columns are complete (``sub``: its rows): the
    per-slot acceptance χ² (with rounds and overlaps; ``slots``: its attempted slots) and each
    stratum's PIT and reuse test (``stats.whitebox_roles``); an arm without role columns keeps
    the pooled split (``exact_weights``)."""
    rows: list[dict[str, object]] = []
    if rounds is not None:
        by_slot = acceptance_by_slot(rounds, sub, arm, slots=slots)
        if by_slot.dof > 0:
            rates = ", ".join(
                f"{o:.3f}/{e:.3f}"
                for o, e in zip(by_slot.observed_rate, by_slot.expected_rate, strict=True)
            )
            detail = f"χ²_{by_slot.dof} over slots; rate/Σmin(p,q) by slot: {rates}"
            rows.append(
                row(
                    arm,
                    "acceptance_slots",
                    by_slot.statistic,
                    by_slot.pvalue,
                    int(sum(by_slot.n_attempted)),
                    detail,
                )
            )
    for rp in roles.role_pit_tests(sub, rng):
        # the nominal share: renormalising over the tests that ran can only raise it
        w = alpha * ROLE_WEIGHTS[f"role_pit_{rp.role}"]
        detail = f"{rp.role} tokens: randomized PIT vs U(0,1) under their own law"
        rows.append(
            row(
                arm,
                f"role_pit_{rp.role}",
                rp.uniformity.statistic,
                rp.uniformity.pvalue,
                rp.n,
                detail,
                mde=roles.dkw_resolution(rp.n, w),
            )
        )
        rz = rp.reuse
        if rz is not None:
            side = "above" if rp.role == "bonus" else "below"
            detail = (
                f"{rp.role} tokens wholly {side} r = min(1, p/q) in their CDF "
                f"(never, with a reused acceptance uniform): {rz.observed} "
                f"observed, {rz.expected:.1f} expected; e-value test"
            )
            rows.append(row(arm, f"reuse_{rp.role}", rz.statistic, rz.pvalue, rz.n, detail))
    return rows


def _directed_z_rows(arm: str, sub: pd.DataFrame) -> list[dict[str, object]]:
    """The directed z's row of one arm (``sub``: its rows), none when q is unknown."""
    p_a = sub[sc.WB_P_A].to_numpy(dtype=np.float64)
    if not _complete(p_a, sc.WB_P_A, arm):
        return []
    dz = directed_z(sub[sc.WB_IN_A].fillna(False).to_numpy(dtype=bool), p_a)
    if not np.isfinite(dz.statistic):
        return []
    detail = f"in A: {dz.observed:.1f} observed, {dz.expected:.1f} expected"
    extra = {"one_sided": dz.pvalue_greater, "mde": dz.mde}
    return [row(arm, "directed_z", dz.statistic, dz.pvalue, dz.n, detail, **extra)]


def whitebox_tests(
    samples: pd.DataFrame,
    arms: Sequence[str],
    rng: np.random.Generator,
    *,
    rounds: pd.DataFrame | None = None,
    uniformity: Sequence[str] = ("ks", "cvm", "ad"),
    alpha: float = 0.05,
) -> pd.DataFrame:
    """Every white-box test on every arm in ``arms``: a tidy DataFrame, one row per (arm, test).

    Tests: "support" (always, when wb_p is present), "pit_ks", "pit_cvm", "pit_ad" (wb_p and
    wb_cdf_lo), "directed_z" (wb_p_a, wb_in_a; skipped when q is unknown, i.e. Σ p_A(1 − p_A)
    = 0), "acceptance" (``rounds`` given and wb_overlap finite); with the arm's role columns
    (present and finite: the built-in speculative loop's; never a plain arm) also
    "acceptance_slots" (with rounds), "role_pit_<role>" for each role stratum with tokens and
    "reuse_recovered" / "reuse_bonus" (``role_pit_tests``). Columns: ``WHITEBOX_COLUMNS``;
    ``pvalue_one_sided`` is the directed z's excess-on-A p-value and ``mde`` its minimum
    detectable mean excess per token; a role stratum's ``mde`` is its ``dkw_resolution`` at its
    share of ``alpha`` (the sup-CDF distance from U(0, 1) it resolves; NaN for the others).
    The PIT's V_t come from ``rng``, drawn per arm in table order.
    """
    has_pit, has_a, has_overlap = validate_whitebox(samples)
    has_roles = roles.validate_roles(samples)
    rows: list[dict[str, object]] = []
    for arm in arms:
        sub = samples[samples[sc.ARM] == arm]
        if has_pit:
            p = sub[sc.WB_P].to_numpy(dtype=np.float64)
            if not _complete(p, sc.WB_P, arm):
                continue
            rows += _pit_rows(arm, sub, p, rng, uniformity)
        if has_a:
            rows += _directed_z_rows(arm, sub)
        # the arm's attempted slots, once for both acceptance tests (``sub``: its rows only)
        slots = _attempted_slots(rounds, sub, arm) if has_overlap and rounds is not None else None
        if slots is not None:
            acc = acceptance_test(rounds, sub, arm, slots=slots)
            if acc.n_attempted > 0 and not np.isnan(acc.statistic):
                detail = f"rate {acc.observed_rate:.4f} vs Σmin(p,q) {acc.expected_rate:.4f}"
                rows.append(
                    row(arm, "acceptance", acc.statistic, acc.pvalue, acc.n_attempted, detail)
                )
        roles_here = has_roles and _complete(
            sub[sc.WB_ROLE_P].to_numpy(dtype=np.float64), sc.WB_ROLE_P, arm
        )
        if roles_here:
            rows += _role_rows(arm, sub, rng, rounds if has_overlap else None, alpha, slots)
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in WHITEBOX_COLUMNS})
    return pd.DataFrame(rows, columns=WHITEBOX_COLUMNS)
