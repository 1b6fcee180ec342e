"""Teacher forcing with transformers' own logits processors: the laws the hf backend should follow.

Owns: ``hf_warpers`` (the processor list transformers builds for a sampled ``SamplingParams``, in
its order: temperature → top-k → top-p → min-p, each with transformers' own skip rule), and the
float64 laws along emitted sequences: ``target_probs`` (p_t, what plain ``generate`` samples
from), ``draft_probs`` (q_t, the processed draft law a correct speculative sampler proposes from)
and ``probe_draft_law`` (which law a given transformers release *actually* uses as q).

Knows nothing about statistics or the white-box column definitions (``engines.teacher`` turns
p and q into columns), nor about how sequences were produced.

Notes
-----
Why transformers' processors and not ``spectest.sampling.transforms.logits_to_probs``: the
reference of an hf arm is what transformers' plain ``generate`` samples from, so p_t must come
from the same float32 warper chain. Both pipelines apply the same steps in the same order; they
differ only by float32 vs float64 temperature and by boundary rounding of top-p (HF removes a
token when the ascending cumsum is ``<= 1 - top_p``; spectest keeps it when the mass strictly before
it is ``< top_p``): equal up to ~1e-6 except at exact top-p/top-k boundary ties — checked in
tests/test_engine_hf.py.

What each release's assistant proposes from (read in transformers' source, and checked by
recording the processors ``generate`` builds — tests/test_engine_hf.py):

- 5.x (``AssistedCandidateGenerator``): the assistant's ``generate`` receives the target's
  generation config (``do_sample=True``, same temperature/top-k/top-p/min-p) *and* the target's
  processor list, which already holds the warpers; ``_get_logits_processor`` merges that list and
  then appends the warpers again. The draft therefore samples from the warpers applied twice
  (temperature T², top-p and min-p re-applied on the truncated law; top-k is idempotent), and
  ``_speculative_sampling`` uses q = softmax of those twice-processed scores — the law it sampled
  from, so the output stays exact; only acceptance (speed) changes.
- 4.44 (before transformers #33534): the assistant runs greedily (``do_sample=False``, warpers
  off) and ``_speculative_sampling`` uses q = softmax of its unwarped scores while the token is
  the argmax: q is not the law the token was drawn from (transformers #32867) — not exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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

from spectest import schema
from spectest.engines.hf import generate_assisted, hf_model_of, logit_scale_of
from spectest.engines.teacher import MAX_CHUNK_ELEMENTS, whitebox_columns
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
    does through ``hf.LogitScale``). Runs in chunks of ``chunk`` rows (memory).
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


def processed_probs(logits: torch.Tensor, params: SamplingParams, times: int = 1) -> torch.Tensor:
    """float64 law ``[B, T, V]`` from float32 ``logits [B, T, V]``: warpers applied ``times`` times.

    Greedy params give the one-hot argmax (torch's first maximal index, as ``generate``).
    NOTE: the warpers run in float32 like ``generate``; only the final softmax is float64, so
    filtered tokens are exact zeros and rows sum to 1 within 1e-15.
    """
    assert logits.dim() == 3, logits.shape
    if params.is_greedy:
        probs = torch.zeros(logits.shape, dtype=torch.float64)
        return probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
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
        probs = torch.zeros(scores.shape, dtype=torch.float64)
        return probs.scatter_(-1, scores.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(scores.double(), dim=-1)


def target_probs(
    model: Any, sequences: torch.Tensor, prompt_len: int, params: SamplingParams
) -> torch.Tensor:
    """p_t ``[B, T, V]`` float64: what plain ``generate`` samples token t from."""
    return processed_probs(next_token_logits(model, sequences, prompt_len), params)


def draft_probs(
    model: Any, sequences: torch.Tensor, prompt_len: int, params: SamplingParams
) -> torch.Tensor:
    """q_t ``[B, T, V]`` float64: the processed draft law (what a correct drafter proposes from)."""
    return processed_probs(next_token_logits(model, sequences, prompt_len), params)


def hf_teacher_force(
    target: Any,
    prompt: Sequence[int],
    params: Sequence[SamplingParams],
    tokens: torch.Tensor,
    *,
    draft: Any | None = None,
    target_scores: torch.Tensor | None = None,
) -> pd.DataFrame:
    """White-box columns of an hf arm, aligned with ``builtin.to_samples_frame``.

    Same contract as ``engines.teacher.teacher_force`` but p_t (and q_t, the processed draft law,
    with ``draft``) come from transformers' own warpers (``target_probs`` / ``draft_probs``);
    ``engines.teacher.whitebox_columns`` turns them into columns.

    Parameters
    ----------
    tokens : int64 ``[B, T]`` (``EngineOutput.tokens``); ``params``: one per row.
    target_scores : float32 ``[B, T, V]`` (any device), optional
        transformers' processed scores each token was drawn from (``generate(output_scores=
        True)``, ``engines.hf.emitted_scores``): then p_t = softmax(scores) in float64 — the
        engine's own law, no teacher forward of the target — and only q_t is teacher-forced.
    """
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise InputError(
            "hf_teacher_force: tokens must be int64 [B, T], "
            f"got {tokens.dtype} {tuple(tokens.shape)}"
        )
    B, T = (int(s) for s in tokens.shape)
    if len(params) != B:
        raise InputError(f"hf_teacher_force: {B} token rows but {len(params)} params")
    L = len(prompt)
    if L == 0:
        raise InputError("hf_teacher_force: prompt must hold at least one token id, got []")
    V = int(hf_model_of(target).config.vocab_size)
    if target_scores is not None:
        if target_scores.dim() != 3 or tuple(target_scores.shape[:2]) != (B, T):
            raise InputError(
                f"hf_teacher_force: target_scores must be [{B}, {T}, V], "
                f"got {tuple(target_scores.shape)!r}"
            )
        V = int(target_scores.shape[2])
    prompt_t = torch.tensor([int(t) for t in prompt], dtype=torch.int64)  # [L]
    cols: dict[str, list[np.ndarray]] = {c: [] for c in schema.WHITEBOX_COLUMNS}
    # rows with equal params share one warper pass; chunks bound the float64 [b, T, V] tensors
    chunk = max(1, MAX_CHUNK_ELEMENTS // max(1, T * V))
    lo = 0
    while lo < B:
        hi = lo + 1
        while hi < B and hi - lo < chunk and params[hi] == params[lo]:
            hi += 1
        toks = tokens[lo:hi]  # [b, T]
        b = hi - lo
        seqs = torch.cat([prompt_t.expand(b, L), toks], dim=1)  # [b, L + T]
        if target_scores is None:
            p = target_probs(target, seqs, L, params[lo])  # [b, T, V]
        else:
            p = scores_probs(target_scores[lo:hi].cpu(), params[lo])  # [b, T, V]
        q = None if draft is None else draft_probs(draft, seqs, L, params[lo]).reshape(b * T, V)
        out = whitebox_columns(p.reshape(b * T, V), q, toks.reshape(b * T))
        for c in schema.WHITEBOX_COLUMNS:
            cols[c].append(out[c].cpu().numpy())
        lo = hi
    return pd.DataFrame({c: np.concatenate(cols[c]) for c in schema.WHITEBOX_COLUMNS})


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


ACCEPTANCE_MODELS = ("processed", "processed_twice", "greedy_raw_q")


def expected_acceptance(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    params: SamplingParams,
    tokens: torch.Tensor,
    chunk: int = 256,
) -> dict[str, torch.Tensor]:
    """Per emitted position, the acceptance probability of a draft slot there under each drafter.

    ``processed``: Σ min(p, q) with q the processed draft law (the q the draft *should* use);
    ``processed_twice``: Σ min(p, q) with the warpers applied twice (5.x's assistant);
    ``greedy_raw_q``: min(1, p(x*) / q_raw(x*)), x* the argmax of the draft logits and q_raw their
    plain softmax (4.44: greedy token, q = raw softmax). Each is a function of the prefix only,
    so it is the conditional mean of the accept indicator of a slot verified there (the
    martingale behind ``stats.whitebox.acceptance_test``).

    Parameters
    ----------
    tokens : int64 ``[B, T]`` emitted tokens (one config: ``params``).

    Returns
    -------
    dict ``ACCEPTANCE_MODELS`` → float64 ``[B, T]``.
    """
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise InputError(
            f"expected_acceptance: tokens must be int64 [B, T], got {tokens.dtype} "
            f"{tuple(tokens.shape)}"
        )
    B = int(tokens.shape[0])
    L = len(prompt)
    prompt_t = torch.tensor([int(t) for t in prompt], dtype=torch.int64)  # [L]
    out: dict[str, list[torch.Tensor]] = {m: [] for m in ACCEPTANCE_MODELS}
    for lo in range(0, B, chunk):
        toks = tokens[lo : lo + chunk]  # [b, T]
        seqs = torch.cat([prompt_t.expand(toks.shape[0], L), toks], dim=1)  # [b, L + T]
        p = target_probs(target, seqs, L, params)  # [b, T, V]
        d_logits = next_token_logits(draft, seqs, L)  # [b, T, V]
        for law in ("processed", "processed_twice"):
            q = draft_law(d_logits, params, law)  # [b, T, V]
            out[law].append(torch.minimum(p, q).sum(-1))  # [b, T]
        x_star = d_logits.argmax(-1, keepdim=True)  # [b, T, 1]
        q_raw = draft_law(d_logits, params, "raw").gather(-1, x_star)[..., 0]  # [b, T]
        p_star = p.gather(-1, x_star)[..., 0]  # [b, T]
        out["greedy_raw_q"].append(torch.clamp(p_star / q_raw, max=1.0))
    return {m: torch.cat(v, dim=0) for m, v in out.items()}


@dataclass(frozen=True)
class DraftLawProbe:
    """Which law transformers' assisted generation used as q, measured on one run.

    ``max_abs_diff[law]``: max over drafted positions and tokens of |q_engine − q_law| (q_engine =
    softmax of the draft scores transformers returned); ``q_law``: the law with the smallest
    difference (``"unknown"`` when none is below ``tol``); ``argmax_fraction``: share of drafted
    tokens that are the argmax of the draft logits (1.0 for a greedy drafter; for a sampled one
    it is below 1 unless the law is degenerate); ``n_positions``: drafted positions compared.
    """

    q_law: str
    max_abs_diff: dict[str, float]
    argmax_fraction: float
    n_positions: int


def probe_draft_law(
    target: Any,
    draft: Any,
    prompt_ids: torch.Tensor,
    params: SamplingParams,
    num_tokens: int,
    num_assistant_tokens: int,
    seeds: Sequence[int],
    tol: float = 1e-4,
) -> DraftLawProbe:
    """Run assisted generation and compare the q it used with ``Q_LAWS`` by teacher forcing.

    Each round's drafted positions are re-scored by teacher forcing the draft along
    ``prompt + emitted prefix + drafted tokens`` (the prefixes the assistant saw).
    """
    assert prompt_ids.dim() == 1, prompt_ids.shape
    diffs = {law: 0.0 for law in Q_LAWS}
    n = 0
    n_argmax = 0
    L = int(prompt_ids.shape[0])
    for seed in seeds:
        tokens, rec = generate_assisted(
            target,
            draft,
            prompt_ids,
            params,
            num_tokens,
            num_assistant_tokens,
            int(seed),
            keep_scores=True,
        )
        for pos, drafted, q_scores, _ in rec.scores:
            d = int(drafted.shape[0])
            if d == 0 or q_scores is None:
                continue
            seq = torch.cat([prompt_ids, tokens[:pos], drafted])[None, :]  # [1, L + pos + d]
            logits = next_token_logits(draft, seq, L + pos)  # [1, d, V]
            q_engine = torch.softmax(q_scores.double(), dim=-1)  # [d, V]
            for law in Q_LAWS:
                q_law = draft_law(logits, params, law)[0]  # [d, V]
                diffs[law] = max(diffs[law], float((q_engine - q_law).abs().max()))
            n_argmax += int((logits[0].argmax(-1) == drafted).sum())
            n += d
    if n == 0:
        raise ConfigError("probe_draft_law: no drafted positions (num_tokens too small?)")
    best = min(Q_LAWS, key=lambda law: diffs[law])
    return DraftLawProbe(best if diffs[best] < tol else "unknown", diffs, n_argmax / n, n)
