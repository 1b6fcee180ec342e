"""Teacher forcing with transformers' own logits processors: the laws the hf engines should follow.

Owns ``hf_warpers`` (transformers' processor list for sampled params, in its order, with its own
skip rules), the float64 laws along emitted sequences (``forced_probs``, ``scores_probs``,
``draft_law``) and ``hf_teacher_force``: an hf arm's white-box columns. Knows nothing about
statistics, the column definitions (``engines.teacher``) or how sequences were produced. Why p_t
is transformers' float32 chain, and which law each release's assistant proposes from:
docs/engines-hf.md "Teacher forcing".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from spectest.engines.hf.pinning import hf_model_of, logit_scale_of
from spectest.engines.teacher import (
    MAX_CHUNK_ELEMENTS,
    columns_frame,
    forced_tokens,
    whitebox_columns,
)
from spectest.errors import ConfigError, InputError
from spectest.sampling.params import SamplingParams

Q_LAWS = ("raw", "processed", "processed_twice")


def hf_warpers(params: SamplingParams) -> LogitsProcessorList:
    """transformers' warpers for ``params`` (sampled), as ``generate`` builds them with num_beams=1.

    Skip rules copied from ``_get_logits_processor`` (5.x) / ``_get_logits_warper`` (4.44):
    temperature when ``!= 1``, top-k when ``!= 0``, top-p when ``< 1``, min-p whenever set (the hf
    backend always sets it; 0 removes nothing).
    """
    assert not params.is_greedy, "greedy has no warpers"
    procs: list[Any] = []
    if params.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(float(params.temperature)))
    if params.top_k != 0:
        procs.append(TopKLogitsWarper(top_k=int(params.top_k), min_tokens_to_keep=1))
    if params.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=float(params.top_p), min_tokens_to_keep=1))
    procs.append(MinPLogitsWarper(min_p=float(params.min_p), min_tokens_to_keep=1))
    return LogitsProcessorList(procs)


def next_token_logits(
    model: Any, sequences: torch.Tensor, prompt_len: int, chunk: int = 64
) -> torch.Tensor:
    """float32 logits ``[B, T, V]`` for each generated token of ``sequences [B, L + T]``.

    ``L = prompt_len``.

    Position t's logits are the model's output after ``sequences[:, : L + t]`` — the scores
    ``generate`` saw before emitting token t. Includes the zoo's ``logit_scale`` (as ``generate``
    does through ``pinning.LogitScale``). Runs in chunks of ``chunk`` rows (memory).
    """
    assert sequences.dim() == 2 and sequences.dtype == torch.int64, (
        sequences.shape,
        sequences.dtype,
    )
    B, LT = (int(s) for s in sequences.shape)
    assert 1 <= prompt_len < LT, (prompt_len, LT)
    hf = hf_model_of(model)
    scale = logit_scale_of(model)
    out = []
    with torch.inference_mode():
        for i in range(0, B, chunk):
            ids = sequences[i : i + chunk].to(hf.device)  # [b, L + T]
            logits = hf(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
            logits = logits[:, prompt_len - 1 : LT - 1].float()  # [b, T, V]
            if scale != 1.0:
                logits = logits * scale
            out.append(logits.cpu())
    return torch.cat(out, dim=0)  # [B, T, V]


def _apply(warpers: LogitsProcessorList, logits: torch.Tensor) -> torch.Tensor:
    """Apply warpers to ``logits [B, T, V]`` (float32) row by row; they ignore ``input_ids``."""
    B, T, V = logits.shape
    flat = logits.reshape(B * T, V).clone()  # [N, V]
    dummy: Any = torch.zeros((B * T, 1), dtype=torch.int64)  # warpers never read input_ids
    return warpers(dummy, flat).reshape(B, T, V)


def _onehot_argmax(x: torch.Tensor) -> torch.Tensor:
    """float64 one-hot at the argmax of ``x [B, T, V]`` (torch's first maximal index, as
    ``generate`` picks a greedy token)."""
    return torch.zeros(x.shape, dtype=torch.float64).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)


def processed_probs(logits: torch.Tensor, params: SamplingParams, times: int = 1) -> torch.Tensor:
    """float64 law ``[B, T, V]`` from float32 ``logits [B, T, V]``: warpers applied ``times`` times.

    Greedy params give the one-hot argmax (torch's first maximal index, as ``generate``).
    NOTE: the warpers run in float32 like ``generate``; only the final softmax is float64, so
    filtered tokens are exact zeros and rows sum to 1 within 1e-15.
    """
    assert logits.dim() == 3, logits.shape
    if params.is_greedy:
        return _onehot_argmax(logits)
    scores = logits.float()
    for _ in range(times):
        scores = _apply(hf_warpers(params), scores)
    return torch.softmax(scores.double(), dim=-1)  # [B, T, V]


def scores_probs(scores: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float64 law ``[B, T, V]`` from transformers' processed float32 ``scores [B, T, V]``.

    Sampled params: softmax (NOTE in float64 of the float32 scores; transformers takes it in
    float32 — tokens it filtered are exact zeros in both, the rest differ by ~1e-7). Greedy: the
    one-hot argmax, as ``generate`` picks it (scores are then only the unwarped logits).
    """
    assert scores.dim() == 3, scores.shape
    if params.is_greedy:
        return _onehot_argmax(scores)
    return torch.softmax(scores.double(), dim=-1)


def forced_probs(
    model: Any, sequences: torch.Tensor, prompt_len: int, params: SamplingParams
) -> torch.Tensor:
    """The processed law ``[B, T, V]`` float64 along ``sequences``: of the target, p_t (what plain
    ``generate`` samples token t from); of the draft, q_t (what a correct drafter proposes from)."""
    return processed_probs(next_token_logits(model, sequences, prompt_len), params)


def param_runs(params: Sequence[SamplingParams], size: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` slices of consecutive equal ``params``, at most ``size`` long."""
    out: list[tuple[int, int]] = []
    lo = 0
    for i in range(1, len(params) + 1):
        if i == len(params) or i - lo == size or params[i] != params[lo]:
            out.append((lo, i))
            lo = i
    return out


def hf_teacher_force(
    target: Any,
    prompt: Sequence[int],
    params: Sequence[SamplingParams],
    tokens: torch.Tensor | np.ndarray,
    *,
    draft: Any | None = None,
    target_scores: torch.Tensor | None = None,
) -> pd.DataFrame:
    """White-box columns of an hf arm, aligned with ``base.samples_frame``.

    Same contract as ``engines.teacher.teacher_force`` but p_t (and q_t, the processed draft law,
    with ``draft``) come from transformers' own warpers (``forced_probs``);
    ``engines.teacher.whitebox_columns`` turns them into columns.

    Parameters
    ----------
    tokens : int64 ``[B, T]`` (``ArmOutput.tokens``, numpy, or a tensor); ``params``: one per row.
    target_scores : float32 ``[B, T, V]`` (any device), optional
        transformers' processed scores each token was drawn from (``generate(output_scores=
        True)``, ``hf.decode.emitted_scores``): then p_t = softmax(scores) in float64 — the
        engine's own law, no teacher forward of the target — and only q_t is teacher-forced.
    """
    V = int(hf_model_of(target).config.vocab_size)
    if target_scores is not None:
        V = int(target_scores.shape[-1])
    tokens = forced_tokens(tokens, params, prompt, V, "hf_teacher_force")
    B, T = (int(s) for s in tokens.shape)
    L = len(prompt)
    if target_scores is not None and (
        target_scores.dim() != 3 or tuple(target_scores.shape[:2]) != (B, T)
    ):
        raise InputError(
            f"hf_teacher_force: target_scores must be [{B}, {T}, V], "
            f"got {tuple(target_scores.shape)!r}"
        )
    prompt_t = torch.tensor([int(t) for t in prompt], dtype=torch.int64)  # [L]
    parts = []
    # rows with equal params share one warper pass; chunks bound the float64 [b, T, V] tensors
    chunk = max(1, MAX_CHUNK_ELEMENTS // max(1, T * V))
    for lo, hi in param_runs(params, chunk):
        toks = tokens[lo:hi]  # [b, T]
        b = hi - lo
        seqs = torch.cat([prompt_t.expand(b, L), toks], dim=1)  # [b, L + T]
        if target_scores is None:
            p = forced_probs(target, seqs, L, params[lo])  # [b, T, V]
        else:
            p = scores_probs(target_scores[lo:hi].cpu(), params[lo])  # [b, T, V]
        q = None if draft is None else forced_probs(draft, seqs, L, params[lo]).reshape(b * T, V)
        parts.append(whitebox_columns(p.reshape(b * T, V), q, toks.reshape(b * T)))
    return columns_frame(parts)


def draft_law(logits: torch.Tensor, params: SamplingParams, law: str) -> torch.Tensor:
    """A candidate for the draft law q from float32 draft ``logits [B, T, V]`` (``Q_LAWS``).

    ``raw``: softmax of the unwarped logits (what 4.44 uses as q); ``processed``: warpers once
    (the correct q); ``processed_twice``: warpers twice (what 5.x's assistant samples from).
    """
    if law not in Q_LAWS:
        raise ConfigError(f"draft law must be one of {Q_LAWS}, got {law!r}")
    if law == "raw":
        return torch.softmax(logits.double(), dim=-1)
    return processed_probs(logits, params, times=2 if law == "processed_twice" else 1)
