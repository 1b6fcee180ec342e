"""The built-in batched engines: plain decode and speculative decode over ``LanguageModel`` s.

Owns: the decode loops (``plain_decode``, ``speculative_decode``) and their output
(``EngineOutput``), slow per-row references of both loops (``plain_decode_reference``,
``speculative_decode_reference``: no cache, no batching, tested token-for-token equal in
tests/test_engine.py), and ``BuiltinEngine``: the loops as the ``builtin`` engine of the
contract (``spectest.engines.base``; a plain arm when the job has no variant, else speculative).

Knows nothing about statistics or files, and nothing about *which* sampler is correct: the
speculative loop calls the hooks of a ``SpecVariant`` (exact or a mutant). Both arms go through
the same probability pipeline (``logits_to_probs``; the exact variant's ``verify_probs`` and
``draft_law`` call it too), so only the sampler differs between arms.

Batching and RNG
----------------
One call = one prompt × many rows (config_id, seed, SamplingParams), processed in chunks of
``batch_size``. Every uniform comes from ``seeding.uniforms`` keyed by
``row_key(run_key, prompt_id, config_id, seed)``, so a row's tokens do not depend on the batch it
runs in (tested: alone vs inside a shuffled batch). Draw protocol (``seeding`` docstring): plain,
one uniform per token at ``step = position``; speculative round starting at position ``s``,
``step = s`` with ``spec_slots(K, onehot)``.

Speculative loop (Leviathan et al. 2023, arXiv 2211.17192)
----------------------------------------------------------
All rows run rounds in lock step with static shapes. At a round's start each cache holds the
prompt and every committed token except the last one, ``last`` (pending). A round: the draft
proposes ``x_1..x_K`` (K one-token forwards fed ``last, x_1, ..., x_{K-1}``, plus ``x_K`` so that
both caches gain the same ``K + 1`` slots); the target scores ``[last, x_1..x_K]`` in one forward
(``K + 1`` positions of p); the variant's sampler returns ``num_accepted = a`` and the emitted
tokens (``x_1..x_a`` then one recovered or bonus token); the slots of ``x_{a+1}..x_K`` become
holes in both caches and the last emitted token becomes ``last``. Rows that reached
``num_positions`` keep computing (static shapes) but commit nothing.

Truncation: the last round of a row may emit past ``num_positions``; the surplus is dropped. This
does not bias the law of the kept prefix: under exact speculative sampling the emitted sequence
is, token by token, distributed as plain autoregressive sampling, so any prefix of it has the
plain prefix law whatever the round boundaries are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.engines.base import (
    ArmJob,
    ArmOutput,
    DrafterSpec,
    Engine,
    Models,
    RowSpec,
    check_rows,
    rounds_frame,
    samples_frame,
)
from spectest.errors import ConfigError, InputError, ModelError
from spectest.models.base import LanguageModel
from spectest.sampling.draw import argmax_tokens, categorical
from spectest.sampling.fast import CandidateLaw, _draft_fast
from spectest.sampling.mutants import SpecVariant, get_variant, stack_q
from spectest.sampling.params import SamplingTensors
from spectest.sampling.rejection import rejection_sample_candidates
from spectest.sampling.transforms import logits_to_probs
from spectest.seeding import STREAM_PLAIN, STREAM_SPEC, row_key, spec_slots, uniforms

PLACEHOLDER_TOKEN_ID = -1
Progress = Callable[[int], None]


@dataclass(frozen=True)
class EngineOutput:
    """Tokens of every row (in ``rows`` order) and, for speculative runs, per-round telemetry.

    ``whitebox``: the generation-time white-box columns (``schema.WHITEBOX_COLUMNS``, ``B * T``
    rows aligned with ``to_samples_frame``) when the loop was asked to record them, else None.
    """

    tokens: torch.Tensor  # [B, T] int64, cpu
    rounds: pd.DataFrame | None  # row, round, position, drafted, accepted, emitted (int64)
    whitebox: pd.DataFrame | None = None  # wb_* columns from the laws the loop sampled from


_EXACT_VERIFY = get_variant("exact").verify_fn
_TRUTHFUL_DRAFT = (get_variant("exact").draft_fn, _draft_fast)  # q reported = q sampled from


@dataclass(frozen=True)
class Pipeline:
    """How a decode loop turns logits into laws: the reference pipeline (``REFERENCE``: the exact
    float64 ``logits_to_probs``, variants as built, inputs of every draw checked) or the fast
    one (``engines.fast.FAST``: ``sampling/fast.py``, equal up to reduction order).

    ``exact_verify`` lists the verify hooks whose rows *are* the plain law, so the white-box p of
    an emitted token can be read from them (a mutant's verify_probs is recomputed).

    ``candidates`` (fast pipeline only): the law as a ``sampling.fast.CandidateLaw``, or ``None``
    when some row is not decided on its candidates; the loops then draw on the candidates and,
    for a variant ``candidate_round`` accepts (the exact chain sampler on the pipeline's truthful
    hooks), run the round with ``rejection_sample_candidates`` — the same tokens as the dense
    laws (the NOTEs there); white-box columns are computed on the candidate laws
    (``teacher.whitebox_columns_candidates``, O(W) per token; ``_WhiteboxRecorder.record``)."""

    name: str
    probs: Callable[[torch.Tensor, SamplingTensors], torch.Tensor]  # [.., V] → [.., V] float64
    variant: Callable[[SpecVariant], SpecVariant]
    check: bool
    exact_verify: tuple[Callable[..., Any], ...]
    candidates: Callable[[torch.Tensor, SamplingTensors], CandidateLaw | None] | None = None
    candidate_round: Callable[[SpecVariant], bool] | None = None


REFERENCE = Pipeline("reference", logits_to_probs, lambda v: v, True, (_EXACT_VERIFY,))


# ----------------------------------------------------------------------------- plain


def plain_decode(
    model: LanguageModel,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    *,
    num_positions: int,
    run_key: int,
    prompt_id: str,
    batch_size: int = 256,
    progress: Progress | None = None,
    whitebox: bool = False,
    draft: LanguageModel | None = None,
    drafter: DrafterSpec | None = None,
    pipeline: Pipeline = REFERENCE,
) -> EngineOutput:
    """Plain autoregressive sampling: one uniform per token, inverse CDF on ``logits_to_probs``
    (``pipeline.probs``).

    Returns ``EngineOutput`` with ``tokens`` ``[len(rows), num_positions]`` (cpu) and no rounds.
    With ``whitebox``, also the white-box columns of every emitted token from the very p_t row
    it was drawn from (``_WhiteboxRecorder``); q_t comes from ``draft`` run along the emitted
    sequence under ``drafter`` (the q the teacher would use), or is unknown without a draft.

    Notes
    -----
    Token ``t`` of a row is ``categorical(logits_to_probs(logits_t), u)`` with
    ``u = uniforms(row key, STREAM_PLAIN, t, 1)``: a deterministic function of the row's key, so
    batch composition never matters. Verified token-for-token against ``plain_decode_reference``
    (no cache, one row at a time) on the toy LM and a tiny HF model (tests/test_engine.py).
    """
    prompt_t = _check_inputs(model, prompt, rows, num_positions, batch_size)
    model.reserve(len(prompt) + num_positions)
    wb_draft = _whitebox_draft(model, draft, drafter) if whitebox else None
    if wb_draft is not None:
        wb_draft[0].reserve(len(prompt) + num_positions)
    chunks, wb_parts = [], []
    for lo in range(0, len(rows), batch_size):
        part = rows[lo : lo + batch_size]
        keys = _keys(part, run_key, prompt_id, model.device)  # [B]
        params = SamplingTensors.from_params([r.params for r in part], device=model.device)
        rec = _WhiteboxRecorder(len(part), num_positions, model.device) if whitebox else None
        toks = _plain_chunk(model, prompt_t, keys, params, num_positions, rec, wb_draft, pipeline)
        chunks.append(toks.cpu())
        if rec is not None:
            wb_parts.append(rec.frame(num_positions))
        if progress is not None:
            progress(lo + len(part))
    wb = pd.concat(wb_parts, ignore_index=True) if whitebox else None
    return EngineOutput(torch.cat(chunks, dim=0), None, wb)


def _plain_chunk(
    model: LanguageModel,
    prompt: torch.Tensor,
    keys: torch.Tensor,
    params: SamplingTensors,
    T: int,
    rec: _WhiteboxRecorder | None = None,
    wb_draft: tuple[LanguageModel, DrafterSpec] | None = None,
    pipeline: Pipeline = REFERENCE,
) -> torch.Tensor:
    B = int(keys.shape[0])
    cache, prompt_logits = model.prefill_shared(prompt, B)  # one prompt forward for B rows
    logits = prompt_logits[-1].expand(B, -1)  # [B, V] next-token logits
    d_cache, d_logits = None, None
    if rec is not None and wb_draft is not None:
        d_cache, d_prompt_logits = wb_draft[0].prefill_shared(prompt, B)
        d_logits = d_prompt_logits[-1].expand(B, -1)  # [B, V] the draft's law at position 0
    out = torch.empty((B, T), dtype=torch.int64, device=model.device)  # [B, T]
    every = torch.ones(B, dtype=torch.bool, device=model.device)  # [B]
    for t in range(T):
        u = uniforms(keys, STREAM_PLAIN, t, 1)[:, 0]  # [B]
        law = None
        if pipeline.candidates is not None:
            law = pipeline.candidates(logits, params)  # on [B, W] candidates, or None
        if law is not None:
            out[:, t] = law.draw(u)  # [B] the dense draw's token (CandidateLaw.draw NOTE)
        else:
            probs = pipeline.probs(logits, params)  # [B, V] float64
            out[:, t] = categorical(probs, u, check=pipeline.check)  # [B]
        if rec is not None:
            p_wb: torch.Tensor | CandidateLaw
            if law is not None:  # the law drawn from, on its candidates: [B, 1, W]
                p_wb = CandidateLaw(law.ids[:, None], law.probs[:, None], law.vocab_size)
            else:
                p_wb = probs[:, None]  # [B, 1, V]
            q: torch.Tensor | CandidateLaw | None = None
            if wb_draft is not None and d_logits is not None:
                q = _teacher_q_law(d_logits[:, None], params, wb_draft[1], pipeline)  # [B, 1, *]
            at = torch.full((B,), t, dtype=torch.int64, device=model.device)  # [B]
            rec.record(p_wb, q, out[:, t : t + 1], at, every[:, None])
        if t + 1 < T:
            logits = model.forward(cache, out[:, t : t + 1])[:, 0]  # [B, V]
            if d_cache is not None and wb_draft is not None:
                d_logits = wb_draft[0].forward(d_cache, out[:, t : t + 1])[:, 0]  # [B, V]
    return out


# ----------------------------------------------------------------------------- speculative


def speculative_decode(
    target: LanguageModel,
    draft: LanguageModel,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    *,
    num_positions: int,
    drafter: DrafterSpec,
    variant: SpecVariant,
    run_key: int,
    prompt_id: str,
    batch_size: int = 256,
    progress: Progress | None = None,
    whitebox: bool = False,
    pipeline: Pipeline = REFERENCE,
) -> EngineOutput:
    """Speculative sampling with ``variant``'s hooks (``pipeline.variant(variant)``); telemetry
    one row per (row, round).

    Returns ``EngineOutput`` with ``tokens`` ``[len(rows), num_positions]`` (cpu) and ``rounds``
    (row, round, position, drafted, accepted, emitted; ``emitted`` capped by the budget). With
    ``whitebox``, also the white-box columns of every emitted token: token j of a round was
    produced under row j of the verify forward's p (``logits_to_probs`` of the target logits,
    the row the exact sampler used) and q is the drafter's exact law at that slot (the K draft
    forwards, plus the forward of x_K for the bonus slot), as teacher forcing defines them.

    Notes
    -----
    The loop is in the module docstring. Assumptions: target and draft share the vocabulary and
    the device (``ModelError`` otherwise); ``drafter.k >= 1`` (``DrafterSpec``). Verified
    token-for-token (and telemetry) against ``speculative_decode_reference`` — full forwards on the
    committed sequence, no cache, one row at a time — for the exact variant and mutants, sampled
    and one-hot drafters, on the toy LM and a tiny HF model; greedy rows equal plain greedy; the
    law of the first two positions matches the toy LM's closed form (tests/test_engine.py).

    NOTE memory: every round appends ``K + 1`` slots to both caches for every row, so a chunk
    holds ``len(prompt) + rounds * (K + 1)`` slots at the end (rounds <= num_positions, set by the
    slowest row of the chunk); lower ``batch_size`` for long outputs with large models.
    """
    from spectest.models.derive import check_same_vocab

    check_same_vocab(target, draft)
    if target.device != draft.device:
        raise ModelError(
            f"target {target.name!r} is on {target.device}, draft {draft.name!r} on {draft.device}"
        )
    if not isinstance(drafter, DrafterSpec):
        raise ConfigError(f"drafter must be a DrafterSpec, got {drafter!r}")
    prompt_t = _check_inputs(target, prompt, rows, num_positions, batch_size)
    slots = len(prompt) + num_positions * (drafter.k + 1)  # every round appends K+1 slots
    target.reserve(slots)
    draft.reserve(slots)
    variant = pipeline.variant(variant)
    chunks, frames, wb_parts = [], [], []
    for lo in range(0, len(rows), batch_size):
        part = rows[lo : lo + batch_size]
        keys = _keys(part, run_key, prompt_id, target.device)  # [B]
        params = SamplingTensors.from_params([r.params for r in part], device=target.device)
        width = num_positions + drafter.k + 1
        rec = _WhiteboxRecorder(len(part), width, target.device) if whitebox else None
        toks, rounds = _spec_chunk(
            target, draft, prompt_t, keys, params, num_positions, drafter, variant, rec, pipeline
        )
        chunks.append(toks.cpu())
        rounds["row"] += lo
        frames.append(rounds)
        if rec is not None:
            wb_parts.append(rec.frame(num_positions))
        if progress is not None:
            progress(lo + len(part))
    wb = pd.concat(wb_parts, ignore_index=True) if whitebox else None
    return EngineOutput(torch.cat(chunks, dim=0), pd.concat(frames, ignore_index=True), wb)


def _spec_chunk(
    target: LanguageModel,
    draft: LanguageModel,
    prompt: torch.Tensor,
    keys: torch.Tensor,
    params: SamplingTensors,
    T: int,
    drafter: DrafterSpec,
    variant: SpecVariant,
    rec: _WhiteboxRecorder | None = None,
    pipeline: Pipeline = REFERENCE,
) -> tuple[torch.Tensor, pd.DataFrame]:
    B, K, dev = int(keys.shape[0]), drafter.k, target.device
    onehot, q_mode = drafter.onehot, drafter.q_mode
    slots = spec_slots(K, onehot)
    tc, _ = target.prefill_shared(prompt[:-1], B)  # all but the pending token, once for B rows
    dc, _ = draft.prefill_shared(prompt[:-1], B)
    last = prompt[-1:].expand(B).clone()  # [B] pending token (committed, not yet in the caches)
    pos = torch.zeros(B, dtype=torch.int64, device=dev)  # [B] tokens emitted so far
    out = torch.full((B, T + K + 2), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=dev)
    DUMP = T + K + 1  # a scratch column for tokens that are not committed
    j = torch.arange(K + 1, device=dev)  # [K+1]
    log: list[tuple[torch.Tensor, ...]] = []
    # laws on candidates (no [B, K+1, V] float64 tensors but the white-box recorder's, if any):
    # the fast pipeline's exact sampler
    sparse = (
        pipeline.candidates is not None
        and pipeline.candidate_round is not None
        and pipeline.candidate_round(variant)
        and (onehot or q_mode == "processed")
    )
    while bool((pos < T).any()):
        active = pos < T  # [B]
        u = uniforms(keys, STREAM_SPEC, pos, slots.num_slots)  # [B, 2K+1] or [B, K+1]
        # 1. draft: K tokens from the draft law (argmax for a one-hot drafter: no uniform)
        tok, drafted, d_rows = last, [], []
        qs: list[torch.Tensor | CandidateLaw | None] = []
        for i in range(K):
            d_logits = draft.forward(dc, tok[:, None])[:, 0]  # [B, V]
            q: torch.Tensor | CandidateLaw | None
            q_c = None
            if sparse and not onehot and pipeline.candidates is not None:
                q_c = pipeline.candidates(d_logits, params)  # the processed q on candidates
            if sparse and onehot:
                tok, q = argmax_tokens(d_logits), None  # == argmax of the one-hot law
            elif q_c is not None:
                tok, q = q_c.draw(u[:, i]), q_c
            else:
                law, q_dense = variant.draft_law(d_logits, params, onehot=onehot, q_mode=q_mode)
                q = q_dense  # [B, V], or None: q = δ(x)
                if onehot:
                    tok = argmax_tokens(law)  # [B]
                else:
                    tok = categorical(law, u[:, i], check=pipeline.check)  # [B]
            drafted.append(tok)
            qs.append(q)  # [B, V], a CandidateLaw, or None: q = δ(x)
            d_rows.append(d_logits)
        # x_K too: the draft cache keeps the target's slot layout (and its logits are the
        # draft's law at the bonus slot, for the white-box q)
        d_rows.append(draft.forward(dc, tok[:, None])[:, 0])  # [B, V]
        draft_tokens = torch.stack(drafted, dim=1)  # [B, K]
        # 2. verify: the target scores last, x_1..x_K in one forward → K+1 next-token laws
        t_logits = target.forward(tc, torch.cat([last[:, None], draft_tokens], 1))  # [B, K+1, V]
        u_acc, u_fin = u[:, slots.accept], u[:, slots.final]  # [B, K], [B]
        p_c, target_probs = None, None
        if sparse and pipeline.candidates is not None:
            if onehot or all(isinstance(q, CandidateLaw) for q in qs):
                p_c = pipeline.candidates(t_logits, params)  # [B, K+1, W] or None
        if p_c is not None:
            q_laws = [q for q in qs if isinstance(q, CandidateLaw)]  # K laws, or none (one-hot)
            q_ids = torch.stack([q.ids for q in q_laws], 1) if q_laws else None  # [B, K, W]
            q_probs = torch.stack([q.probs for q in q_laws], 1) if q_laws else None  # [B, K, W]
            res = rejection_sample_candidates(
                p_c.ids, p_c.probs, q_ids, q_probs, draft_tokens, u_acc, u_fin
            )
        else:
            dense = [q.dense() if isinstance(q, CandidateLaw) else q for q in qs]
            draft_probs = stack_q(dense)  # [B, K, V] or None (one-hot drafter)
            target_probs = variant.verify_probs(t_logits, params)  # [B, K+1, V] float64
            res = variant.sample(target_probs, draft_probs, draft_tokens, u_acc, u_fin)
        n, a = res.num_emitted, res.num_accepted  # [B], [B]; emitted = accepted + recovered/bonus
        # 3. commit: the emitted tokens of active rows go to positions pos .. pos+n-1
        commit = (j[None, :] < n[:, None]) & active[:, None]  # [B, K+1]
        out.scatter_(1, torch.where(commit, pos[:, None] + j, DUMP), res.emitted)
        if rec is not None:
            # token j of the round was drawn under verify row j: record that p (the exact
            # pipeline's row — a mutant's verify_probs is not the plain law) and the drafter's q
            p_rows: torch.Tensor | CandidateLaw
            exact_p = variant.verify_fn in pipeline.exact_verify
            if p_c is None and exact_p and pipeline.candidates is not None:
                # a dense round (a mutant's hooks): the exact verify law on candidates, for the
                # white-box only (its dense() is bit-equal to the fast verify law,
                # ``candidate_probs``; the reference's up to float64 reduction order)
                p_c = pipeline.candidates(t_logits, params)  # [B, K+1, W] or None
            if not exact_p:  # a mutant's verify law is not the plain law: recompute it
                p_rows = logits_to_probs(t_logits, params)  # [B, K+1, V] float64
            elif p_c is not None:
                p_rows = p_c  # [B, K+1, W] the pipeline's verify law on its candidates
            else:  # a dense round with the exact verify hook (a candidate round sets p_c)
                assert target_probs is not None
                p_rows = target_probs  # [B, K+1, V] float64
            q_rows: torch.Tensor | CandidateLaw
            reported = [q for q in qs if q is not None]  # the K reported q's (a sampled drafter)
            if variant.draft_fn in _TRUTHFUL_DRAFT and onehot:
                # a truthful one-hot drafter drafted the argmax: q = δ(x_i) at the K draft
                # slots; only the bonus slot's argmax is computed
                bonus_tok = argmax_tokens(d_rows[K])[:, None]  # [B, 1]
                q_rows = _onehot_law(torch.cat([draft_tokens, bonus_tok], 1), target.vocab_size)
            elif variant.draft_fn in _TRUTHFUL_DRAFT and len(reported) == K and not onehot:
                # a truthful drafter's reported q IS the law teacher forcing defines (the same
                # pipeline call on the same logits): only the bonus slot's is computed
                bonus = _teacher_q_law(d_rows[K][:, None], params, drafter, pipeline)
                q_rows = _cat_laws(reported, bonus)  # [B, K+1, W] or [B, K+1, V]
            else:
                q_rows = _teacher_q_law(torch.stack(d_rows, dim=1), params, drafter, pipeline)
            rec.record(p_rows, q_rows, res.emitted, pos, commit)
        # 4. holes: this round's slots n0+j hold [last, x_1..x_K][j]; keep last and the committed
        # drafts x_1..x_{n-1} (emitted = those drafts + 1 token: the commit signal is n, not a)
        n0 = tc.num_slots - (K + 1)
        hole = torch.zeros((B, tc.num_slots), dtype=torch.bool, device=dev)  # [B, N]
        hole[:, n0:] = j[None, :] >= n[:, None]
        tc.invalidate(hole)
        dc.invalidate(hole)
        last = res.emitted.gather(1, (n - 1)[:, None])[:, 0]  # [B] the last emitted token
        log.append((active, pos.clone(), a, torch.minimum(n, T - pos)))
        pos = pos + torch.where(active, n, 0)
    return out[:, :T], _rounds_frame(log, K)


def _rounds_frame(log: list[tuple[torch.Tensor, ...]], K: int) -> pd.DataFrame:
    """Telemetry of active (row, round) pairs; ``emitted`` capped by the remaining budget."""
    active, pos, acc, emitted = (
        torch.stack([r[i] for r in log], dim=0).cpu().numpy() for i in range(4)
    )
    rnd, row = np.nonzero(active)  # [R, B] → active pairs, round-major
    order = np.lexsort((rnd, row))  # row-major, then round
    rnd, row = rnd[order], row[order]
    return pd.DataFrame(
        {
            "row": row.astype(np.int64),
            "round": rnd.astype(np.int64),
            "position": pos[rnd, row].astype(np.int64),
            "drafted": np.full(len(row), K, dtype=np.int64),
            "accepted": acc[rnd, row].astype(np.int64),
            "emitted": emitted[rnd, row].astype(np.int64),
        }
    )


# ----------------------------------------------------------------------------- white-box


# NOTE: the float64 [rows, V] temporaries of ``whitebox_columns`` (p, q, the order key, masks)
# stay under ~512 MiB each: 2^26 elements
_WB_CHUNK_ELEMENTS = 1 << 26


def _whitebox_draft(
    model: LanguageModel, draft: LanguageModel | None, drafter: DrafterSpec | None
) -> tuple[LanguageModel, DrafterSpec] | None:
    """The (draft, drafter) that defines q for a plain arm's white-box columns, checked."""
    if draft is None:
        return None
    if not isinstance(drafter, DrafterSpec):
        raise InputError("plain_decode: whitebox with a draft needs its drafter (DrafterSpec)")
    from spectest.models.derive import check_same_vocab

    check_same_vocab(model, draft)
    if model.device != draft.device:
        raise ModelError(
            f"target {model.name!r} is on {model.device}, draft {draft.name!r} on {draft.device}"
        )
    return draft, drafter


