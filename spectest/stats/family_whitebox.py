"""The white-box family (``WhiteboxFamily``): the emitted tokens against the target law p_t
recorded beside them (the wb_* columns), on both arms, in two modes — 'exact' (one-sample tests,
``stats.whitebox``) and 'teacher' (two-sample tests and the tolerance control,
``stats.whitebox_two_sample``). The reference arm is the control: a rejection there means
spectest's own p_t is wrong. Knows no other family, files or torch. docs/statistics.md
("White-box exact tests").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema as sc
from spectest.stats import whitebox, whitebox_two_sample
from spectest.stats.families import FamilyInputs, FamilyResult, empty_frame, failures
from spectest.stats.options import AnalysisOptions

# teacher mode's recommended reference size, × the candidate's (``_reference_size_note``); why
# 16: docs/statistics.md ("White-box tests under a teacher's numerics")
REFERENCE_MULTIPLIER = 16
WHITEBOX_TABLE = [*whitebox.WHITEBOX_COLUMNS, "p_adj", "reject"]


@dataclass(frozen=True)
class WhiteboxResult(FamilyResult):
    """The white-box family's result; ``resolution`` is the candidate's directed-z MDE (mean
    excess mass on {q > p} per token), ``support_violation`` that the candidate emitted a token
    with target probability 0 (exact mode only: a teacher-forced p = 0 can be numerics), and
    ``control_failed`` that a test of the reference arm rejected."""

    support_violation: bool = False

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "directed_z_mde": self.resolution,
            "support_violation": self.support_violation,
            "whitebox_control_failed": self.control_failed,
        }


class WhiteboxFamily:
    """Exact mode: PIT (KS, CvM, AD), directed z, acceptance and support of each arm; teacher
    mode: their two-sample versions and the tolerance control (``options.whitebox_mode``)."""

    name = "whitebox"
    label = "white-box"

    def active(self, inputs: FamilyInputs) -> bool:
        s = inputs.samples
        has_pit = sc.WB_P in s.columns and sc.WB_CDF_LO in s.columns
        # active when the candidate's p_t were computed (not all NaN)
        return bool(
            inputs.options.whitebox
            and has_pit
            and s.loc[s[sc.ARM] == inputs.candidate, sc.WB_P].notna().any()
        )

    def run(self, inputs: FamilyInputs, alpha: float) -> WhiteboxResult:
        opts = inputs.options
        teacher = opts.whitebox_mode == "teacher"
        args = (inputs.samples, inputs.reference, inputs.candidate)
        if alpha == 0:
            wb = empty_frame(WHITEBOX_TABLE)
        elif teacher:
            wb = teacher_whitebox_frame(*args, inputs.pit_rng, alpha, opts)
        else:
            wb = exact_whitebox_frame(*args, inputs.rounds, inputs.pit_rng, alpha)
        cand = wb[wb["arm"] == inputs.candidate] if len(wb) else wb
        ref = wb[wb["arm"] == inputs.reference] if len(wb) else wb
        support = bool(len(cand) and ((cand["test"] == "support") & (cand["statistic"] > 0)).any())
        dz = "directed_z_2s" if teacher else "directed_z"
        dz_mde = float("nan")
        if len(cand) and (cand["test"] == dz).any():
            dz_mde = float(cand.loc[cand["test"] == dz, "mde"].iloc[0])
        tested = cand["pvalue"].astype(float).notna() | (cand["test"] == "support")
        failing = failures(cand, _line, run_level=True)
        return WhiteboxResult.of(
            self,
            alpha,
            wb,
            tested.to_numpy(),
            failing,
            # teacher mode's tests are two-sample (candidate vs reference through one teacher):
            # they see the arms' numerics as the black-box families do (docs/numerics.md)
            exact_rejected=bool(failing) and not teacher,
            resolution=dz_mde,
            resolution_unit="excess mass on {q > p} per token (directed z)" + _role_unit(cand),
            black_box=False,
            control_failed=bool(len(ref) and ref["reject"].astype(bool).any()),
            notes=_teacher_notes(inputs, cand, alpha, dz_mde) if teacher else _role_notes(cand),
            support_violation=support,
        )


def _line(r: Any) -> str:
    if r.test == "support":
        what = f"{int(r.statistic)} emitted token(s) with target probability 0"
    else:
        what = f"p_adj={float(r.p_adj):.3g} ({r.detail})"
    return f"white-box {r.test}: {what}"


def exact_whitebox_frame(
    samples: pd.DataFrame,
    reference: str,
    candidate: str,
    rounds: pd.DataFrame | None,
    rng: np.random.Generator,
    alpha: float,
) -> pd.DataFrame:
    """Exact mode: each arm's one-sample tests, weighted Bonferroni within each arm's family
    (``whitebox.exact_weights``); support violations are hard failures, outside the split."""
    wb = whitebox.whitebox_tests(samples, [reference, candidate], rng, rounds=rounds, alpha=alpha)
    if not len(wb):
        return empty_frame(WHITEBOX_TABLE)
    p = wb["pvalue"].to_numpy(dtype=np.float64)
    is_support = wb["test"].to_numpy() == "support"
    p_adj = p.copy()
    if (~is_support).any():
        p_adj[~is_support] = _weighted_within_arms(wb[~is_support], whitebox.exact_weights)
    wb["p_adj"] = p_adj
    wb["reject"] = np.where(
        is_support, wb["statistic"].to_numpy(dtype=np.float64) > 0, p_adj <= alpha
    )
    return wb


def teacher_whitebox_frame(
    samples: pd.DataFrame,
    reference: str,
    candidate: str,
    rng: np.random.Generator,
    alpha: float,
    opts: AnalysisOptions,
) -> pd.DataFrame:
    """Teacher mode: the reference's tolerance control and the candidate's two-sample tests,
    weighted Bonferroni within each arm's rows (``whitebox_two_sample.TEACHER_WEIGHTS``)."""
    wb = whitebox_two_sample.teacher_whitebox_tests(
        samples,
        reference,
        candidate,
        rng,
        B=opts.whitebox_permutations,
        tolerance=opts.whitebox_tolerance,
    )
    if not len(wb):
        return empty_frame(WHITEBOX_TABLE)
    p_adj = _weighted_within_arms(wb, lambda tests: whitebox_two_sample.TEACHER_WEIGHTS)
    wb["p_adj"] = p_adj
    wb["reject"] = p_adj <= alpha
    return wb


