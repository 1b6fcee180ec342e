"""The reported-p family: claim (a) for an engine spectest cannot see inside, from the
probabilities it reports for the tokens it emits (``schema.REPORTED_COLUMNS``): support and the
randomised PIT's uniformity, conditional on the reported law (exact at any numerics), and the
tolerance cross-check with spectest's teacher-forced p_t. Owns the audit of ``spectest
reported-p`` (``reported_family`` → ``ReportedResult``) and the family inside every analysis
(``ReportedFamily``: per arm that reported, with per-round-slot KS under a weighted Bonferroni,
``WEIGHTS``; its readout lines: ``stats.reported_lines``). Torch-free; knows no engines, files
or other families. docs/engines-reported-p.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.stats.families import Failure, FamilyInputs, FamilyResult, empty_frame
from spectest.stats.pit import pit_interval, pit_values
from spectest.stats.reported_lines import notes, unresolved_why, verdict_line

NAME, LABEL = "reported", "reported-p (white-box)"
CONDITIONAL = "conditional on the engine's reported p"
DEFAULT_ALPHA = 0.01
DEFAULT_TOL = 1e-3  # per-step TV tolerated between the reported and the teacher's law
DEFAULT_MAX_FRACTION = 0.01  # tokens beyond ``tol`` allowed before the cross-check fails
TABLE = ["arm", "test", "statistic", "pvalue", "n", "detail", "p_adj", "reject"]
# the α split within one arm's tests, fixed before any data; renormalised over those that ran.
# "slot" is shared equally by the round slots that ran.
WEIGHTS = {"pit_ks_reported": 0.3, "pit_cvm_reported": 0.3, "slot": 0.4}
MIN_SLOT_TOKENS = 20  # a round slot with fewer PIT values is not tested (KS on a handful)
FLOOR_QUANTILE_FACTOR = 10  # the floor: the reference's (1 − max_fraction / 10) quantile of d_t


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


AUDIT_COLUMNS = [f.name for f in fields(ReportedTest)]


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
            table=pd.DataFrame([asdict(t) for t in tests], columns=AUDIT_COLUMNS),
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


@dataclass(frozen=True)
class ReportedFamilyResult(FamilyResult):
    """The family's result; ``numbers`` its run-level readouts for summary.json (tokens reported
    and tested, the mass outside a top-n list, the cross-check's tolerance and fractions)."""

    numbers: tuple[tuple[str, Any], ...] = ()

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), **dict(self.numbers)}


class ReportedFamily:
    """Support and PIT conditional on the engine's reported law (by round slot where rounds tile
    the sequences) and the approximate cross-check with the teacher (module docstring)."""

    name = NAME
    label = LABEL

    def active(self, inputs: FamilyInputs) -> bool:
        s = inputs.samples
        if sc.REP_P not in s.columns:
            return False
        return bool(_stated(s[s[sc.ARM] == inputs.candidate]).any())

    def run(self, inputs: FamilyInputs, alpha: float) -> ReportedFamilyResult:
        s = inputs.samples
        if alpha == 0 or sc.REP_P not in s.columns:
            return ReportedFamilyResult.of(self, alpha, empty_frame(TABLE), np.zeros(0))
        ref = s[s[sc.ARM] == inputs.reference]
        cand = s[s[sc.ARM] == inputs.candidate]
        tol, floor = crosscheck_tol(ref)
        rows: list[dict[str, Any]] = []
        numbers: dict[str, Any] = {"reported_crosscheck_tol": tol}
        for arm, df in ((inputs.reference, ref), (inputs.candidate, cand)):
            if not _stated(df).any():
                continue
            arm_rounds = _arm_rounds(inputs.all_rounds, arm)
            rows += arm_tests(
                df, arm_rounds, inputs.pit_rng, alpha, tol, arm, arm == inputs.reference
            )
            numbers.update(_numbers(df, "reference" if arm == inputs.reference else "candidate"))
        table = pd.DataFrame(rows, columns=TABLE) if rows else empty_frame(TABLE)
        mine = table[table["arm"] == inputs.candidate]
        control = table[table["arm"] == inputs.reference]
        failing = tuple(_failure(r) for r in mine.itertuples(index=False) if r.reject)
        tested = mine["test"].ne("crosscheck_teacher").to_numpy()
        return ReportedFamilyResult.of(
            self,
            alpha,
            table,
            tested,
            failing,
            black_box=False,
            exact_rejected=bool((mine["reject"].astype(bool) & tested).any()),
            control_failed=bool(control["reject"].astype(bool).any()),
            verdict_line=verdict_line(mine, failing, numbers),
            unresolved=unresolved_why(numbers, inputs.options.left_out_max),
            notes=notes(numbers, tol, floor),
            numbers=tuple(numbers.items()),
        )


