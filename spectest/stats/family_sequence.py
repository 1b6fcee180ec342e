"""The sequence-level family (``SequenceFamily``): statistics of whole sequences pooled over
every cell, max-T over them, whole-sequence permutations within cells (``stats.sequence``); its
table ``SEQUENCE_COLUMNS`` (sequence.parquet: the pooled rows that decide, then the per-cell rows
that locate). Knows no other family, files or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.stats import sequence
from spectest.stats.families import FamilyInputs, FamilyResult, empty_frame, failures

SEQUENCE_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    "test",
    "scope",
    "statistic",
    "z",
    "pvalue",
    "p_adj",
    "reject",
    "null_mean",
    "null_sd",
    "n_ref",
    "n_cand",
    "mde",
    "unit",
]
ALL_CELLS = "*"  # prompt_id / config_id of the sequence family's pooled rows


@dataclass(frozen=True)
class SequenceResult(FamilyResult):
    """The sequence family's result: ``pvalue`` its max-T permutation p-value over the pooled
    statistics (NaN when it did not run); ``resolution`` that of its first statistic stated in
    TV (``sequence.TV_STATISTICS``; NaN: none), ``resolution_unit`` which law that TV is of."""

    pvalue: float = float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "sequence_pvalue": self.pvalue,
            "sequence_mde": self.resolution,
            "sequence_mde_unit": self.resolution_unit,
        }


class SequenceFamily:
    """Transitions, unigram and per-position χ² sums, Hamming and prefix MMD, pooled over cells
    (``options.sequence_statistics`` of them), max-T over the pooled statistics."""

    name = "sequence"
    label = "sequence-level (pooled over cells)"

    def active(self, inputs: FamilyInputs) -> bool:
        return inputs.options.sequence and inputs.options.null_permutations >= 1

    def run(self, inputs: FamilyInputs, alpha: float) -> SequenceResult:
        opts = inputs.options
        if alpha == 0:
            off = ("sequence family off: it needs null_permutations >= 1",) if opts.sequence else ()
            none = np.zeros(0, dtype=bool)
            return SequenceResult.of(self, 0.0, empty_frame(SEQUENCE_COLUMNS), none, notes=off)
        df, p, mde, unit = _sequence_frame(inputs, alpha)
        pooled = df[df["scope"] == "pooled"]
        # a permutation p-value that cannot reach the level tested nothing
        reach = _can_reach(df, opts.null_permutations, alpha)
        tested = pooled["pvalue"].astype(float).notna().to_numpy() & reach
        failing = failures(df, _line, run_level=True)
        return SequenceResult.of(
            self,
            alpha,
            df,
            tested,
            failing,
            resolution=mde,
            resolution_unit=unit,
            pvalue=p,
            resolution_note=_resolution_note(pooled, opts.null_permutations),
        )


def _line(r: Any) -> str:
    return (
        f"sequence-level {r.test} (pooled over cells) p_adj={float(r.p_adj):.3g} z={float(r.z):.2f}"
    )


def _resolution_note(pooled: pd.DataFrame, B: int) -> str:
    """The line saying that the resolution is estimated from this run's permutation null
    (``sequence.resolution``), so it moves with the data and the B permutations, with its range.

    Notes
    -----
    The range is the permutation noise alone: the MDE scales as √(sd(Z)·sd_cell), both sds
    from the same B permutations, so it moves like one sd estimated from B draws: 95 % interval
    sd·[√((B−1)/χ²_{0.975}), √((B−1)/χ²_{0.025})] (B − 1 df). Another sample of the data is not
    in it.
    """
    tv = pooled[pooled["test"].isin(sequence.TV_STATISTICS)]["mde"].astype(float).dropna()
    if tv.empty or B < 2:
        return ""
    lo_f = float(np.sqrt((B - 1) / stats.chi2.ppf(0.975, B - 1)))
    hi_f = float(np.sqrt((B - 1) / stats.chi2.ppf(0.025, B - 1)))
    first = float(tv.iloc[0])
    return (
        f"estimated from this run's permutation null, so it moves with the data; "
        f"{first * lo_f:.3g}–{first * hi_f:.3g} from the B = {B} permutations alone (95 %)"
    )


def _sequence_frame(inputs: FamilyInputs, alpha: float) -> tuple[pd.DataFrame, float, float, str]:
    """Pooled rows (one per statistic: z, max-T adjusted p, decision, resolution) then per-cell
    rows (diagnostic p-values); the family's p-value, TV resolution and its unit."""
    opts, enc = inputs.options, inputs.enc
    jobs, sizes = [], []
    for c in range(enc.n_cells):
        n = enc.arm_sizes(c)
        if n.min() > 0:
            jobs.append((inputs.cell_tokens(c), inputs.labels[c], opts.min_expected))
            sizes.append(np.array([c, *n]))
    # every cell's statistics under its 1+B labelings ([J, 1+B]), over processes when asked
    cells = inputs.map_cells(_cell_statistics, jobs)
    if not cells:
        return empty_frame(SEQUENCE_COLUMNS), float("nan"), float("nan"), ""
    names = opts.sequence_statistics
    rows = [sequence.STATISTICS.index(n) for n in names]
    res = sequence.combine([c[rows] for c in cells], names)
    sz = np.stack(sizes)  # [C, 3]: cell code, n_ref, n_cand
    mde = sequence.resolution(res, sz[:, 1], sz[:, 2], enc.n_positions, alpha, opts.power)
    df = pd.concat(
        [_pooled_rows(res, sz, mde, alpha), _cell_rows(inputs, res, sz)], ignore_index=True
    )[SEQUENCE_COLUMNS]
    tv = [j for j, n in enumerate(names) if n in sequence.TV_STATISTICS]
    if not tv:
        return df, res.pvalue, float("nan"), ""
    return df, res.pvalue, float(mde[tv[0]]), sequence.UNITS[names[tv[0]]]


