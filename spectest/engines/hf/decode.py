"""Rows → tokens with transformers: the ``hf-generate`` and ``hf-assisted`` decode functions.

Owns one pinned ``generate`` call (plain: a batch of rows of one prompt and config; assisted: one
row with its rounds), the split of a job into calls, the scores each token was drawn from
(bounded by ``SCORES_BUDGET``) and ``hf_plain_decode`` / ``hf_assisted_decode``, which return an
``ArmOutput``. Knows nothing about protocols, files or statistics. Randomness and
``output_scores``: docs/engines-hf.md "Randomness" and "White-box columns".
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
import torch

from spectest.engines.base import ArmOutput, DecodeRequest, RowSpec, check_rows
from spectest.engines.hf.laws import hf_teacher_force, param_runs
from spectest.engines.hf.pinning import (
    HF_ASSISTED,
    HF_GENERATE,
    assistant_settings,
    generation_config,
    hf_model_of,
    own_generation_config,
    processors,
)
from spectest.engines.hf.rounds import RoundRecorder, record_rounds, rounds_frame_of
from spectest.errors import ConfigError, EngineError, ModelError
from spectest.sampling.params import SamplingParams
from spectest.seeding import row_key

# white-box with output_scores: at most this many float32 score elements per plain batch (1 GiB)
SCORES_BUDGET = 1 << 28


def whitebox_batch(batch_size: int, num_tokens: int, vocab_size: int) -> int:
    """Rows per plain ``generate`` call when its scores are kept (``SCORES_BUDGET``)."""
    return max(1, min(batch_size, SCORES_BUDGET // max(1, num_tokens * vocab_size)))


def _check_prompt(prompt_ids: torch.Tensor, vocab_size: int) -> None:
    assert prompt_ids.dim() == 1 and prompt_ids.dtype == torch.int64, (
        prompt_ids.shape,
        prompt_ids.dtype,
    )
    if prompt_ids.numel() == 0:
        raise ConfigError("hf backend: the prompt is empty (transformers needs at least one token)")
    if int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= vocab_size:
        raise ConfigError(
            f"hf backend: prompt token ids must be in [0, {vocab_size}), "
            f"got {prompt_ids.tolist()!r}"
        )


@contextlib.contextmanager
def _seeded(device: torch.device, seed: int) -> Iterator[None]:
    """Inference with torch's global generator seeded to ``seed`` (a row key), the caller's state
    restored after (docs/engines-hf.md "Randomness")."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with torch.inference_mode():
            torch.manual_seed(int(seed))
            yield


def _generate(hf: Any, ids: torch.Tensor, gc: Any, **kw: Any) -> Any:
    """``hf.generate`` on ``ids [b, L]`` (no padding) under ``gc``."""
    return hf.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc, **kw
    )


def emitted_scores(out: Any, rows: int, num_tokens: int, where: str) -> torch.Tensor:
    """``out.scores`` of ``generate(output_scores=True)`` as ``[rows, num_tokens, V]`` float32.

    Checks what the white-box columns rely on: one score tensor per emitted token, each
    ``[rows, V]`` (``EngineError`` otherwise: this transformers' scores are not per token).
    """
    scores = getattr(out, "scores", None)
    if scores is None or len(scores) != num_tokens:
        n = None if scores is None else len(scores)
        raise EngineError(
            f"{where}: output_scores returned {n!r} score tensors for {num_tokens} emitted tokens "
            "(one per token expected): this transformers' scores cannot give white-box columns"
        )
    shapes = {tuple(sc.shape) for sc in scores}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[0] != rows:
        raise EngineError(
            f"{where}: output_scores shapes {sorted(shapes)!r}, expected one [{rows}, V] per token"
        )
    return torch.stack([sc.float() for sc in scores], dim=1)  # [rows, T, V]