def crosscheck_tol(ref: pd.DataFrame) -> tuple[float, float]:
    """The cross-check's tolerance on d_t = |reported p − teacher p_t|: ``DEFAULT_TOL``
    or, when the reference arm reports too, its (1 − max_fraction / 10) quantile of d_t (the
    measured floor: the numerics between this engine and spectest's teacher), whichever is
    larger. Returns (tol, floor; NaN when not measured)."""
    d = _discrepancy(ref)
    if len(d) == 0:
        return DEFAULT_TOL, float("nan")
    q = 1.0 - DEFAULT_MAX_FRACTION / FLOOR_QUANTILE_FACTOR
    floor = float(np.quantile(d, q))
    return max(DEFAULT_TOL, floor), floor


def _discrepancy(df: pd.DataFrame) -> np.ndarray:
    if sc.WB_P not in df.columns or sc.REP_P not in df.columns:
        return np.zeros(0)
    p, t = df[sc.REP_P].to_numpy(np.float64), df[sc.WB_P].to_numpy(np.float64)
    ok = np.isfinite(p) & np.isfinite(t)
    return np.abs(p[ok] - t[ok])


def arm_tests(
    df: pd.DataFrame,
    rounds: pd.DataFrame | None,
    rng: np.random.Generator,
    alpha: float,
    tol: float,
    arm: str,
    is_reference: bool,
) -> list[dict[str, Any]]:
    """One arm's rows: support, the pooled PIT (KS, CvM), the round-slot KS strata, weighted
    Bonferroni among the PIT tests (``WEIGHTS``), and the cross-check (the reference's is the
    floor, reported only)."""
    rep, u = reported_pit(df, rng)
    p = rep[sc.REP_P].to_numpy(np.float64)
    sup = support_test(p)
    out = [_row(arm, sup.test, sup.statistic, np.nan, sup.n, sup.detail, np.nan, not sup.passed)]
    if u is not None:
        tests = [
            ("pit_ks_reported", stats.kstest(u, "uniform"), len(u), "pooled"),
            ("pit_cvm_reported", stats.cramervonmises(u, "uniform"), len(u), "pooled"),
        ]
        slots = slot_of(rep, rounds)
        if slots is not None:
            for j in np.unique(slots[slots >= 0]):
                uj = u[slots == j]
                if len(uj) >= MIN_SLOT_TOKENS:
                    tests.append(
                        (f"slot_{int(j)}", stats.kstest(uj, "uniform"), len(uj), "round slot")
                    )
        n_slot = sum(1 for t in tests if t[0].startswith("slot_"))
        w = {t[0]: WEIGHTS.get(t[0], WEIGHTS["slot"] / max(n_slot, 1)) for t in tests}
        total = sum(w.values())
        for name, res, n, what in tests:
            pv = float(res.pvalue)
            p_adj = min(1.0, pv * total / w[name])
            detail = f"uniformity of the PIT ({what}), {CONDITIONAL}"
            out.append(_row(arm, name, float(res.statistic), pv, n, detail, p_adj, p_adj <= alpha))
    d = _discrepancy(df)
    if len(d):
        frac = float((d > tol).mean())
        fails = frac > DEFAULT_MAX_FRACTION and not is_reference
        what = "the floor (reported only)" if is_reference else "approximate, not a test"
        detail = (
            f"{frac:.3%} of tokens differ from the teacher's p_t by > {tol:.3g} (allowed "
            f"{DEFAULT_MAX_FRACTION:g}); max {float(d.max()):.3g}; {what}"
        )
        out.append(_row(arm, "crosscheck_teacher", frac, np.nan, len(d), detail, np.nan, fails))
    return out


def reported_pit(
    df: pd.DataFrame, rng: np.random.Generator
) -> tuple[pd.DataFrame, np.ndarray | None]:
    """One arm's reported rows and their randomised PIT u (None when some reported row has no
    PIT interval: ``pit_interval``): [rows] → (rep [n rows], u [n]). One V per row of ``df``,
    reported or not, in table order: a row that moves in or out of the reported set (numerics)
    changes no other row's u (docs/engines-reported-p.md)."""
    reported = df[sc.REP_P].notna().to_numpy()  # [rows]
    v = rng.random(len(df))  # [rows]
    rep = df[reported]
    mass = rep[sc.REP_MASS].to_numpy(np.float64) if sc.REP_MASS in rep.columns else None
    lo, width, ok = pit_interval(
        rep[sc.REP_P].to_numpy(np.float64),
        rep[sc.REP_CDF_LO].to_numpy(np.float64),
        np.full(len(rep), np.nan) if mass is None else mass,
    )
    if not len(rep) or not ok.all():
        return rep, None
    return rep, lo + v[reported] * width  # [n]