def _teacher_q(
    d_logits: torch.Tensor,
    params: SamplingTensors,
    drafter: DrafterSpec,
    pipeline: Pipeline = REFERENCE,
) -> torch.Tensor:
    """The drafter's exact law (what teacher forcing calls q) at each slot: ``[B, J, V]`` f64.

    ``d_logits`` ``[B, J, V]``: draft logits at J slots of each row. The exact variant's sample
    law, as ``engines.teacher.teacher_force`` computes it (one-hot at the argmax for a one-hot
    drafter, else the ``q_mode`` law) — never a mutant's reported q — on ``pipeline`` (the fast
    pipeline's law equals the reference's up to float64 reduction order, ``sampling/fast.py``).
    """
    exact = pipeline.variant(get_variant("exact"))
    J = int(d_logits.shape[1])
    laws = [
        exact.draft_law(d_logits[:, i], params, onehot=drafter.onehot, q_mode=drafter.q_mode)[0]
        for i in range(J)
    ]  # J × [B, V]
    return torch.stack(laws, dim=1)  # [B, J, V]


def _flat_law(law: torch.Tensor | CandidateLaw, N: int) -> torch.Tensor | CandidateLaw:
    """``[B, J, *]`` → ``[B*J, *]`` for a dense law or a ``CandidateLaw``."""
    if isinstance(law, CandidateLaw):
        W = int(law.ids.shape[-1])
        return CandidateLaw(law.ids.reshape(N, W), law.probs.reshape(N, W), law.vocab_size)
    return law.reshape(N, int(law.shape[-1]))


