"""The sequence-length family: per cell, the two arms' laws of how many positions a sequence has
(``spectest.stats.lengths``: a pooled χ² per cell, BH over the cells).

Owns: ``LengthsFamily`` (active only when some cell's length table is testable, so runs of
full-length sequences spend no α on it), what counts as tested, its resolution (the median MDE in
TV of the length law) and its failing lines. Does not know: the other families, files, torch.
"""

from __future__ import annotations

from typing import Any

from spectest.stats import homogeneity, lengths
from spectest.stats.families import FamilyInputs, FamilyResult, failures


class LengthsFamily:
    """Sequences that stop early are a different law, not "untestable" positions."""

    name = "lengths"
    label = "sequence lengths"

    def active(self, inputs: FamilyInputs) -> bool:
        return lengths.is_active(lengths.length_tests(inputs.enc, inputs.options.min_expected))

    def run(self, inputs: FamilyInputs, alpha: float) -> FamilyResult:
        df = lengths.length_tests(inputs.enc, inputs.options.min_expected)
        if alpha > 0:
            df = lengths.adjust(df, alpha, inputs.options.power)
        ok = df["status"] == homogeneity.OK
        mde = df.loc[ok, "mde_tv"].astype(float).dropna()
        return FamilyResult.of(
            self,
            alpha,
            df,
            ok.to_numpy(),
            failures(df, _line),
            resolution=float(mde.median()) if len(mde) else float("nan"),
            resolution_unit="TV of the length law per cell",
        )


def _line(r: Any) -> str:
    return (
        f"sequence lengths {r.prompt_id}/{r.config_id} p_adj={float(r.p_adj):.3g}: "
        f"mean length {float(r.mean_len_ref):.2f} (reference) vs "
        f"{float(r.mean_len_cand):.2f} (candidate); short sequences "
        f"{int(r.short_ref)}/{int(r.n_ref)} vs {int(r.short_cand)}/{int(r.n_cand)}"
    )
