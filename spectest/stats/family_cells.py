"""The token χ² per cell-position family: per (prompt, config, position) a pooled two-sample χ²,
the plug-in TV against its permutation null, the correction over all cell-positions, each test's
MDE and the testability estimate (``CellFamily``, always active; its table ``CELL_COLUMNS``,
stored as tests.parquet; ``CellsResult``). Knows no other family, files or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.stats import distance, families, homogeneity, multiplicity, power, tables
from spectest.stats.families import FamilyInputs, FamilyResult, empty_frame

CELL_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    sc.POSITION,
    *homogeneity.CHI2_COLUMNS,
    "pooled_tokens",
    "min_expected",
    "tv",
    "tv_null_mean",
    "tv_null_q95",
    "tv_excess",
    "tv_pvalue",
    "mde_tv",
    "status",
    "pvalue_asymptotic",
    "pvalue_permutation",
]


@dataclass(frozen=True)
class CellsResult(FamilyResult):
    """The cell-position family's result; ``resolution`` is the median per-cell MDE in TV.

    ``testability`` (``power.estimate_testability``): the share of cell-positions that were
    testable and the seeds per arm that would make each share of ``options.testable_shares``
    testable at the observed laws (None: not estimable from this run); ``seeds_at_least`` the
    same from the plug-in maximum share, a lower bound.
    """

    mde_tv_max: float = float("nan")
    max_tv_excess: float = float("nan")
    max_tv_excess_at: dict[str, Any] = field(default_factory=dict)  # prompt, config, position
    multiplicity_procedure: str = ""
    testable_share: float = float("nan")
    testability: power.Testability | None = None

    @property
    def n_rejected(self) -> int:
        return len(self.failing)

    @property
    def seeds_for_testable(self) -> dict[str, int | None]:
        """Each share of ``options.testable_shares`` (as a string) → the seeds per arm."""
        t = self.testability
        return {} if t is None else {f"{k:g}": v for k, v in t.seeds_for_share.items()}

    @property
    def seeds_for_testable_at_least(self) -> dict[str, int | None]:
        """The same from the plug-in maximum share: a lower bound."""
        t = self.testability
        return {} if t is None else {f"{k:g}": v for k, v in t.seeds_at_least.items()}

    @property
    def seeds_per_arm_observed(self) -> float:
        return float("nan") if self.testability is None else self.testability.seeds_per_arm

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "n_tested": self.n_tested,
            "n_rejected": self.n_rejected,
            "n_untestable": self.n_untestable,
            "max_tv_excess": self.max_tv_excess,
            "max_tv_excess_at": self.max_tv_excess_at,
            "mde_tv": self.resolution,
            "mde_tv_max": self.mde_tv_max,
            "multiplicity_procedure": self.multiplicity_procedure,
            "testable_share": self.testable_share,
            "seeds_for_testable": self.seeds_for_testable,
            "seeds_for_testable_at_least": self.seeds_for_testable_at_least,
            "seeds_per_arm_observed": self.seeds_per_arm_observed,
        }


class CellFamily:
    """Token χ² per cell-position (``spectest.stats.homogeneity``), corrected over every
    cell-position by ``options.multiplicity``; always active."""

    name = "cells"
    label = "token χ² per cell-position"

    def active(self, inputs: FamilyInputs) -> bool:
        return True

    def run(self, inputs: FamilyInputs, alpha: float) -> CellsResult:
        opts = inputs.options
        parts = [_cell_part(inputs, c) for c in range(inputs.enc.n_cells)]
        cells = _cells_frame(inputs, [p for p, _ in parts])
        testable = cells["status"].to_numpy() == homogeneity.OK
        m = int(testable.sum())
        res = _correct(cells, [s for _, s in parts if s is not None], opts.multiplicity, alpha)
        cells["p_adj"] = res.pvalue_adjusted
        cells["reject"] = res.reject & testable
        # per-test α a lone bad cell faces: BH / max-T ≈ α/m; BY α/(m·H_m)
        harmonic = float(np.sum(1.0 / np.arange(1, m + 1))) if m else 1.0
        alpha_each = alpha / max(m, 1) / (harmonic if opts.multiplicity == "by" else 1.0)
        cells["mde_tv"] = np.where(
            testable,
            power.mde_tv(cells["n_ref"], cells["n_cand"], cells["dof"], alpha_each, opts.power),
            np.nan,
        )
        mde = cells.loc[testable, "mde_tv"].to_numpy(dtype=np.float64)
        max_excess, where = _max_excess(cells)
        B = opts.null_permutations
        notes = []
        if m == 0:
            notes.append("no testable cell-position: nothing was shown equal")
        if opts.permutation_pvalues and m and 1.0 / (B + 1) > alpha / m:
            notes.append(
                f"permutation p-values cannot reach alpha/m = {alpha / m:.2g} with B = {B}"
            )
        return CellsResult.of(
            self,
            alpha,
            cells,
            testable,
            families.failures(cells, _line),
            resolution=float(np.median(mde)) if mde.size else float("nan"),
            resolution_unit="TV per cell-position",
            notes=tuple(notes),
            mde_tv_max=float(np.max(mde)) if mde.size else float("nan"),
            max_tv_excess=max_excess,
            max_tv_excess_at=where,
            multiplicity_procedure=res.procedure,
            testable_share=float(m / len(cells)) if len(cells) else float("nan"),
            testability=_testability(inputs),
        )


def _cell_part(inputs: FamilyInputs, c: int) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """One cell's per-position columns, and its max-T scores [S, 1+B] (None unless 'maxT')."""
    opts = inputs.options
    tok, labels = inputs.cell_tokens(c), inputs.labels[c]  # [n_c, T], [n_c, 1+B]
    seq, pos = np.nonzero(tok >= 0)  # row-major: sorted by sequence
    table = tables.build_table(
        pos, tok[seq, pos], seq, n_seq=tok.shape[0], merge_singletons=inputs.merge
    )
    ref = tables.ref_counts(table, labels[:, :1])  # [K, 1] observed
    n_ref, n_cand = tables.stratum_arm_sizes(table, ref)  # [S, 1]
    bins = homogeneity.pool_table(table, n_ref[:, 0], n_cand[:, 0], opts.min_expected)
    chi = homogeneity.chi2_statistics(table, bins, ref, n_ref, n_cand)[:, 0]
    dof = np.where(bins.testable, bins.n_bins - 1, 0)
    with np.errstate(invalid="ignore"):
        p_asym = np.where(bins.testable, stats.chi2.sf(chi, np.maximum(dof, 1)), np.nan)
    tv = distance.tv_statistics(table, ref, n_ref, n_cand)[:, 0]
    nan = np.full(table.n_strata, np.nan)
    tv_mean, tv_q, tv_p, p_perm, scores = nan, nan, nan, nan, None
    if opts.null_permutations:
        chi_all, tv_all = _null_columns(table, bins, labels)  # [S, 1+B] each
        tv_mean, tv_q, tv_p = distance.summarize_null(tv_all[:, 0], tv_all[:, 1:], opts.tv_quantile)
        p_perm = distance.summarize_null(chi_all[:, 0], chi_all[:, 1:])[2]
        p_perm = np.where(bins.testable, p_perm, np.nan)
        if opts.multiplicity == "maxT":
            d = np.maximum(dof, 1)[:, None].astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                scores = -stats.chi2.logsf(chi_all.astype(np.float64), d)  # [S, 1+B]
            scores[~bins.testable] = np.nan
    part = dict(
        cell=np.full(table.n_strata, c),
        position=table.strata,
        chi=chi,
        p_asym=p_asym,
        p_perm=p_perm,
        dof=dof,
        n_ref=n_ref[:, 0],
        n_cand=n_cand[:, 0],
        n_bins=bins.n_bins,
        pooled=bins.pooled_tokens,
        min_exp=bins.min_expected,
        testable=bins.testable,
        tv=tv,
        tv_mean=tv_mean,
        tv_q=tv_q,
        tv_p=tv_p,
    )
    return part, scores