def generate_plain(
    model: Any,
    prompt_ids: torch.Tensor,
    params: SamplingParams,
    num_tokens: int,
    batch_size: int,
    seed: int,
    output_scores: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One batched ``model.generate`` call: ``batch_size`` rows of the same prompt ``[L]`` and
    params, seeded with ``seed`` (a row key): ``[batch_size, num_tokens]`` int64 tokens (CPU)
    and, with ``output_scores``, the processed scores each was drawn from, ``[batch_size,
    num_tokens, V]`` float32 on the model's device (``emitted_scores``), else None."""
    hf = hf_model_of(model)
    V = int(hf.config.vocab_size)
    _check_prompt(prompt_ids, V)
    dev = hf.device
    L = int(prompt_ids.shape[0])
    ids = prompt_ids.to(dev)[None, :].expand(batch_size, L).contiguous()  # [B, L]
    gc = generation_config(params, num_tokens, V, output_scores)
    with own_generation_config(model), _seeded(dev, seed):
        out = _generate(hf, ids, gc, logits_processor=processors(model, None))
    toks = _new_tokens(out, batch_size, L, num_tokens, HF_GENERATE)  # [B, T]
    scores = emitted_scores(out, batch_size, num_tokens, HF_GENERATE) if output_scores else None
    return toks, scores  # [B, T], [B, T, V] | None


def _new_tokens(out: Any, rows: int, L: int, T: int, engine: str) -> torch.Tensor:
    """``out.sequences [rows, L + T]`` past the prompt: ``[rows, T]`` int64 on the CPU;
    ``ModelError`` for any other shape."""
    seq = out.sequences
    if tuple(seq.shape) != (rows, L + T):
        raise ModelError(
            f"{engine}: expected sequences of shape {(rows, L + T)!r}, got {tuple(seq.shape)!r}"
        )
    return seq[:, L:].cpu()


def generate_assisted(
    target: Any,
    draft: Any,
    prompt_ids: torch.Tensor,
    params: SamplingParams,
    num_tokens: int,
    num_assistant_tokens: int,
    seed: int,
    confidence_threshold: float = 0.0,
    keep_scores: bool = False,
    output_scores: bool = False,
) -> tuple[torch.Tensor, RoundRecorder]:
    """One assisted ``generate`` call (batch size 1) with the round telemetry.

    With ``output_scores``, ``recorder.emitted`` holds the processed target scores of every
    emitted token, ``[1, num_tokens, V]`` float32 (``emitted_scores``; docs/engines-hf.md).

    Returns the tokens ``[num_tokens]`` int64 (CPU) and the ``RoundRecorder``: ``.rounds`` (one
    ``RoundRecord`` per round) and, with ``keep_scores``, ``.scores``.
    """
    hf_t, hf_d = hf_model_of(target), hf_model_of(draft)
    V = int(hf_t.config.vocab_size)
    if int(hf_d.config.vocab_size) != V:
        raise ModelError(
            f"hf-assisted: vocabulary mismatch: target V={V!r}, "
            f"draft V={int(hf_d.config.vocab_size)!r}"
        )
    _check_prompt(prompt_ids, V)
    dev = hf_t.device
    L = int(prompt_ids.shape[0])
    ids = prompt_ids.to(dev)[None, :]  # [1, L]
    gc = generation_config(params, num_tokens, V, output_scores)
    procs = processors(target, draft)
    with (
        own_generation_config(target),
        assistant_settings(draft, num_assistant_tokens, confidence_threshold),
        record_rounds(target, L, keep_scores) as rec,
        _quiet_assistant_kwargs(),
        _seeded(dev, seed),
    ):
        out = _generate(hf_t, ids, gc, assistant_model=hf_d, logits_processor=procs)
    toks = _new_tokens(out, 1, L, num_tokens, HF_ASSISTED)[0]  # [T]
    emitted = sum(r.emitted for r in rec.rounds)
    if emitted != num_tokens:
        raise ModelError(
            f"hf-assisted: round telemetry accounts for {emitted!r} tokens, expected {num_tokens!r}"
        )
    if output_scores:
        rec.emitted = emitted_scores(out, 1, num_tokens, HF_ASSISTED)
    return toks, rec


# transformers' own assistant loop (``candidate_generator._prepare_generation_args``) passes
# these next to a generation_config, which its ``generate`` then calls deprecated: not ours to fix
_ASSISTANT_KWARGS = {"min_new_tokens", "max_new_tokens", "use_cache"}
_DEPRECATION = "Passing `generation_config` together with generation-related arguments="


class _AssistantKwargsFilter(logging.Filter):
    """Drops exactly that warning, and only when its arguments are the assistant loop's."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if not msg.startswith(_DEPRECATION):
            return True
        named = set(re.findall(r"'(\w+)'", msg.split("=", 1)[1].split(")", 1)[0]))
        return not (named and named <= _ASSISTANT_KWARGS)


@contextlib.contextmanager
def _quiet_assistant_kwargs() -> Iterator[None]:
    """``_AssistantKwargsFilter`` on transformers' generation logger while assisted generation
    runs (``spectest bench`` printed the warning for every hf-assisted arm)."""
    log, f = logging.getLogger("transformers.generation.utils"), _AssistantKwargsFilter()
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)


# ----------------------------------------------------------------------------- rows → ArmOutput
def _check_rows(model: Any, req: DecodeRequest, batch_size: int) -> torch.Tensor:
    check_rows(req.rows, req.num_positions, batch_size)
    ids = [int(t) for t in req.prompt]
    prompt_t = torch.tensor(ids, dtype=torch.int64)  # [L]
    _check_prompt(prompt_t, int(hf_model_of(model).config.vocab_size))
    return prompt_t


def plain_batches(rows: Sequence[RowSpec], batch_size: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` slices of ``rows``: consecutive rows with equal params, at most ``batch_size``.

    One ``generate`` call takes one ``GenerationConfig``, so a batch never mixes params.
    """
    return param_runs([r.params for r in rows], batch_size)


def hf_plain_decode(model: Any, req: DecodeRequest, *, draft: Any | None = None) -> ArmOutput:
    """Reference arm ``hf-generate``: batched ``model.generate(do_sample=True)``.

    Same signature and output as ``builtin.plain_decode``. Batch seed = the row key of the
    batch's first row (docs/engines-hf.md "Randomness"). With
    ``whitebox``, the white-box columns from transformers' own scores (p_t) and the teacher-forced
    ``draft`` (q_t, or none), each batch reduced before the next (``whitebox_batch`` rows).
    """
    prompt_t = _check_rows(model, req, req.batch_size)
    rows, T, batch_size = req.rows, req.num_positions, req.batch_size
    if req.whitebox:
        batch_size = whitebox_batch(batch_size, T, int(hf_model_of(model).config.vocab_size))
    chunks, wb = [], []
    for lo, hi in plain_batches(rows, batch_size):
        first = rows[lo]
        seed = row_key(req.run_key, req.prompt_id, first.config_id, first.seed)
        toks, scores = generate_plain(
            model, prompt_t, first.params, T, hi - lo, seed, output_scores=req.whitebox
        )
        chunks.append(toks)
        if scores is not None:
            wb.append(_scored_whitebox(model, draft, req.prompt, rows[lo:hi], toks, scores))
        req.tick(hi)
    frame = pd.concat(wb, ignore_index=True) if req.whitebox else None
    return ArmOutput(torch.cat(chunks, dim=0).numpy(), None, False, frame)


def _scored_whitebox(
    target: Any,
    draft: Any | None,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    tokens: torch.Tensor,
    scores: torch.Tensor,
) -> pd.DataFrame:
    """White-box columns of ``tokens [b, T]`` with p_t = softmax(``scores [b, T, V]``)."""
    return hf_teacher_force(
        target, prompt, [r.params for r in rows], tokens, draft=draft, target_scores=scores
    )


def hf_assisted_decode(
    target: Any,
    draft: Any,
    req: DecodeRequest,
    *,
    num_assistant_tokens: int,
    confidence_threshold: float = 0.0,
    draft_teacher: Any | None = None,
) -> ArmOutput:
    """Candidate arm ``hf-assisted``: one assisted ``generate`` per row (batch size 1).

    With ``whitebox``: the white-box columns with p_t from transformers' own scores of each
    emitted token and q_t from teacher forcing ``draft_teacher`` (or none).

    Output as ``builtin.speculative_decode``: ``rounds`` has ``row, round, position, drafted,
    accepted, emitted`` plus ``ROUND_EXTRA_COLUMNS`` (per round: verified draft positions, and the
    sums over them of transformers' own ``engine_accept_prob`` and ``engine_overlap``, see
    ``RoundRecord``). Each row's seed is its row key: reproducible per row.
    """
    prompt_t = _check_rows(target, req, 1)
    rows, T = req.rows, req.num_positions
    toks = []
    frames = []
    scored: list[torch.Tensor] = []  # [1, T, V] each, reduced every ``whitebox_batch`` rows
    wb: list[pd.DataFrame] = []
    every = whitebox_batch(len(rows), T, int(hf_model_of(target).config.vocab_size))
    for i, r in enumerate(rows):
        seed = row_key(req.run_key, req.prompt_id, r.config_id, r.seed)
        t, rec = generate_assisted(
            target,
            draft,
            prompt_t,
            r.params,
            T,
            num_assistant_tokens,
            seed,
            confidence_threshold,
            output_scores=req.whitebox,
        )
        toks.append(t[None, :])  # [1, T]
        frames.append(rounds_frame_of(i, rec.rounds))
        if rec.emitted is not None:
            scored.append(rec.emitted)
            if len(scored) == every or i + 1 == len(rows):
                lo = i + 1 - len(scored)
                done = torch.cat(toks[lo:], dim=0)  # [b, T]
                s_b = torch.cat(scored, dim=0)  # [b, T, V]
                part = rows[lo : i + 1]
                wb.append(_scored_whitebox(target, draft_teacher, req.prompt, part, done, s_b))
                scored = []
        req.tick(i + 1)
    frame = pd.concat(wb, ignore_index=True) if req.whitebox else None
    rounds = pd.concat(frames, ignore_index=True)
    return ArmOutput(torch.cat(toks, dim=0).numpy(), rounds, False, frame)
