"""Figures of a stored run (matplotlib, Agg backend): TV per position against the permutation-null
band, p-value histogram and QQ plot, acceptance rate per position.

Owns: the figures and their encoding as base64 PNG. Reads columns of the stored tables
(``tests.parquet``: the analysis's per-cell table; ``rounds.parquet``); computes no statistic —
the acceptance rate per position is the displayed ratio Σ accepted / Σ drafted of stored rounds.
Knows nothing about how the tables were produced.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # NOTE: no display anywhere spectest runs (CI, SSH); must precede pyplot
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from spectest.report.columns import COLS, pick
from spectest.report.escape import printable

Figure = Any
QQ_CLIP = 10.0


def label(text: object) -> str:
    """User text as a figure label: control characters shown, ``$`` escaped (matplotlib would
    parse ``$...$`` as mathtext, and a malformed one fails the whole report)."""
    return printable(text).replace("$", r"\$")


def to_base64_png(fig: Figure, dpi: int = 90) -> str:
    """Encode and close a figure."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def tv_by_position(tests: pd.DataFrame, comparison: str = "candidate") -> Figure | None:
    """Plug-in TV per position for one comparison, one panel per config, each prompt a line, the
    permutation-null band (null mean … null upper quantile, averaged over prompts) shaded."""
    df = tests[tests["comparison"] == comparison] if "comparison" in tests.columns else tests
    tv, lo, hi = pick(df, "tv"), pick(df, "tv_null_mean"), pick(df, "tv_null_quantile")
    if tv is None or COLS["position"] not in df.columns or len(df) == 0:
        return None
    configs = list(dict.fromkeys(df[COLS["config_id"]]))
    fig, axes = plt.subplots(
        1, len(configs), figsize=(max(6.0, 4.2 * len(configs)), 3.4), squeeze=False
    )
    for ax, cid in zip(axes[0], configs, strict=True):
        sub = df[df[COLS["config_id"]] == cid]
        for pid, g in sub.groupby(COLS["prompt_id"], sort=False):
            g = g.sort_values(COLS["position"])
            ax.plot(g[COLS["position"]], tv.loc[g.index], marker=".", lw=1, label=label(pid))
        if lo is not None and hi is not None:
            band = pd.DataFrame(
                {"p": sub[COLS["position"]], "lo": lo.loc[sub.index], "hi": hi.loc[sub.index]}
            )
            band = band.groupby("p").mean().sort_index()
            ax.fill_between(
                band.index, band["lo"], band["hi"], color="0.8", label="null mean…q", zorder=0
            )
        ax.set_title(label(cid))
        ax.set_xlabel("position")
        ax.set_ylabel("plug-in TV")
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.suptitle(
        f"plug-in TV per position, {comparison} vs reference (band: permutation null)", fontsize=9
    )
    return fig


def pvalue_plots(tests: pd.DataFrame, comparisons: list[str]) -> Figure | None:
    """Histogram and uniform QQ plot (−log10) of the per-cell p-values of each comparison."""
    pv = pick(tests, "pvalue")
    if pv is None or len(tests) == 0:
        return None
    fig, (h, q) = plt.subplots(1, 2, figsize=(9, 3.4))
    for comp in comparisons:
        mask = (
            (tests["comparison"] == comp)
            if "comparison" in tests.columns
            else np.ones(len(tests), bool)
        )
        p = pv[mask].dropna().to_numpy(dtype=float)
        if p.size == 0:
            continue
        h.hist(p, bins=20, range=(0, 1), histtype="step", label=label(comp), density=True)
        # NOTE: clipped at QQ_CLIP so a gross mutant does not flatten the H0 arms onto the axis
        obs = np.minimum(-np.log10(np.sort(np.clip(p, 1e-300, 1))), QQ_CLIP)
        exp = -np.log10((np.arange(1, p.size + 1) - 0.5) / p.size)
        q.plot(exp, obs, ".", ms=3, label=label(comp))
    h.axhline(1.0, color="k", lw=0.8, ls="--")
    h.set_xlabel("p-value (per cell)")
    h.set_ylabel("density")
    lim = q.get_xlim()[1]
    q.plot([0, lim], [0, lim], "k--", lw=0.8)
    q.set_xlabel("expected −log10 p (uniform)")
    q.set_ylabel(f"observed −log10 p (clipped at {QQ_CLIP:g})")
    h.legend(fontsize=7)
    fig.suptitle("per-cell p-values: uniform under H0")
    return fig


def acceptance_by_position(rounds: pd.DataFrame | None) -> Figure | None:
    """Σ accepted / Σ drafted of the stored rounds, by the round's first position, per arm."""
    if rounds is None or len(rounds) == 0:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    g = rounds.groupby(["arm", "position"])[["accepted", "drafted"]].sum().reset_index()
    for arm, sub in g.groupby("arm", sort=False):
        sub = sub[sub["drafted"] > 0].sort_values("position")
        ax.plot(
            sub["position"], sub["accepted"] / sub["drafted"], marker=".", lw=1, label=label(arm)
        )
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position at the start of the round")
    ax.set_ylabel("accepted / drafted")
    ax.legend(fontsize=7)
    ax.set_title("acceptance rate per position")
    return fig