def _null_columns(
    table: tables.StrataTable, bins: homogeneity.PooledBins, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pooled χ² and TV of every stratum under every labeling (column 0 = observed), float32.

    Column 0 is recomputed here with the same arithmetic as the relabelings, so that a
    relabeling equal to the observed one ties exactly (``distance.summarize_null`` NOTE).
    """
    chi, tv = [], []
    block = families.BLOCK
    for lo in range(0, labels.shape[1], block):
        ref = tables.ref_counts(table, labels[:, lo : lo + block])  # [K, block]
        n_ref, n_cand = tables.stratum_arm_sizes(table, ref)
        chi.append(homogeneity.chi2_statistics(table, bins, ref, n_ref, n_cand, np.float32))
        tv.append(distance.tv_statistics(table, ref, n_ref, n_cand, np.float32))
    return np.concatenate(chi, axis=1), np.concatenate(tv, axis=1)


def _correct(
    cells: pd.DataFrame, scores: list[np.ndarray], method: str, alpha: float
) -> multiplicity.MultiplicityResult:
    """The multiplicity correction over every cell-position: max-T over the relabelings' scores
    when asked for (and there are relabelings), else BH / BY of the p-values ('maxT' without
    scores falls back to BH)."""
    if method == "maxT" and scores:
        s = np.concatenate(scores, axis=0)  # [S_total, 1+B]
        return multiplicity.maxt_adjust(s[:, 0], s[:, 1:].T, alpha)
    return multiplicity.adjust(
        cells["pvalue"].to_numpy(), method if method != "maxT" else "bh", alpha
    )


def _cells_frame(inputs: FamilyInputs, parts: list[dict[str, np.ndarray]]) -> pd.DataFrame:
    if not parts:
        return empty_frame(CELL_COLUMNS)
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    testable = cat["testable"]
    pvalue = cat["p_perm"] if inputs.options.permutation_pvalues else cat["p_asym"]
    df = pd.DataFrame(
        {
            **inputs.cell_ids(cat["cell"].astype(np.int64)),
            sc.POSITION: cat["position"].astype(np.int32),
            "statistic": np.where(testable, cat["chi"], np.nan),
            "pvalue": pvalue,
            "p_adj": np.nan,
            "reject": False,
            "dof": cat["dof"].astype(np.int64),
            "n_ref": cat["n_ref"].astype(np.int64),
            "n_cand": cat["n_cand"].astype(np.int64),
            "n_bins": cat["n_bins"].astype(np.int64),
            "pooled_tokens": cat["pooled"].astype(np.int64),
            "min_expected": cat["min_exp"],
            "tv": cat["tv"],
            "tv_null_mean": cat["tv_mean"].astype(np.float64),
            "tv_null_q95": cat["tv_q"].astype(np.float64),
            "tv_excess": cat["tv"] - cat["tv_mean"],
            "tv_pvalue": cat["tv_p"],
            "mde_tv": np.nan,
            "status": np.where(testable, homogeneity.OK, homogeneity.UNTESTABLE),
            "pvalue_asymptotic": cat["p_asym"],
            "pvalue_permutation": cat["p_perm"],
        }
    )
    return df[CELL_COLUMNS]


def _max_excess(cells: pd.DataFrame) -> tuple[float, dict[str, Any]]:
    """The largest plug-in TV minus its null mean over the cell-positions, and where."""
    excess = cells["tv_excess"].to_numpy(dtype=np.float64)
    if not np.isfinite(excess).any():
        return float("nan"), {}
    i = int(np.nanargmax(excess))
    where = {k: cells.iloc[i][k] for k in (sc.PROMPT_ID, sc.CONFIG_ID)}
    where[sc.POSITION] = int(cells.iloc[i][sc.POSITION])
    return float(excess[i]), where


def _line(r: Any) -> str:
    return (
        f"{r.prompt_id}/{r.config_id}@{int(r.position)} p_adj={float(r.p_adj):.3g} "
        f"TV={float(r.tv):.3f} (null mean {float(r.tv_null_mean):.3f})"
    )


def _testability(inputs: FamilyInputs) -> power.Testability:
    """Per cell-position arm histograms → ``power.estimate_testability`` (pooled-χ² keep rule)."""
    enc, opts = inputs.enc, inputs.options
    parts = []  # per cell: (top_ref_in_cand, top_cand_in_ref, top, n_ref, n_cand), each [T]
    for c in range(enc.n_cells):
        tok = inputs.cell_tokens(c)  # [n_c, T]
        is_ref = enc.seq_arm[enc.cell_start[c] : enc.cell_start[c + 1]] == 0  # [n_c]
        parts.append(power.cross_fitted_top_counts(tok[is_ref], tok[~is_ref]))
    if not parts:
        z = np.zeros(0)
        return power.estimate_testability(z, z, z, z, z, opts.min_expected, ())
    a, b, top, n_ref, n_cand = (np.concatenate(k) for k in zip(*parts, strict=True))
    return power.estimate_testability(
        a, b, top, n_ref, n_cand, opts.min_expected, opts.testable_shares
    )
