"""White-box tests on the probabilities an engine reports (``spectest reported-p``): the support
check and the randomised PIT's uniformity, conditional on the reported p, and the tolerance
cross-check with spectest's teacher-forced p_t → ``ReportedResult``; the PIT interval of a top-n
list (``pit_interval``). Torch-free; knows no engines or files. docs/engines-reported-p.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np
import pandas as pd
from scipy import stats

from spectest.stats.families import Failure, FamilyResult
from spectest.stats.pit import pit_values

NAME, LABEL = "reported", "reported-p (white-box)"  # ``family_reported.ReportedFamily``'s too
CONDITIONAL = "conditional on the engine's reported p"
DEFAULT_ALPHA = 0.01
DEFAULT_TOL = 1e-3  # per-step TV tolerated between the reported and the teacher's law
DEFAULT_MAX_FRACTION = 0.01  # tokens beyond ``tol`` allowed before the cross-check fails


@dataclass(frozen=True)
class ReportedTest:
    """One check of the reported-p family: ``passed`` is the decision at its share of α (or
    the tolerance, for the cross-check); ``statistic`` the KS D, the CvM W², the zero-p count
    or the flagged fraction."""

    test: str
    statistic: float
    pvalue: float  # NaN for the support check and the cross-check (not tests)
    n: int
    passed: bool
    detail: str


TABLE = [f.name for f in fields(ReportedTest)]


@dataclass(frozen=True)
class ReportedResult(FamilyResult):
    """The family's result (``reported_family``): a ``FamilyResult`` at the audit's ``alpha``,
    its checks in ``tests`` (the table's rows); ``ok`` when every one passed; ``exit_code``
    0 or 1."""

    tests: tuple[ReportedTest, ...] = ()

    @classmethod
    def of_tests(cls, tests: list[ReportedTest], alpha: float) -> ReportedResult:
        """The result of ``tests`` at level ``alpha``: the cross-check is a tolerance, not a
        test, so it does not count as tested."""
        failing = tuple(
            Failure(0.0 if np.isnan(t.pvalue) else t.pvalue, f"{t.test}: {t.detail}")
            for t in tests
            if not t.passed
        )
        tested = [t.test != "crosscheck_teacher" for t in tests]
        return cls(
            name=NAME,
            label=LABEL,
            alpha=alpha,
            table=pd.DataFrame([asdict(t) for t in tests], columns=TABLE),
            rejected=bool(failing),
            n_tested=sum(tested),
            n_untestable=0,
            failing=failing,
            black_box=False,
            tests=tuple(tests),
        )

    @property
    def ok(self) -> bool:
        return not self.rejected

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(t.test for t in self.tests if not t.passed)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def lines(self) -> list[str]:
        head = "PASS" if self.ok else "FAIL (" + ", ".join(self.failed) + ")"
        out = [f"reported-p family, {CONDITIONAL}: {head}"]
        for t in self.tests:
            p = "" if np.isnan(t.pvalue) else f" p={t.pvalue:.3g}"
            mark = "ok  " if t.passed else "FAIL"
            out.append(f"  {mark} {t.test}: {t.statistic:.4g}{p} n={t.n} — {t.detail}")
        return out


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


def support_test(p: np.ndarray) -> ReportedTest:
    """A token the engine reports probability 0 for cannot have been drawn from its law."""
    zeros = int((np.asarray(p) <= 0.0).sum())
    return ReportedTest(
        "support_reported",
        float(zeros),
        float("nan"),
        len(p),
        zeros == 0,
        f"{zeros} emitted tokens the engine gave p = 0",
    )


def pit_tests(
    p: np.ndarray, cdf_lo: np.ndarray, rng: np.random.Generator, alpha: float = DEFAULT_ALPHA
) -> list[ReportedTest]:
    """KS and Cramér–von Mises of the reported PIT against U(0, 1), each at α/2."""
    u = pit_values(cdf_lo, p, rng)
    out = []
    for name, res in (
        ("pit_ks_reported", stats.kstest(u, "uniform")),
        ("pit_cvm_reported", stats.cramervonmises(u, "uniform")),
    ):
        pv = float(res.pvalue)
        out.append(
            ReportedTest(
                name,
                float(res.statistic),
                pv,
                len(u),
                pv > alpha / 2,
                f"uniformity of the PIT at α/2 = {alpha / 2:g}, {CONDITIONAL}",
            )
        )
    return out


def crosscheck(
    p: np.ndarray,
    cdf_lo: np.ndarray,
    p_teacher: np.ndarray,
    lo_teacher: np.ndarray,
    tol: float = DEFAULT_TOL,
    max_fraction: float = DEFAULT_MAX_FRACTION,
) -> ReportedTest:
    """The reported (p, cdf_lo) against the teacher's, token by token: fails when more than
    ``max_fraction`` of the tokens differ by more than ``tol`` (module Notes). ``cdf_lo`` NaN
    (not reported) compares p alone."""
    d = np.abs(np.asarray(p) - np.asarray(p_teacher))  # [n]
    d_lo = np.abs(np.asarray(cdf_lo) - np.asarray(lo_teacher))
    d = np.where(np.isnan(d_lo), d, np.maximum(d, d_lo))
    flagged = int((d > tol).sum())
    frac = flagged / max(len(d), 1)
    worst = int(np.argmax(d)) if len(d) else 0
    detail = (
        f"{flagged} tokens differ from the teacher's p_t by > {tol:g} (allowed "
        f"{max_fraction:g} of them); max |Δ| {float(d.max()) if len(d) else 0.0:.3g} at token "
        f"{worst} (reported p {float(np.asarray(p)[worst]) if len(d) else 0.0:.4g}, teacher "
        f"{float(np.asarray(p_teacher)[worst]) if len(d) else 0.0:.4g})"
    )
    return ReportedTest(
        "crosscheck_teacher", frac, float("nan"), len(d), frac <= max_fraction, detail
    )


def reported_family(
    p: np.ndarray,
    cdf_lo: np.ndarray,
    rng: np.random.Generator,
    *,
    teacher: tuple[np.ndarray, np.ndarray] | None = None,
    alpha: float = DEFAULT_ALPHA,
    tol: float = DEFAULT_TOL,
    max_fraction: float = DEFAULT_MAX_FRACTION,
) -> ReportedResult:
    """The family on [n] emitted tokens: support; the PIT tests where every ``cdf_lo`` was
    reported (with p alone no PIT is exact: only support and the cross-check run); the
    cross-check where a teacher's (p_t, cdf_lo_t) is given."""
    p, cdf_lo = np.asarray(p, np.float64), np.asarray(cdf_lo, np.float64)
    tests = [support_test(p)]
    if len(p) and not np.isnan(cdf_lo).any():
        tests += pit_tests(p, cdf_lo, rng, alpha)
    if teacher is not None:
        tests.append(crosscheck(p, cdf_lo, teacher[0], teacher[1], tol, max_fraction))
    return ReportedResult.of_tests(tests, alpha)
