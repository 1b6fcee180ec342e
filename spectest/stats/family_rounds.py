"""The round-aware family (``RoundsFamily``): the token law conditional on reported round
structure and the accepted-length law, candidate against reference (``stats.rounds``). Its tests
are *claims*: they can add a rejection and never count as "a family ran" for a pass, so a
fabricated rounds table cannot make exit 0. Knows no other family, files or torch. docs/rounds.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from spectest import schema as sc
from spectest.stats import homogeneity, rounds
from spectest.stats.families import FamilyInputs, FamilyResult, empty_frame, failures


def _both_arms(inputs: FamilyInputs) -> pd.DataFrame | None:
    """The two arms' round rows when each arm has some, else None (the family is off)."""
    r = inputs.rounds
    if r is None or not len(r) or any(c not in r.columns for c in rounds.ROUNDS_COLUMNS_NEEDED):
        return None
    arms = set(r[sc.ARM].astype(str).unique())
    if inputs.reference not in arms or inputs.candidate not in arms:
        return None
    return r[r[sc.ARM].astype(str).isin([inputs.reference, inputs.candidate])]


class RoundsFamily:
    """Where the engine reports rounds: the law of the bonus token, of the recovered token, of
    the token at each round offset, and of (drafted, accepted), two-sample per cell."""

    name = "rounds"
    label = "round-aware (reported rounds)"

    def _table(self, inputs: FamilyInputs, alpha: float) -> pd.DataFrame:
        r = _both_arms(inputs)
        if r is None or inputs.options.null_permutations < 1:
            return empty_frame(rounds.ROUND_TEST_COLUMNS)
        return rounds.round_tests(
            inputs.enc, r, inputs.labels, alpha if alpha > 0 else 0.5, inputs.options.min_expected
        )

    def active(self, inputs: FamilyInputs) -> bool:
        """Both arms report rounds (a fact of the arms' engines, not of the random labels) and
        some test is testable (its binning reads pooled totals only)."""
        df = self._table(inputs, 0.0)
        return bool(len(df) and (df["status"] == homogeneity.OK).any())

    def run(self, inputs: FamilyInputs, alpha: float) -> FamilyResult:
        df = self._table(inputs, alpha)
        notes: tuple[str, ...] = ()
        if alpha > 0 and len(df) and 1.0 / (inputs.options.null_permutations + 1) > alpha:
            notes = (
                f"round-aware family: B = {inputs.options.null_permutations} permutations "
                f"cannot reach its α share {alpha:.3g} (smallest p 1/(B+1))",
            )
        if alpha <= 0 and len(df):
            df = df.assign(p_adj=float("nan"), reject=False)
        ok = (df["status"] == homogeneity.OK).to_numpy(bool) if len(df) else np.zeros(0, bool)
        return FamilyResult.of(
            self,
            alpha,
            df,
            ok,
            failures(df, _line),
            claims=True,
            notes=notes,
            resolution_unit="TV of a stratum's law (no closed form: permutation-calibrated)",
        )


def _line(x: Any) -> str:
    return (
        f"rounds {x.stratum} {x.prompt_id}/{x.config_id} p_adj={float(x.p_adj):.3g}: "
        f"χ²={float(x.statistic):.1f} on {int(x.dof)} dof, {int(x.n_ref)} (reference) "
        f"vs {int(x.n_cand)} (candidate) entries, as the engines report their rounds"
    )
