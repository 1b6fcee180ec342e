"""The column names the reports read from the stored analysis tables, in one place.

Owns: logical name → stored column name(s) (the first one present wins), so a renamed column in
``spectest.stats`` is a one-line change here. Knows nothing else.
"""

from __future__ import annotations

import pandas as pd

COLS = {"prompt_id": "prompt_id", "config_id": "config_id", "position": "position"}

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


def column(df: pd.DataFrame, logical: str) -> str | None:
    for name in ALIASES.get(logical, (logical,)):
        if name in df.columns:
            return name
    return None


def pick(df: pd.DataFrame, logical: str) -> pd.Series | None:
    name = column(df, logical)
    return None if name is None else df[name]
