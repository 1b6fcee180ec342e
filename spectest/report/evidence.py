"""The report's evidence figures: the prompt × position map, token bars at the worst cells,
tooth sizes beside the resolution. Reads stored tables; computes no statistic.

The why and the details: docs/internals.md "spectest/report/evidence.py".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from spectest.report.plots import ALPHA, QQ_CLIP, Figure, arm_style, label

N_WORST = 3  # cells whose token bars are shown
N_TOKENS = 12  # tokens per bar chart (the most frequent in either arm; the rest pooled)


def worst_cells(tests: pd.DataFrame, comparison: str, n: int = N_WORST) -> pd.DataFrame:
    """The ``n`` tested cell-positions of ``comparison`` with the smallest adjusted p-value."""
    df = tests[(tests["comparison"] == comparison) & (tests["status"] == "ok")]
    return df.sort_values(["p_adj", "pvalue"]).head(n)


def evidence_map(tests: pd.DataFrame, comparison: str) -> Figure | None:
    """−log10 of the adjusted p-value per (prompt, config) × position for ``comparison``;
    rejected cell-positions marked ×, untestable ones left blank."""
    df = tests[tests["comparison"] == comparison] if "comparison" in tests.columns else tests
    if len(df) == 0:
        return None
    keys = list(dict.fromkeys(zip(df["prompt_id"], df["config_id"], strict=True)))
    positions = sorted(int(p) for p in set(df["position"]))
    grid = np.full((len(keys), len(positions)), np.nan)
    rej = np.zeros_like(grid, dtype=bool)
    row = {k: i for i, k in enumerate(keys)}
    col = {p: j for j, p in enumerate(positions)}
    for r in df.itertuples(index=False):
        i, j = row[(r.prompt_id, r.config_id)], col[int(r.position)]
        if r.status == "ok" and np.isfinite(r.p_adj):
            grid[i, j] = min(-np.log10(max(float(r.p_adj), 1e-300)), QQ_CLIP)
            rej[i, j] = bool(r.reject)
    fig, ax = plt.subplots(figsize=(min(11.0, 4.5 + 0.5 * len(positions)), 1.6 + 0.35 * len(keys)))
    im = ax.imshow(
        grid, aspect="auto", cmap="Reds", vmin=0, vmax=max(2.0, np.nanmax(grid, initial=0))
    )
    for i, j in zip(*np.nonzero(rej), strict=True):
        ax.text(j, i, "×", ha="center", va="center", color="white", fontsize=10, weight="bold")
    ax.set_xticks(range(len(positions)), [str(p) for p in positions], fontsize=7)
    ax.set_yticks(range(len(keys)), [label(f"{p} / {c}") for p, c in keys], fontsize=7)
    ax.set_xlabel("position")
    fig.colorbar(im, ax=ax, label="−log10 p adj", fraction=0.05, pad=0.02)
    ax.set_title(
        f"evidence per cell-position: {label(comparison)} vs reference (× rejected; "
        f"colour clipped at {QQ_CLIP:g})",
        fontsize=9,
    )
    return fig


def token_bars(
    hist: pd.DataFrame | None,
    cells: pd.DataFrame,
    comparison: str,
    text: Callable[[int], str],
) -> Figure | None:
    """For each cell-position of ``cells``: the share of each token in the reference and in
    ``comparison`` (stored counts / the arm's total there), the ``N_TOKENS`` most frequent
    tokens by name (``text``), the rest pooled as "other"."""
    if hist is None or len(hist) == 0 or len(cells) == 0:
        return None
    fig, axes = plt.subplots(len(cells), 1, figsize=(9, 2.4 * len(cells)), squeeze=False)
    arms = ["reference", comparison]
    for ax, c in zip(axes[:, 0], cells.itertuples(index=False), strict=True):
        at = hist[
            (hist["prompt_id"] == c.prompt_id)
            & (hist["config_id"] == c.config_id)
            & (hist["position"] == c.position)
            & hist["arm"].isin(arms)
        ]
        wide = at.pivot_table(index="token_id", columns="arm", values="count", aggfunc="sum")
        wide = wide.reindex(columns=arms).fillna(0.0)
        share = wide / wide.sum(axis=0).replace(0, np.nan)
        top = share.max(axis=1).sort_values(ascending=False).index[:N_TOKENS]
        shown = share.loc[top]
        rest = share.drop(index=top).sum(axis=0)
        names = [label(text(int(t))) for t in top]
        if len(share) > len(top):
            shown = pd.concat([shown, rest.to_frame().T])
            names.append("other")
        x = np.arange(len(shown))
        for k, arm in enumerate(arms):
            st = arm_style(arm, arms)
            ax.bar(
                x + (k - 0.5) * 0.4,
                shown[arm].to_numpy(),
                width=0.4,
                color=st["color"],
                alpha=ALPHA,
                label=label(arm),
            )
        ax.set_xticks(x, names, fontsize=8, rotation=30, ha="right")
        ax.set_ylabel("share")
        ax.set_title(
            label(
                f"{c.prompt_id} / {c.config_id} @ position {int(c.position)}: "
                f"p adj {float(c.p_adj):.2g}, TV {float(c.tv):.3f}"
            ),
            fontsize=8,
        )
        ax.legend(fontsize=7)
    fig.suptitle("reference vs candidate token shares at the worst cell-positions", fontsize=9)
    return fig


def sizes_vs_resolution(
    tests: pd.DataFrame, sizes: pd.DataFrame | None, comparison: str, arms: list[str]
) -> Figure | None:
    """Each tooth's TV per cell-position (``tooth_sizes.parquet``: exact, or an upper bound
    drawn hollow) beside the per-cell MDE of ``comparison``, cell-positions in table order."""
    if sizes is None or len(sizes) == 0:
        return None
    df = tests[(tests["comparison"] == comparison) & (tests["status"] == "ok")]
    keys = ["prompt_id", "config_id", "position"]
    order = {k: i for i, k in enumerate(zip(*(df[c] for c in keys), strict=True))}
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    ax.plot(
        range(len(df)),
        df["mde_tv"].to_numpy(dtype=float),
        color="k",
        lw=1.2,
        label=f"MDE of {label(comparison)} (80 % power)",
    )
    for arm, g in sizes.groupby("arm", sort=False):
        x = [order.get(k, np.nan) for k in zip(*(g[c] for c in keys), strict=True)]
        st = arm_style(str(arm), arms)
        exact = (g["status"] == "exact").to_numpy()
        ax.plot(
            np.asarray(x)[exact],
            g["tv"].to_numpy()[exact],
            ls="none",
            alpha=ALPHA,
            label=label(f"{arm} size"),
            **st,
        )
        if (~exact).any():
            ax.plot(
                np.asarray(x)[~exact],
                g["tv"].to_numpy()[~exact],
                ls="none",
                mfc="none",
                alpha=ALPHA,
                label=label(f"{arm} size (upper bound)"),
                **st,
            )
    ax.set_ylim(0, 1.02)
    _cell_ticks(ax, df)
    ax.set_xlabel("cell-position (prompt / config @ position)")
    ax.set_ylabel("TV")
    ax.legend(fontsize=7)
    ax.set_title(
        "resolution beside the bug sizes that matter (teeth above the line: seen)", fontsize=9
    )
    return fig


MAX_TICKS = 32  # more cell-positions than this: one tick per cell (its first position)


def cell_labels(df: pd.DataFrame) -> list[str]:
    """``prompt@position`` per row of ``df`` (``prompt/config@position`` when it holds more
    than one config), the labels of the resolution plot's x-axis."""
    many = df["config_id"].nunique() > 1
    return [
        f"{p}/{c}@{int(t)}" if many else f"{p}@{int(t)}"
        for p, c, t in zip(df["prompt_id"], df["config_id"], df["position"], strict=True)
    ]


def _cell_ticks(ax: Any, df: pd.DataFrame) -> None:
    """The x-axis in cell-positions: each labelled (``cell_labels``), or past ``MAX_TICKS`` one
    tick per cell at its first position, labelled ``prompt/config``."""
    if len(df) <= MAX_TICKS:
        ax.set_xticks(range(len(df)), [label(t) for t in cell_labels(df)], fontsize=6, rotation=90)
        return
    cells = list(zip(df["prompt_id"], df["config_id"], strict=True))
    starts = [i for i, c in enumerate(cells) if i == 0 or c != cells[i - 1]]
    ax.set_xticks(
        starts, [label(f"{cells[i][0]}/{cells[i][1]}") for i in starts], fontsize=6, rotation=90
    )
