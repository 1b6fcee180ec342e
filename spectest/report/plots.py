"""The report's figures (matplotlib, Agg): TV per position against the null band, p-value
histogram and QQ plot, acceptance per position, as base64 PNG. Computes no statistic.

The why and the details: docs/internals.md "spectest/report/plots.py".
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
from matplotlib.ticker import MaxNLocator

from spectest.report.escape import printable

Figure = Any
QQ_CLIP = 10.0

# one colour and marker per arm, the same in every figure (reference dark grey, candidate red,
# the null arm green, then each ε arm / mutant in the order it appears); series are drawn
# translucent with markers so an arm that coincides with another stays visible
_FIXED = {"reference": ("#3a3a3a", "o"), "candidate": ("#d62728", "s"), "null": ("#2ca02c", "^")}
_OTHERS = [
    ("#1f77b4", "D"),
    ("#9467bd", "v"),
    ("#ff7f0e", "P"),
    ("#8c564b", "X"),
    ("#e377c2", "<"),
    ("#17becf", ">"),
    ("#bcbd22", "h"),
    ("#7f7f7f", "*"),
]
ALPHA = 0.75


# logical name → candidate column names in tests.parquet (the analysis's per-cell table)
ALIASES: dict[str, tuple[str, ...]] = {
    "pvalue": ("pvalue",),
    "qvalue": ("p_adj", "qvalue"),
    "rejected": ("reject", "rejected"),
    "tv": ("tv", "tv_statistic"),
    "tv_null_mean": ("tv_null_mean",),
    "tv_null_quantile": ("tv_null_q95", "tv_null_quantile"),
    "tv_excess": ("tv_excess",),
    "mde_tv": ("mde_tv",),
    "status": ("status",),
}


def pick(df: pd.DataFrame, logical: str) -> pd.Series | None:
    """The stored column of a logical name (the first of ``ALIASES`` present), or None."""
    name = next((n for n in ALIASES.get(logical, (logical,)) if n in df.columns), None)
    return None if name is None else df[name]


def arm_style(arm: str, arms: list[str]) -> dict[str, Any]:
    """The colour and marker of ``arm`` (``arms``: every arm of the run, in order, so a tooth
    keeps its colour across figures)."""
    if arm in _FIXED:
        color, marker = _FIXED[arm]
    else:
        others = [a for a in arms if a not in _FIXED]
        i = others.index(arm) if arm in others else len(others)
        color, marker = _OTHERS[i % len(_OTHERS)]
    return {"color": color, "marker": marker}


def _legend(ax: Any, **kw: Any) -> None:
    """A legend when the axes hold a labelled artist (matplotlib warns on stderr otherwise:
    a second stderr line beside a run's one error line, found by tools/fuzz.py)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def label(text: object) -> str:
    """User text as a figure label: control characters shown, ``$`` escaped (matplotlib would
    parse ``$...$`` as mathtext, and a malformed one fails the whole report)."""
    return printable(text).replace("$", r"\$")


def to_base64_png(fig: Figure, dpi: int = 90) -> str:
    """Encode and close a figure: laid out once (tight, or by the layout engine the figure
    set), drawn once, and the PNG cropped to what was drawn only when something fell outside
    the canvas (docs/internals.md "Why each figure is laid out once and drawn once")."""
    import matplotlib.image
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_dpi(dpi)
    engine = fig.get_layout_engine()
    if engine is None:
        fig.tight_layout()
    else:
        engine.execute(fig)
    fig.set_layout_engine(None)
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    box = fig.get_tightbbox(canvas.get_renderer())
    w, h = fig.get_size_inches()
    tol = 0.5 / dpi  # half a pixel
    buf = io.BytesIO()
    meta: dict[str, Any] = {"Software": None}  # no matplotlib version in the PNG
    if box.x0 >= -tol and box.y0 >= -tol and box.x1 <= w + tol and box.y1 <= h + tol:
        rgba = canvas.buffer_rgba()
        matplotlib.image.imsave(buf, rgba, format="png", origin="upper", dpi=dpi, metadata=meta)
    else:
        fig.savefig(buf, format="png", dpi=dpi, metadata=meta, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _legend_below(fig: Figure, handles: list[Any], labels: list[str]) -> None:
    """The figure's legend in a strip along its bottom edge, the axes laid out (tight) above
    it: the strip is the legend's measured height, so nothing falls outside the canvas."""
    leg = fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=3,
        fontsize=7,
        frameon=False,
        bbox_to_anchor=(0.5, 0.0),
    )
    height = leg.get_window_extent(fig.canvas.get_renderer()).height / fig.bbox.height
    fig.set_layout_engine("tight", rect=(0.0, min(height, 0.5), 1.0, 1.0))


def tv_by_position(
    tests: pd.DataFrame, comparisons: list[str] | str = "candidate"
) -> Figure | None:
    """Plug-in TV per position of each comparison (its arm's colour; one line per prompt,
    the prompts told apart by line style), one panel per config, the permutation null (its mean
    to its upper quantile, averaged over prompts, of the first comparison) shaded."""
    comps = [comparisons] if isinstance(comparisons, str) else list(comparisons)
    tv, lo, hi = pick(tests, "tv"), pick(tests, "tv_null_mean"), pick(tests, "tv_null_quantile")
    if tv is None or "position" not in tests.columns or len(tests) == 0:
        return None
    has_comp = "comparison" in tests.columns
    configs = list(dict.fromkeys(tests["config_id"]))
    fig, axes = plt.subplots(
        1, len(configs), figsize=(max(6.0, 4.2 * len(configs)), 3.6), squeeze=False
    )
    styles = ["-", "--", ":", "-."]
    for ax, cid in zip(axes[0], configs, strict=True):
        for k, comp in enumerate(comps):
            df = tests[tests["comparison"] == comp] if has_comp else tests
            sub = df[df["config_id"] == cid]
            for j, (_, g) in enumerate(sub.groupby("prompt_id", sort=False)):
                g = g.sort_values("position")
                st = arm_style(comp, comps)
                x = g["position"].to_numpy(dtype=float) + 0.04 * (k - (len(comps) - 1) / 2)
                ax.plot(
                    x,
                    tv.loc[g.index],
                    ls=styles[j % 4],
                    lw=1,
                    ms=4,
                    alpha=ALPHA,
                    label=label(comp) if j == 0 else None,
                    **st,
                )
            if k == 0 and lo is not None and hi is not None and len(sub):
                _null_band(ax, sub, lo, hi)
        ax.set_title(label(cid), fontsize=9)
        ax.set_xlabel("position")
        ax.set_ylabel("plug-in TV vs reference")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if axes[0][0].get_legend_handles_labels()[0]:
        _legend_below(fig, *axes[0][0].get_legend_handles_labels())
    prompts = list(dict.fromkeys(tests["prompt_id"]))[:4]
    ls_names = ["solid", "dashed", "dotted", "dash-dot"]
    key = ", ".join(f"{label(p)} {n}" for p, n in zip(prompts, ls_names, strict=False))
    fig.suptitle(f"plug-in TV per position (line style per prompt: {key})", fontsize=9)
    return fig


def _null_band(ax: Any, sub: pd.DataFrame, lo: pd.Series, hi: pd.Series) -> None:
    """The permutation null's band (mean to upper quantile, averaged over prompts) of ``sub``."""
    band = pd.DataFrame({"p": sub["position"], "lo": lo.loc[sub.index], "hi": hi.loc[sub.index]})
    band = band.groupby("p").mean().sort_index()
    ax.fill_between(
        band.index,
        band["lo"],
        band["hi"],
        color="0.85",
        zorder=0,
        label="TV under H0 (permutation null: mean to upper quantile)",
    )


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
        st = arm_style(comp, comparisons)
        h.hist(
            p,
            bins=20,
            range=(0, 1),
            histtype="step",
            label=label(comp),
            density=True,
            color=st["color"],
            alpha=ALPHA,
            lw=1.5,
        )
        # NOTE: clipped at QQ_CLIP so a gross mutant does not flatten the H0 arms onto the axis
        obs = np.minimum(-np.log10(np.sort(np.clip(p, 1e-300, 1))), QQ_CLIP)
        exp = -np.log10((np.arange(1, p.size + 1) - 0.5) / p.size)
        q.plot(exp, obs, ls="none", ms=4, alpha=ALPHA, mfc="none", label=label(comp), **st)
    h.axhline(1.0, color="k", lw=0.8, ls="--")
    h.set_xlabel("p-value (per cell)")
    h.set_ylabel("density")
    lim = q.get_xlim()[1]
    q.plot([0, lim], [0, lim], "k--", lw=0.8, label="uniform (H0)")
    q.set_xlabel("expected −log10 p (uniform)")
    q.set_ylabel(f"observed −log10 p (clipped at {QQ_CLIP:g})")
    _legend(h, fontsize=7)
    _legend(q, fontsize=7)
    fig.suptitle("per-cell p-values: uniform under H0", fontsize=9)
    return fig


def acceptance_by_position(
    rounds: pd.DataFrame | None, arms: list[str] | None = None
) -> Figure | None:
    """Σ accepted / Σ drafted of the stored rounds, by the round's first position, per arm."""
    if rounds is None or len(rounds) == 0:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    g = rounds.groupby(["arm", "position"])[["accepted", "drafted"]].sum().reset_index()
    order = arms or list(dict.fromkeys(g["arm"]))
    for arm, sub in g.groupby("arm", sort=False):
        sub = sub[sub["drafted"] > 0].sort_values("position")
        st = arm_style(str(arm), order)
        ax.plot(
            sub["position"],
            sub["accepted"] / sub["drafted"],
            lw=1,
            ms=4,
            alpha=ALPHA,
            mfc="none",
            label=label(arm),
            **st,
        )
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position at the start of the round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("accepted / drafted")
    _legend(ax, fontsize=7)
    ax.set_title("acceptance rate per position")
    return fig