def _cell_statistics(tokens: np.ndarray, labels: np.ndarray, min_expected: float) -> np.ndarray:
    """``sequence.cell_statistics`` with positional arguments (picklable for a process pool)."""
    return sequence.cell_statistics(tokens, labels, min_expected=min_expected)


def _pooled_rows(res: Any, sz: np.ndarray, mde: np.ndarray, alpha: float) -> pd.DataFrame:
    return pd.DataFrame(
        {
            sc.PROMPT_ID: ALL_CELLS,
            sc.CONFIG_ID: ALL_CELLS,
            "test": np.array(res.names, dtype=object),
            "scope": "pooled",
            "statistic": res.z,
            "z": res.z,
            "pvalue": res.stat_pvalue,
            "p_adj": res.stat_adjusted,
            "reject": res.stat_adjusted <= alpha,
            "null_mean": 0.0,
            "null_sd": res.z_null_sd,
            "n_ref": int(sz[:, 1].sum()),
            "n_cand": int(sz[:, 2].sum()),
            "mde": mde,
            "unit": [sequence.UNITS[n] for n in res.names],
        }
    )


def _cell_rows(inputs: FamilyInputs, res: Any, sz: np.ndarray) -> pd.DataFrame:
    J, C = len(res.names), sz.shape[0]
    sd = res.cell_null_sd.reshape(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        zc = (res.cell_observed.reshape(-1) - res.cell_null_mean.reshape(-1)) / sd
    return pd.DataFrame(
        {
            **inputs.cell_ids(np.repeat(sz[:, 0], J)),
            "test": np.tile(np.array(res.names, dtype=object), C),
            "scope": "cell",
            "statistic": res.cell_observed.reshape(-1),
            "z": np.where(sd > 0, zc, 0.0),
            "pvalue": res.cell_pvalue.reshape(-1),
            "p_adj": np.nan,
            "reject": False,
            "null_mean": res.cell_null_mean.reshape(-1),
            "null_sd": sd,
            "n_ref": np.repeat(sz[:, 1], J),
            "n_cand": np.repeat(sz[:, 2], J),
            "mde": np.nan,
            "unit": "",
        }
    )


def _can_reach(seq: pd.DataFrame, n_permutations: int, alpha: float) -> bool:
    """Whether the family's permutation p-value can reach its level at all: its smallest
    attainable value is 1/(B + 1), or 1/Π_c C(n_c, n_ref,c) when the cells have fewer distinct
    relabelings than that. At 2 + 2 sequences in one cell (6 relabelings) it cannot: such a
    family ran formally but tested nothing."""
    cells = seq[seq["scope"] == "cell"].drop_duplicates([sc.PROMPT_ID, sc.CONFIG_ID])
    log_labelings = sum(
        math.lgamma(a + b + 1) - math.lgamma(a + 1) - math.lgamma(b + 1)
        for a, b in zip(cells["n_ref"].astype(int), cells["n_cand"].astype(int), strict=True)
    )
    smallest = max(1.0 / (n_permutations + 1), math.exp(-min(log_labelings, 700.0)))
    return smallest <= alpha