def _weighted_within_arms(
    wb: pd.DataFrame, weights_for: Callable[[Sequence[str]], dict[str, float]]
) -> np.ndarray:
    """Weighted Bonferroni (``whitebox.weighted_bonferroni``) within each arm's rows of ``wb``:
    p_adj per row, in row order; the weights (``weights_for`` the arm's tests) renormalised
    over the tests each arm ran."""
    p_adj = np.ones(len(wb), dtype=np.float64)
    arms = wb["arm"].to_numpy()
    for arm in pd.unique(arms):
        idx = np.flatnonzero(arms == arm)
        rows = wb.iloc[idx]
        tests = rows["test"].tolist()
        p_adj[idx], _ = whitebox.weighted_bonferroni(
            tests, rows["pvalue"].to_numpy(dtype=np.float64), weights_for(tests)
        )
    return p_adj


def _role_pits(cand: pd.DataFrame) -> list[Any]:
    """The candidate's role-stratum PIT rows (none without role tests)."""
    if not len(cand):
        return []
    roles = cand[cand["test"].astype(str).str.startswith("role_pit_")]
    return list(roles.itertuples(index=False))


def _role_unit(cand: pd.DataFrame) -> str:
    """The per-role resolutions for the resolution line ("" without role tests): each role
    stratum's sup-CDF distance resolved at 80 % power (``whitebox_roles.dkw_resolution``)."""
    parts = [
        f"{str(r.test).removeprefix('role_pit_')} {sup_cdf_words(float(r.mde))}"
        for r in _role_pits(cand)
    ]
    return "; by role, sup-CDF distance of the role PIT: " + ", ".join(parts) if parts else ""