def slot_of(rep: pd.DataFrame, rounds: pd.DataFrame | None) -> np.ndarray | None:
    """Each token's slot in its reported round (0 = a round's first token), or None when the
    arm's rounds do not tile its sequences round by round (none, or totals per sequence: a
    readout such as llama.cpp's ``draft_n``). The slot of a token is decided before it is drawn
    (by the rounds before it and the previous token's role), so each slot's PIT values are iid
    U(0, 1) under the reported law (docs/engines-reported-p.md)."""
    if rounds is None or not len(rounds):
        return None
    r = rounds
    if ((r["emitted"] > r["accepted"] + 1) | (r["accepted"] > r["drafted"])).any():
        return None
    key = [sc.PROMPT_ID, sc.CONFIG_ID, sc.SEED]
    starts = r[[*key, sc.POSITION]].rename(columns={sc.POSITION: "_start"})
    ends = (r[sc.POSITION] + r["emitted"]).to_numpy()
    tokens = rep[[*key, sc.POSITION]].reset_index(drop=True)
    tokens["_i"] = np.arange(len(tokens))
    merged = pd.merge_asof(
        tokens.sort_values(sc.POSITION),
        starts.assign(_end=ends).sort_values("_start"),
        left_on=sc.POSITION,
        right_on="_start",
        by=key,
        direction="backward",
    )
    inside = merged[sc.POSITION] < merged["_end"]
    if merged["_start"].isna().any() or not inside.all():
        return None  # a token no round covers: not a tiling
    out = np.empty(len(tokens), dtype=np.int64)
    out[merged["_i"].to_numpy()] = (merged[sc.POSITION] - merged["_start"]).to_numpy(np.int64)
    return out


def _stated(df: pd.DataFrame) -> pd.Series:
    """The tokens the engine said something about: a p, or a list that left the token out."""
    mass = df[sc.REP_MASS].notna() if sc.REP_MASS in df.columns else False
    return df[sc.REP_P].notna() | mass


def _arm_rounds(rounds: pd.DataFrame | None, arm: str) -> pd.DataFrame | None:
    if rounds is None or not len(rounds) or sc.ARM not in rounds.columns:
        return None
    r = rounds[rounds[sc.ARM] == arm]
    return r if len(r) else None


def _row(
    arm: str, test: str, stat: float, pv: float, n: int, detail: str, p_adj: float, reject: bool
) -> dict[str, Any]:
    values = (arm, test, float(stat), float(pv), int(n), detail, float(p_adj), bool(reject))
    return dict(zip(TABLE, values, strict=True))


def _numbers(df: pd.DataFrame, who: str) -> dict[str, Any]:
    """Tokens reported, and the mass outside the reported top-n lists (mean over the tokens
    whose list mass was stated; the fraction of tokens that fell outside their list)."""
    p = df[sc.REP_P].to_numpy(np.float64)
    m = (
        df[sc.REP_MASS].to_numpy(np.float64)
        if sc.REP_MASS in df.columns
        else np.full(len(p), np.nan)
    )
    lo = df[sc.REP_CDF_LO].to_numpy(np.float64)
    listed = np.isfinite(p) & np.isfinite(m)
    outside = listed & ~np.isfinite(lo)
    left = int((~np.isfinite(p) & np.isfinite(m)).sum())  # a list that does not fix the law
    d = _discrepancy(df)
    return {
        f"reported_{who}_tokens": len(p),
        f"reported_{who}_tokens_with_p": int(np.isfinite(p).sum()),
        f"reported_{who}_left_out": left,
        f"reported_{who}_left_out_share": left / len(p) if len(p) else 0.0,
        f"reported_{who}_mass_outside_mean": float(np.mean(1.0 - m[listed]))
        if listed.any()
        else None,
        f"reported_{who}_outside_fraction": float(outside.sum() / listed.sum())
        if listed.any()
        else None,
        f"reported_{who}_crosscheck_max": float(d.max()) if len(d) else None,
    }


def _failure(r: Any) -> Failure:
    if r.test == "support_reported":
        return Failure(
            0.0, f"reported-p support: {int(r.statistic)} emitted token(s) the engine gave p = 0"
        )
    if r.test == "crosscheck_teacher":
        return Failure(1.0, f"reported-p crosscheck_teacher (approximate): {r.detail}")
    return Failure(float(r.p_adj), f"reported-p {r.test}: p_adj={float(r.p_adj):.3g} ({r.detail})")
