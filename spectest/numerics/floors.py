"""The numerics floors beyond the batch floor (``numerics.table``'s): ``floor_column`` (one floor's
per-token TV for every measured row of a drift table: ``prefill``, the prompt prefilled as a
prefix-cache hit; ``dtype``, the target in float32) and ``complete_floors`` (what
``tests.numerics_floor`` asks for, ``auto`` moving on from a floor identically 0). Choosing the
column the decision reads is ``stats.drift.select_floor``'s. Details: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.models.base import LanguageModel
from spectest.numerics.decode import decode_logits
from spectest.numerics.table import prompt_rows
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs
from spectest.stats.drift import FLOOR_COLUMNS, FLOOR_ORDER, identically_zero

MEASURED = ("prefill", "dtype")  # the floors this module measures (batch: spectest.numerics.table)


def _tv_rows(a: torch.Tensor, b: torch.Tensor, params: Sequence[SamplingParams]) -> np.ndarray:
    """TV ``[M, T]`` of the processed laws of logits ``[M, T, V]`` (row m's parameters)."""
    M, T, V = a.shape
    st = SamplingTensors.from_params([p for p in params for _ in range(T)], device=a.device)
    pa = logits_to_probs(a.reshape(M * T, V), st)
    pb = logits_to_probs(b.reshape(M * T, V).to(a.device), st)
    return (0.5 * (pa - pb).abs().sum(-1)).reshape(M, T).cpu().numpy()


def floor_column(
    kind: str,
    table: pd.DataFrame,
    target: LanguageModel,
    samples: pd.DataFrame,
    prompts: Mapping[str, Sequence[int]],
    configs: Sequence[tuple[str, SamplingParams]],
    *,
    arm: str,
    batch_size: int,
    positions: int,
    float32_target: Callable[[], LanguageModel] | None = None,
) -> np.ndarray:
    """Floor ``kind`` (``prefill`` | ``dtype``) per token for every row of ``table`` (the drift
    table, ``numerics.COLUMNS``), aligned with it: each prompt's rows decoded as the run
    batched them (``batch_size`` at a time), the table's sequences kept. ``float32_target``
    loads the target in float32 (``dtype`` only)."""
    assert kind in MEASURED, kind
    other = float32_target() if kind == "dtype" and float32_target is not None else None
    if kind == "dtype" and other is None:
        raise ValueError("the dtype floor needs the target in float32")
    cfg = dict(configs)
    out = pd.Series(np.nan, index=table.index)
    s = samples[samples[schema.ARM] == arm]
    for pid, ps in s.groupby(schema.PROMPT_ID, sort=False):
        tab = table[table[schema.PROMPT_ID] == str(pid)]
        built = prompt_rows(ps, configs, positions)
        prompt_ids = list(prompts[str(pid)])
        if not len(tab) or built is None or (kind == "prefill" and len(prompt_ids) < 2):
            continue
        keys, tokens = built
        cid, sd = tab[schema.CONFIG_ID].astype(str), tab[schema.SEED].astype(int)
        want = set(zip(cid, sd, strict=True))
        for lo in range(0, len(keys), batch_size):
            hi = min(len(keys), lo + batch_size)
            mine = [i for i in range(lo, hi) if keys[i] in want]
            if not mine:
                continue
            dev = target.device
            toks = torch.tensor(tokens[lo:hi], dtype=torch.int64, device=dev)
            keep = torch.tensor([i - lo for i in mine], dtype=torch.int64, device=dev)
            prompt = torch.tensor(prompt_ids, dtype=torch.int64, device=dev)
            ref = decode_logits(target, prompt, toks, keep)
            if other is not None:
                odev = other.device
                var = decode_logits(other, prompt.to(odev), toks.to(odev), keep.to(odev))
            else:
                var = decode_logits(target, prompt, toks, keep, split=len(prompt_ids) - 1)
            tv = _tv_rows(ref, var, [cfg[keys[i][0]] for i in mine])
            for m, i in enumerate(mine):
                c, sd = keys[i]
                rows = tab[(tab[schema.CONFIG_ID].astype(str) == c) & (tab[schema.SEED] == sd)]
                out.loc[rows.index] = tv[m, rows[schema.POSITION].to_numpy(dtype=np.int64)]
            del ref, var
    return out.to_numpy(dtype=float)


def complete_floors(
    table: pd.DataFrame, setting: str, measure: Callable[[str], np.ndarray]
) -> pd.DataFrame:
    """The drift table with the floors ``setting`` needs (``tests.numerics_floor``): ``batch``
    as ``numerics.table`` measured it; ``prefill`` / ``dtype`` measured by ``measure(kind)``
    (``floor_column`` bound to the run); ``auto`` in ``FLOOR_ORDER``, measuring the next floor
    only while every floor so far is identically 0 (absent: measured next)."""
    out = table.copy()
    kinds = FLOOR_ORDER if setting == "auto" else (setting,)
    for kind in kinds:
        col = FLOOR_COLUMNS[kind]
        if col not in out.columns and kind in MEASURED:
            out[col] = measure(kind)
        if col in out.columns and not identically_zero(out[col]):
            break
    return out
