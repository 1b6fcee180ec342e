"""The numerics floors beyond the batch floor: claim (b)'s drift is decided
against a floor of numerics differences users already accept; ``spectest.numerics.table``
measures the batch floor (plain decode in the run's batch vs alone), this module the two
others and chooses.

Owns: ``decode_logits`` (plain decode along given tokens, the prompt prefilled in one forward or
in two: ``prompt[:split]`` then the rest), ``floor_column`` (one floor's per-token TV for every
measured row of a drift table, in the run's batch) and ``complete_floors`` (what
``tests.numerics_floor`` asks for measured, ``auto`` moving on from a floor that is identically
0). Choosing the column the decision reads is ``stats.drift.select_floor``'s (no torch there).

The why and the details: docs/internals.md "spectest/numerics/floors.py".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.models.base import LanguageModel
from spectest.numerics.table import prompt_rows
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs
from spectest.stats.drift import FLOOR_COLUMNS, FLOOR_ORDER, identically_zero

MEASURED = ("prefill", "dtype")  # the floors this module measures (batch: spectest.numerics.table)


@torch.no_grad()
def decode_logits(
    model: LanguageModel,
    prompt: torch.Tensor,
    tokens: torch.Tensor,
    keep: torch.Tensor,
    *,
    split: int | None = None,
) -> torch.Tensor:
    """Plain decode along ``tokens`` ``[B, T]`` in one batch: float32 logits ``[len(keep), T,
    V]`` of the rows ``keep``. ``split`` None: the prompt prefilled in one forward and shared
    (the reference loop's schedule); else ``prompt[:split]`` prefilled and shared, then
    ``prompt[split:]`` as one forward over every row (a prefix-cache hit at ``split``)."""
    B, T = int(tokens.shape[0]), int(tokens.shape[1])
    if split is None:
        cache, prompt_logits = model.prefill_shared(prompt, B)
        logits = prompt_logits[-1].expand(B, -1)
    else:
        assert 0 < split < len(prompt), (split, len(prompt))
        cache, _ = model.prefill_shared(prompt[:split], B)
        rest = prompt[split:][None, :].expand(B, -1).contiguous()
        logits = model.forward(cache, rest)[:, -1]
    out = torch.empty((len(keep), T, model.vocab_size), dtype=torch.float32, device=model.device)
    for t in range(T):
        out[:, t] = logits[keep].float()
        if t + 1 < T:
            logits = model.forward(cache, tokens[:, t : t + 1])[:, 0]
    return out


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