def _onehot_law(tok: torch.Tensor, V: int) -> CandidateLaw:
    """δ(tok) for token ids ``tok`` ``[B, J]``: a ``CandidateLaw`` ``[B, J, 1]``."""
    ones = torch.ones((*tok.shape, 1), dtype=torch.float64, device=tok.device)
    return CandidateLaw(tok[..., None], ones, V)


def _cat_laws(
    reported: list[torch.Tensor | CandidateLaw], bonus: torch.Tensor | CandidateLaw
) -> torch.Tensor | CandidateLaw:
    """The K reported q's (``[B, V]`` or ``CandidateLaw`` ``[B, W]`` each) and the bonus slot's
    law (``[B, 1, *]``) as one ``[B, K+1, *]`` law: on candidates when all are, else dense."""
    laws = [*(r[:, None] if isinstance(r, torch.Tensor) else _unsqueeze(r) for r in reported)]
    laws.append(bonus)
    if all(isinstance(law, CandidateLaw) for law in laws):
        cl = [law for law in laws if isinstance(law, CandidateLaw)]
        if len({int(law.ids.shape[-1]) for law in cl}) == 1:
            ids = torch.cat([law.ids for law in cl], dim=1)  # [B, K+1, W]
            probs = torch.cat([law.probs for law in cl], dim=1)  # [B, K+1, W]
            return CandidateLaw(ids, probs, cl[0].vocab_size)
    dense = [law.dense() if isinstance(law, CandidateLaw) else law for law in laws]
    return torch.cat(dense, dim=1)  # [B, K+1, V]


