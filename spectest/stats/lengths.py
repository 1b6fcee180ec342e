"""Sequence length is part of the law: per cell, a pooled two-sample χ² on the two arms'
histograms of present positions per sequence (``length_tests``), BH over cells (``adjust``), and
the family that runs them (``LengthsFamily``: active only when some cell's length table is
testable, so full-length runs spend no α on it). Knows no files or other families.
docs/families.md ("Why lengths are a family of their own").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from spectest import schema as sc
from spectest.stats import homogeneity, multiplicity, power
from spectest.stats.families import FamilyInputs, FamilyResult, failures
from spectest.stats.histograms import MISSING, EncodedSamples

LENGTH_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    *homogeneity.CHI2_COLUMNS,
    "mean_len_ref",
    "mean_len_cand",
    "short_ref",  # sequences shorter than the table's longest (n_positions)
    "short_cand",
    "mde_tv",
    "status",
]


def sequence_lengths(tokens: np.ndarray) -> np.ndarray:
    """Present positions of each sequence: [S] int64 (``MISSING`` entries do not count).

    With no gaps this is 1 + the last position; with gaps it counts the positions present, so
    a missing position in the middle shortens the sequence too.
    """
    assert tokens.ndim == 2, tokens.shape  # [S, T]
    return (tokens != MISSING).sum(axis=1).astype(np.int64)


def length_tests(enc: EncodedSamples, min_expected: float = 5.0) -> pd.DataFrame:
    """One pooled two-sample χ² per cell on the histogram of sequence lengths (0..T).

    Parameters
    ----------
    enc : the two arms encoded by ``histograms.encode_samples`` (arm 0 = reference).
    min_expected : the pooling threshold of ``homogeneity.pooled_chi2``.

    Returns the ``LENGTH_COLUMNS`` frame without multiplicity (``p_adj`` NaN, ``reject`` False,
    ``mde_tv`` NaN): ``adjust`` fills those once the family's α is known.

    Notes
    -----
    Each sequence contributes one length; sequences are iid within an arm, so the pooled
    Pearson χ² is valid under the same rule as the token tests (smaller expected count ≥
    ``min_expected`` per bin, ``homogeneity`` module docstring). A cell whose sequences all
    have one length in both arms has a single bin: untestable, never a pass.
    """
    n_pos = enc.n_positions
    lengths = sequence_lengths(enc.tokens)  # [S]
    rows = []
    for c in range(enc.n_cells):
        lo, hi = int(enc.cell_start[c]), int(enc.cell_start[c + 1])
        arm = enc.seq_arm[lo:hi]  # [n_c]
        ln = lengths[lo:hi]
        ref = np.bincount(ln[arm == 0], minlength=n_pos + 1)  # [T+1]
        cand = np.bincount(ln[arm == 1], minlength=n_pos + 1)
        res = homogeneity.pooled_chi2(ref, cand, min_expected=min_expected)
        rows.append(
            {
                sc.PROMPT_ID: enc.cells.iloc[c][sc.PROMPT_ID],
                sc.CONFIG_ID: enc.cells.iloc[c][sc.CONFIG_ID],
                "statistic": res.statistic,
                "pvalue": res.pvalue,
                "p_adj": np.nan,
                "reject": False,
                "dof": res.dof,
                "n_ref": res.n_ref,
                "n_cand": res.n_cand,
                "n_bins": res.n_bins,
                "mean_len_ref": float(ln[arm == 0].mean()) if res.n_ref else np.nan,
                "mean_len_cand": float(ln[arm == 1].mean()) if res.n_cand else np.nan,
                "short_ref": int((ln[arm == 0] < n_pos).sum()),
                "short_cand": int((ln[arm == 1] < n_pos).sum()),
                "mde_tv": np.nan,
                "status": res.status,
            }
        )
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in LENGTH_COLUMNS})
    return pd.DataFrame(rows, columns=LENGTH_COLUMNS)


def is_active(df: pd.DataFrame) -> bool:
    """The family takes a share of α when some cell's length table is testable (docstring)."""
    return bool(len(df) and (df["status"] == homogeneity.OK).any())


def adjust(df: pd.DataFrame, alpha: float, test_power: float = 0.8) -> pd.DataFrame:
    """BH over the testable cells at the family's ``alpha``; each test's MDE (TV of the binned
    length law) at the per-test level a lone bad cell faces, α/m (as the token cells)."""
    out = df.copy()
    ok = (out["status"] == homogeneity.OK).to_numpy()
    m = int(ok.sum())
    if m == 0:
        return out
    res = multiplicity.adjust(out["pvalue"].to_numpy(dtype=np.float64), "bh", alpha)
    out["p_adj"] = res.pvalue_adjusted
    out["reject"] = res.reject & ok
    mde = power.mde_tv(out["n_ref"], out["n_cand"], out["dof"], alpha / m, test_power)
    out["mde_tv"] = np.where(ok, mde, np.nan)
    return out


class LengthsFamily:
    """Sequences that stop early are a different law, not "untestable" positions."""

    name = "lengths"
    label = "sequence lengths"

    def active(self, inputs: FamilyInputs) -> bool:
        return is_active(length_tests(inputs.enc, inputs.options.min_expected))

    def run(self, inputs: FamilyInputs, alpha: float) -> FamilyResult:
        df = length_tests(inputs.enc, inputs.options.min_expected)
        if alpha > 0:
            df = adjust(df, alpha, inputs.options.power)
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
