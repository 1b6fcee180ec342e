"""White-box statistics by token role (accepted drafts, recovered, bonus: ``ROLE_STRATA``): the
role PITs (``role_pit_tests``), the reused-uniform e-value test (``reuse_test``) and the
resolution of a stratum (``dkw_resolution``). docs/roles.md ("Why each stratum is exact").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from spectest import schema as sc
from spectest.errors import InputError
from spectest.stats.pit import UniformityResult, anderson_darling_uniform, pit_values


@dataclass(frozen=True)
class ReuseResult:
    """Final tokens "beyond" r against their conditional probability π: an e-value test of too
    few (``reuse_test``)."""

    statistic: float  # log E, E = Π(1 + π_t − 1[beyond_t])
    pvalue: float  # min(1, 1/E)
    n: int
    observed: int  # Σ 1[beyond]
    expected: float  # Σ π


@dataclass(frozen=True)
class RolePitResult:
    """One role stratum's randomized PIT against its own law (Anderson–Darling) and, for the
    final tokens, the reused-uniform z (``role_pit_tests``)."""

    role: str
    uniformity: UniformityResult
    n: int
    reuse: ReuseResult | None = None


ROLE_STRATA = ("accepted", "recovered", "bonus")  # schema.ROLES without "plain"


def reuse_test(beyond: np.ndarray, tail: np.ndarray) -> ReuseResult:
    """Too few "beyond" tokens (``beyond`` [n] bool) against their conditional probabilities
    (``tail`` [n] π_t): p = min(1, 1/E) with E = Π_t (1 + π_t − 1[beyond_t]).

    Notes
    -----
    Given G_t (``role_pit_tests``), E[1 + π_t − 1[beyond_t] | G_t] = 1 and every factor is ≥ 0,
    so E is a non-negative martingale of mean 1 and P(E ≥ 1/α) ≤ α (Markov; Ville 1939) however
    the π_t arise. It is the likelihood ratio against "beyond never happens" and says nothing
    against other alternatives (the role PITs do): docs/roles.md ("The reused-uniform test").
    """
    b = np.asarray(beyond, dtype=bool)
    pi = np.asarray(tail, dtype=np.float64)
    assert b.shape == pi.shape and b.ndim == 1
    with np.errstate(divide="ignore"):
        log_e = float(np.sum(np.log(np.clip(1.0 + pi - b, 0.0, None))))
    p = 1.0 if log_e <= 0 else float(math.exp(-log_e))
    return ReuseResult(log_e, p, int(b.shape[0]), int(b.sum()), float(pi.sum()))


def role_pit_tests(sub: pd.DataFrame, rng: np.random.Generator) -> list[RolePitResult]:
    """Randomized PIT of each role stratum of one arm's rows (``wb_role``, ``wb_role_p``,
    ``wb_role_cdf_lo``) against its own law, Anderson–Darling (module docstring: each stratum's
    u are iid U(0, 1) under H0). Strata with no token are left out; the V_t come from ``rng``,
    one draw per stratum in ``ROLE_STRATA`` order.

    Notes
    -----
    The reused-uniform test of the final tokens (``reuse``; needs ``wb_role_beyond`` and
    ``wb_role_tail``, ``engines.teacher.role_columns``): given G_t a token is "beyond"
    r_t = min(1, p/q) with probability π_t under H0 and never with a reused acceptance uniform
    (docs/roles.md, "The reused-uniform test"); ``reuse_test`` tests too few of them. Not
    randomised: no V_t is drawn.
    """
    role = sub[sc.WB_ROLE].to_numpy(dtype=object)
    has_tail = sc.WB_ROLE_TAIL in sub.columns and sc.WB_ROLE_BEYOND in sub.columns
    out = []
    for name in ROLE_STRATA:
        at = role == name
        if not at.any():
            continue
        u = pit_values(
            sub.loc[at, sc.WB_ROLE_CDF_LO].to_numpy(dtype=np.float64),
            sub.loc[at, sc.WB_ROLE_P].to_numpy(dtype=np.float64),
            rng,
        )
        reuse = None
        if has_tail and name != "accepted":
            tail = sub.loc[at, sc.WB_ROLE_TAIL].to_numpy(dtype=np.float64)
            beyond = sub.loc[at, sc.WB_ROLE_BEYOND].fillna(False).to_numpy(dtype=bool)
            ok = np.isfinite(tail)
            if ok.any():
                reuse = reuse_test(beyond[ok], tail[ok])
        out.append(RolePitResult(name, anderson_darling_uniform(u), int(at.sum()), reuse))
    return out


def dkw_resolution(n: int, alpha: float, power: float = 0.8) -> float:
    """The sup-CDF distance a KS test of n uniforms at level α detects with probability ≥
    ``power``, guaranteed by the Dvoretzky–Kiefer–Wolfowitz bound P(sup|F_n − F| > ε) ≤
    2·exp(−2nε²) (Massart 1990): √(ln(2/α)/2n) + √(ln(2/(1 − power))/2n). Conservative (a
    bound, not the exact KS power); NaN for n = 0."""
    if n <= 0 or not alpha > 0:
        return float("nan")
    return math.sqrt(math.log(2.0 / alpha) / (2 * n)) + math.sqrt(
        math.log(2.0 / (1.0 - power)) / (2 * n)
    )


def validate_roles(samples: pd.DataFrame) -> bool:
    """Check the role columns (``schema.ROLE_COLUMNS``) when present; True when all are.

    ``wb_role`` must be a name of ``schema.ROLES`` (or null: not recorded), ``wb_role_p`` and
    ``wb_role_cdf_lo`` (and ``wb_role_ratio``, ``wb_role_tail``) in [0, 1] or NaN, the first two
    with a sum ≤ 1. Raises ``InputError`` naming the column and the first bad value."""
    if not all(c in samples.columns for c in sc.ROLE_COLUMNS):
        return False
    role = samples[sc.WB_ROLE]
    bad_role = role.notna() & ~role.isin(sc.ROLES)
    if bad_role.any():
        raise InputError(
            f"samples: column {sc.WB_ROLE!r} must be one of {list(sc.ROLES)!r}, "
            f"got {role[bad_role].iloc[0]!r}"
        )
    cols = (sc.WB_ROLE_P, sc.WB_ROLE_CDF_LO, sc.WB_ROLE_RATIO, sc.WB_ROLE_TAIL)
    check_probabilities(samples, cols, (sc.WB_ROLE_CDF_LO, sc.WB_ROLE_P))
    return True


def check_probabilities(
    samples: pd.DataFrame, columns: Sequence[str], pair: tuple[str, str] | None = None
) -> None:
    """``InputError`` naming the column and the first bad value unless each of ``columns``
    present lies in [0, 1] or NaN, and the two columns of ``pair``, when present, sum to ≤ 1."""
    for col in (c for c in columns if c in samples.columns):
        v = samples[col].to_numpy(dtype=np.float64)
        bad = np.isinf(v) | (v < 0.0) | (v > 1.0 + 1e-9)
        if bad.any():
            raise InputError(
                f"samples: column {col!r} must be in [0, 1] (or NaN), got {v[bad][0]!r}"
            )
    if pair is None or not all(c in samples.columns for c in pair):
        return
    total = samples[pair[0]].to_numpy(dtype=np.float64) + samples[pair[1]].to_numpy(np.float64)
    if (total > 1.0 + 1e-6).any():
        raise InputError(
            f"samples: {pair[0]} + {pair[1]} must be <= 1, got {total[total > 1 + 1e-6][0]!r}"
        )