def _unsqueeze(law: CandidateLaw) -> CandidateLaw:
    return CandidateLaw(law.ids[:, None], law.probs[:, None], law.vocab_size)


def _law_width(law: torch.Tensor | CandidateLaw | None) -> int:
    if law is None:
        return 1
    return int((law.ids if isinstance(law, CandidateLaw) else law).shape[-1])


def _law_rows(law: torch.Tensor | CandidateLaw, lo: int, n: int) -> torch.Tensor | CandidateLaw:
    if isinstance(law, CandidateLaw):
        return CandidateLaw(law.ids[lo : lo + n], law.probs[lo : lo + n], law.vocab_size)
    return law[lo : lo + n]


def _teacher_q_law(
    d_logits: torch.Tensor,
    params: SamplingTensors,
    drafter: DrafterSpec,
    pipeline: Pipeline = REFERENCE,
) -> torch.Tensor | CandidateLaw:
    """``_teacher_q`` as a ``CandidateLaw`` ``[B, J, W]`` where the law is one on candidates.

    A one-hot drafter: δ(``argmax_tokens`` of the logits) with ``W = 1`` (the exact draft law's
    ``_onehot_argmax``, for every ``q_mode``; one slot at a time: ``[B, V]`` temporaries). A
    sampled ``q_mode="processed"`` drafter on a
    pipeline with ``candidates``: that call on the draft logits (``_draft_fast``'s law, its
    ``dense()`` bit-equal) when it decides every row. Otherwise (temperature/raw ``q_mode``: full
    support; the reference pipeline; a row not decided on candidates) the dense ``_teacher_q``.
    """
    J, V = int(d_logits.shape[1]), int(d_logits.shape[2])
    if drafter.onehot:
        tok = torch.stack([argmax_tokens(d_logits[:, i]) for i in range(J)], 1)  # [B, J]
        return _onehot_law(tok, V)
    if drafter.q_mode == "processed" and pipeline.candidates is not None:
        law = pipeline.candidates(d_logits, params)  # [B, J, W] or None
        if law is not None:
            return law
    return _teacher_q(d_logits, params, drafter, pipeline)