def sup_cdf_words(mde: float) -> str:
    """A sup-CDF resolution as printed: a distance of two CDFs is at most 1, so a bound of 1 or
    more (the DKW bound at few tokens: 2.18 at 20 seeds) resolves nothing."""
    if not mde < 1.0:  # NaN too
        return "no resolution (too few tokens)"
    return f"{mde:.3g}"


def _role_notes(cand: pd.DataFrame) -> tuple[str, ...]:
    """Exact mode: the per-role resolutions of the role strata that ran (the sup-CDF distance of
    each stratum's PIT from U(0, 1) resolved at 80 % power, ``whitebox_roles.dkw_resolution``)."""
    parts = [
        f"{str(r.test).removeprefix('role_pit_')} {int(r.n)} tokens, sup-CDF distance "
        f"{sup_cdf_words(float(r.mde))}"
        for r in _role_pits(cand)
    ]
    if not parts:
        return ()
    return (
        "white-box by role (PIT under each role's own law; resolution at 80 % power, DKW "
        "bound): " + "; ".join(parts),
    )


def _teacher_notes(
    inputs: FamilyInputs, cand: pd.DataFrame, alpha: float, dz_mde: float
) -> tuple[str, ...]:
    notes = []
    if len(cand):
        notes.append(_permutation_floor_note(cand, alpha, inputs.options.whitebox_permutations))
    if np.isfinite(dz_mde):
        notes.append(
            _reference_size_note(inputs.samples, inputs.reference, inputs.candidate, dz_mde)
        )
    return tuple(n for n in notes if n)


def _permutation_floor_note(cand_wb: pd.DataFrame, alpha: float, B: int) -> str:
    """Teacher mode: the two-sample tests' permutation p-values cannot go below 1/(B + 1), so a
    test whose α share α_whitebox × w is smaller can never reject; name them and the B that
    would let them ("" when every test can reach its share)."""
    tests = cand_wb["test"].tolist()
    _, w = whitebox.weighted_bonferroni(
        tests, np.ones(len(tests)), whitebox_two_sample.TEACHER_WEIGHTS
    )
    short = [t for t, wi in zip(tests, w, strict=True) if 1.0 / (B + 1) > alpha * wi]
    if not short:
        return ""
    need = int(np.ceil(1.0 / (alpha * float(np.min(w))))) + 1
    return (
        f"teacher mode: with whitebox_permutations = {B} the two-sample p-values cannot reach "
        f"their α share for {', '.join(short)} (α_whitebox {alpha:.3g}); "
        f"whitebox_permutations >= {need} would"
    )


def _reference_size_note(
    samples: pd.DataFrame, reference: str, candidate: str, dz_mde: float
) -> str:
    """Teacher mode's sizing advice: the two-sample directed z's MDE scales as √(1 + n_c/n_r)
    (``power.directed_z_2s_mde``); say what a reference of ``REFERENCE_MULTIPLIER`` × the
    candidate would give when this run's reference is smaller than that ("" otherwise)."""
    n_r = int((samples[sc.ARM] == reference).sum())
    n_c = int((samples[sc.ARM] == candidate).sum())
    if n_r == 0 or n_c == 0 or n_r >= REFERENCE_MULTIPLIER * n_c:
        return ""
    one = dz_mde / np.sqrt(1.0 + n_c / n_r)  # the one-sample MDE at the candidate's size
    at_m = one * np.sqrt(1.0 + 1.0 / REFERENCE_MULTIPLIER)
    return (
        f"teacher mode: the two-sample directed z's MDE is {dz_mde:.3g} with a reference "
        f"{n_r / n_c:.2g} x the candidate; seeds.reference_per_arm = {REFERENCE_MULTIPLIER} x "
        f"per_arm would make it {at_m:.3g} (one-sample: {one:.3g}) and bring the white-box "
        "family's power near that of exact numerics (simulated: 0.74-0.98 of it)"
    )