class _WhiteboxRecorder:
    """Generation-time white-box columns of one chunk of ``B`` rows.

    Buffers ``[B, width + 1]`` per ``schema.WHITEBOX_COLUMNS`` column (the last column is a
    scratch slot for tokens that are not committed), filled as tokens are committed; ``frame``
    returns the first ``T`` positions row-major, aligned with ``to_samples_frame``.
    """

    def __init__(self, B: int, width: int, device: torch.device) -> None:
        self.dump = width
        self.buf: dict[str, torch.Tensor] = {}
        for c in schema.WHITEBOX_COLUMNS:
            if c == schema.WB_IN_A:
                self.buf[c] = torch.zeros((B, width + 1), dtype=torch.bool, device=device)
            else:
                self.buf[c] = torch.full(
                    (B, width + 1), float("nan"), dtype=torch.float64, device=device
                )

    def record(
        self,
        p: torch.Tensor | CandidateLaw,
        q: torch.Tensor | CandidateLaw | None,
        tokens: torch.Tensor,
        start: torch.Tensor,
        commit: torch.Tensor,
    ) -> None:
        """Columns of ``tokens`` ``[B, J]`` under ``p`` (and ``q``) ``[B, J, V]`` float64 or
        ``CandidateLaw`` ``[B, J, W]``, stored at positions ``start[b] + j`` where ``commit``
        ``[B, J]`` (bool) holds.

        NOTE a ``CandidateLaw`` p takes ``teacher.whitebox_columns_candidates`` (O(B·J·W), q as a
        ``CandidateLaw`` or dense); a dense p takes ``whitebox_columns`` (a ``CandidateLaw`` q is
        densified). The two give the same values up to float64 summation order (tested)."""
        from spectest.engines.teacher import whitebox_columns, whitebox_columns_candidates

        B, J = int(tokens.shape[0]), int(tokens.shape[1])
        toks = torch.where(commit, tokens, torch.zeros_like(tokens)).reshape(B * J)  # [B*J]
        parts: dict[str, list[torch.Tensor]] = {c: [] for c in schema.WHITEBOX_COLUMNS}
        if not isinstance(p, CandidateLaw) and isinstance(q, CandidateLaw):
            q = q.dense()  # [B, J, V]: a dense p takes the dense columns
        flat_p = _flat_law(p, B * J)  # [B*J, W] or [B*J, V]
        flat_q = None if q is None else _flat_law(q, B * J)  # [B*J, Wq] or [B*J, V]
        step = max(1, _WB_CHUNK_ELEMENTS // max(1, _law_width(flat_p), _law_width(flat_q)))
        for lo in range(0, B * J, step):
            pc = _law_rows(flat_p, lo, step)
            qc = None if flat_q is None else _law_rows(flat_q, lo, step)
            if isinstance(pc, CandidateLaw):
                cols = whitebox_columns_candidates(pc, qc, toks[lo : lo + step])
            else:
                assert not isinstance(qc, CandidateLaw)
                cols = whitebox_columns(pc, qc, toks[lo : lo + step])
            for c in schema.WHITEBOX_COLUMNS:
                parts[c].append(cols[c])
        j = torch.arange(J, device=tokens.device)[None, :]  # [1, J]
        idx = torch.where(commit, start[:, None] + j, self.dump)  # [B, J]
        for c in schema.WHITEBOX_COLUMNS:
            self.buf[c].scatter_(1, idx, torch.cat(parts[c]).reshape(B, J))

    def frame(self, T: int) -> pd.DataFrame:
        return pd.DataFrame(
            {c: self.buf[c][:, :T].reshape(-1).cpu().numpy() for c in schema.WHITEBOX_COLUMNS}
        )


# ----------------------------------------------------------------------------- references


def plain_decode_reference(
    model: LanguageModel,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    *,
    num_positions: int,
    run_key: int,
    prompt_id: str,
) -> torch.Tensor:
    """Slow reference of ``plain_decode``: one row at a time, full forward per token, no cache."""
    out = []
    for r in rows:
        key = _keys([r], run_key, prompt_id, model.device)  # [1]
        params = SamplingTensors.from_params([r.params], device=model.device)
        seq = list(prompt)
        for t in range(num_positions):
            logits = model.logits_full(torch.tensor([seq], device=model.device))[:, -1]  # [1, V]
            u = uniforms(key, STREAM_PLAIN, t, 1)[:, 0]  # [1]
            seq.append(int(categorical(logits_to_probs(logits, params), u)[0]))
        out.append(seq[len(prompt) :])
    return torch.tensor(out, dtype=torch.int64)  # [B, T]


def speculative_decode_reference(
    target: LanguageModel,
    draft: LanguageModel,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    *,
    num_positions: int,
    drafter: DrafterSpec,
    variant: SpecVariant,
    run_key: int,
    prompt_id: str,
) -> tuple[torch.Tensor, list[list[tuple[int, int]]]]:
    """Slow reference of ``speculative_decode``: one row at a time, full forwards on the committed
    sequence (no cache, no holes), rounds until ``num_positions`` tokens, then truncation.
    Returns tokens ``[B, T]`` and, per row, its rounds as ``(num_accepted, num_emitted)``."""
    K, dev = drafter.k, target.device
    slots = spec_slots(K, drafter.onehot)
    out, telemetry = [], []
    for r in rows:
        key = _keys([r], run_key, prompt_id, dev)  # [1]
        params = SamplingTensors.from_params([r.params], device=dev)
        seq, emitted, rounds = list(prompt), list[int](), list[tuple[int, int]]()
        while len(emitted) < num_positions:
            u = uniforms(key, STREAM_SPEC, len(emitted), slots.num_slots)[0]  # [num_slots]
            ctx, qs = list(seq), []
            for i in range(K):
                d_logits = draft.logits_full(torch.tensor([ctx], device=dev))[:, -1]  # [1, V]
                law, q = variant.draft_law(
                    d_logits, params, onehot=drafter.onehot, q_mode=drafter.q_mode
                )
                tok = argmax_tokens(law) if drafter.onehot else categorical(law, u[i : i + 1])
                ctx.append(int(tok[0]))
                qs.append(q)
            t_logits = target.logits_full(torch.tensor([ctx], device=dev))[
                :, len(seq) - 1 :
            ]  # [1, K+1, V]
            res = variant.sample(
                variant.verify_probs(t_logits, params),
                stack_q(qs),
                torch.tensor([ctx[len(seq) :]], device=dev),
                u[slots.accept][None],
                u[slots.final : slots.final + 1],
            )
            n = int(res.num_emitted[0])
            new = [int(x) for x in res.emitted[0, :n]]
            rounds.append((int(res.num_accepted[0]), n))
            seq += new
            emitted += new
        out.append(emitted[:num_positions])
        telemetry.append(rounds)
    return torch.tensor(out, dtype=torch.int64), telemetry


# ----------------------------------------------------------------------------- tables


def to_samples_frame(
    out: EngineOutput, prompt_id: str, rows: Sequence[RowSpec], arm: str
) -> pd.DataFrame:
    """The schema's samples table (one row per token, row-major then position)."""
    return samples_frame(out.tokens.numpy(), prompt_id, rows, arm)


def to_rounds_frame(
    out: EngineOutput, prompt_id: str, rows: Sequence[RowSpec], arm: str
) -> pd.DataFrame:
    """The schema's rounds table (speculative runs only)."""
    if out.rounds is None:
        raise InputError("to_rounds_frame: this output has no rounds (a plain run)")
    return rounds_frame(out.rounds, prompt_id, rows, arm)


# ----------------------------------------------------------------------------- helpers


def _keys(
    rows: Sequence[RowSpec], run_key: int, prompt_id: str, device: torch.device
) -> torch.Tensor:
    keys = [row_key(run_key, prompt_id, r.config_id, r.seed) for r in rows]
    return torch.tensor(keys, dtype=torch.int64, device=device)  # [B]


def _check_inputs(
    model: LanguageModel, prompt: Sequence[int], rows: Sequence[RowSpec], T: Any, batch_size: Any
) -> torch.Tensor:
    check_rows(rows, T, batch_size)
    ids = list(prompt)
    if not ids:
        raise InputError("prompt must hold at least one token id (e.g. BOS), got []")
    for t in ids:
        if (
            isinstance(t, bool)
            or not isinstance(t, (int, np.integer))
            or not 0 <= t < model.vocab_size
        ):
            raise InputError(
                f"prompt token {t!r} is not an id in [0, {model.vocab_size}) of {model.name!r}"
            )
    return torch.tensor(ids, dtype=torch.int64, device=model.device)  # [L]


# ----------------------------------------------------------------------------- the engine


class BuiltinEngine(Engine):
    """spectest's own loops as an engine: ``plain_decode`` for an arm without a variant (the
    reference), ``speculative_decode`` with the arm's ``SpecVariant`` otherwise (the candidate
    and every tooth). White-box columns recorded at generation time by the loops, from the rows
    they sampled from (exact in every dtype), with the same drafter law q for every arm, the
    reference included (the control on spectest's own p)."""

    name = "builtin"
    needs = "draft"
    whitebox = "generation"
    rounds = "tested"
    uses_variant = True

    @classmethod
    def needs_draft(cls, variant: str | None) -> bool:
        return variant is not None

    def speculative(self, job: ArmJob) -> bool:
        """Whether the job runs the speculative loop (else plain decode)."""
        return job.variant is not None

    def variant(self, job: ArmJob) -> SpecVariant:
        """The sampler of a speculative job (the acceptor engine swaps in the user's kernel)."""
        from spectest.sampling.mutants import get_variant

        return get_variant(job.variant or "exact")

    def decode_models(self) -> Models:
        """The models the decode loops run on (the fast engine wraps them for its static cache)."""
        return self.models

    # the decode loops: the fast engine swaps in its own (same tokens, same RNG protocol)
    plain_loop = staticmethod(plain_decode)
    speculative_loop = staticmethod(speculative_decode)

    def generate(self, job: ArmJob) -> ArmOutput:
        models = self.decode_models()
        target, draft = models.target, models.draft
        assert target is not None
        kw: dict[str, Any] = dict(
            num_positions=job.num_positions,
            run_key=job.run_key,
            prompt_id=job.prompt_id,
            batch_size=job.batch_size,
            progress=job.tick,
        )
        if not self.speculative(job):
            # NOTE: the plain arm records q_t too (the draft run along its sequence, same
            # drafter law), so the white-box tests run on it as the control on spectest's own p
            out = self.plain_loop(
                target, job.prompt_ids, job.rows, whitebox=job.whitebox,
                draft=draft if job.whitebox else None, drafter=job.drafter, **kw,
            )  # fmt: skip
        else:
            if draft is None:
                raise ModelError(f"engine {self.name}: arm {job.arm!r} needs the draft model")
            out = self.speculative_loop(
                target, draft, job.prompt_ids, job.rows, drafter=job.drafter,
                variant=self.variant(job), whitebox=job.whitebox, **kw,
            )  # fmt: skip
        return ArmOutput(out.tokens.numpy(), out.rounds, True, out.whitebox)
