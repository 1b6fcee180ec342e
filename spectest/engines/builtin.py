"""The built-in batched engines: plain decode and speculative decode over ``LanguageModel`` s.

Owns the decode loops (``plain_decode``, ``speculative_decode``), their slow per-row references
and ``BuiltinEngine`` (plain when the job has no variant, else speculative). Knows nothing about
statistics or files, nor which sampler is correct: the loop calls a ``SpecVariant``'s hooks
through a ``sampling.pipeline.RoundSampler``, and ``engines.recorder`` records white-box columns.
Batching, RNG, the speculative loop and truncation: docs/internals-engines.md.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.engines.base import (
    ArmJob,
    ArmOutput,
    DecodeRequest,
    DrafterSpec,
    Engine,
    Models,
    RowSpec,
    check_rows,
)
from spectest.engines.recorder import PlainObserver, RoundObserver, VerifyCapture
from spectest.errors import ConfigError, InputError, ModelError
from spectest.models.base import LanguageModel
from spectest.sampling.draw import argmax_tokens, categorical
from spectest.sampling.mutants import SpecVariant, get_variant, stack_q
from spectest.sampling.params import SamplingTensors
from spectest.sampling.pipeline import (
    DEFERRED_EVERY,
    REFERENCE,
    Pipeline,
    RoundSampler,
    deferred_first,
)
from spectest.sampling.shortlist import Deferred
from spectest.sampling.transforms import logits_to_probs
from spectest.seeding import (
    STREAM_PLAIN,
    STREAM_SPEC,
    plain_draws,
    round_draws,
    row_key,
    spec_slots,
    uniforms,
)

# ----------------------------------------------------------------------------- plain


def plain_decode(
    model: LanguageModel,
    req: DecodeRequest,
    *,
    draft: LanguageModel | None = None,
    drafter: DrafterSpec | None = None,
    pipeline: Pipeline = REFERENCE,
) -> ArmOutput:
    """Plain autoregressive sampling: one uniform per token, inverse CDF on the pipeline's law.

    Returns ``ArmOutput`` with ``tokens`` ``[len(rows), num_positions]`` (numpy) and no rounds.
    With ``whitebox``, also the white-box columns of every emitted token from the p_t row it was
    drawn from, q_t from ``draft`` run along the sequence under ``drafter`` (unknown without a
    draft); ``whitebox_roles`` appends ``role`` ("plain") and ``round_offset`` (0).

    Notes
    -----
    Token ``t`` of a row is ``categorical(logits_to_probs(logits_t), u)`` with
    ``u = uniforms(row key, STREAM_PLAIN, t, 1)``: a deterministic function of the row's key, so
    batch composition never matters.
    """
    prompt_t = _check_inputs(model, req)
    T = req.num_positions
    model.reserve(len(prompt_t) + T)
    wb_draft = _whitebox_draft(model, draft, drafter) if req.whitebox else None
    if wb_draft is not None:
        wb_draft[0].reserve(len(prompt_t) + T)
    chunks, wb_parts, defer = [], [], True
    for lo, part, keys, params in _chunks(req, model.device):
        run = functools.partial(_plain_chunk, model, req, prompt_t, keys, params, wb_draft)
        (toks, rec), defer = deferred_first(pipeline, model.device, defer, run)  # [B, T]
        chunks.append(toks.cpu())
        if rec is not None:
            wb_parts.append(_wb_frame(rec, T, req.whitebox_roles))
        req.tick(lo + len(part))
    wb = pd.concat(wb_parts, ignore_index=True) if req.whitebox else None
    return ArmOutput(torch.cat(chunks, dim=0).numpy(), None, True, wb)


def _plain_chunk(
    model: LanguageModel,
    req: DecodeRequest,
    prompt: torch.Tensor,
    keys: torch.Tensor,
    params: SamplingTensors,
    wb_draft: tuple[LanguageModel, DrafterSpec] | None,
    pipeline: Pipeline,
) -> tuple[torch.Tensor, PlainObserver | None]:
    """One chunk of ``plain_decode`` on ``pipeline``: tokens ``[B, T]`` and its observer."""
    B, T, observer = int(keys.shape[0]), req.num_positions, None
    if req.whitebox:
        observer = PlainObserver(prompt, B, T, pipeline, params, wb_draft)
    cache, prompt_logits = model.prefill_shared(prompt, B)  # one prompt forward for B rows
    logits = prompt_logits[-1].expand(B, -1)  # [B, V] next-token logits
    out = torch.empty((B, T), dtype=torch.int64, device=model.device)  # [B, T]
    u_at = plain_draws(keys, T)
    for t in range(T):
        u = u_at(t)  # [B] uniforms(keys, STREAM_PLAIN, t, 1)[:, 0]
        law = pipeline.law(logits, params)  # [B, *] on the shortlist where it decides every row
        out[:, t] = law.draw(u, check=pipeline.check)  # [B] (a shortlist draws the dense token)
        if observer is not None:
            observer.on_token(law, out[:, t], t)
        if pipeline.deferred is not None and (t % DEFERRED_EVERY == 0 or t + 1 == T):
            pipeline.deferred.check()  # Undecided: the chunk is redone with the reads made
        if t + 1 < T:
            logits = model.forward(cache, out[:, t : t + 1])[:, 0]  # [B, V]
    return out, observer


# ----------------------------------------------------------------------------- speculative


def speculative_decode(
    target: LanguageModel,
    draft: LanguageModel,
    req: DecodeRequest,
    *,
    drafter: DrafterSpec,
    variant: SpecVariant,
    pipeline: Pipeline = REFERENCE,
) -> ArmOutput:
    """Speculative sampling with ``variant``'s hooks on ``pipeline``; telemetry one row per
    (row, round).

    Returns ``ArmOutput`` with ``tokens`` ``[len(rows), num_positions]`` (numpy) and ``rounds``
    (row, round, position, drafted, accepted, emitted; ``emitted`` capped by the budget). With
    ``whitebox``, also the white-box columns of every emitted token under the p it was sampled
    from and the drafter's exact q at that slot (``recorder.RoundObserver``); ``whitebox_roles``
    appends each token's ``role`` (accepted / recovered / bonus) and ``round_offset``.

    Notes
    -----
    The loop and its cache memory: docs/internals-engines.md. Assumptions: target and draft
    share the vocabulary and the device (``ModelError`` otherwise); ``drafter.k >= 1``.
    """
    prompt_t = _check_pair(target, draft, drafter, req)
    T = req.num_positions
    slots = len(prompt_t) + T * (drafter.k + 1)  # every round appends K+1 slots
    target.reserve(slots)
    draft.reserve(slots)
    variant = pipeline.variant(variant)
    chunks, frames, wb_parts, kept, defer = [], [], [], [], True
    for lo, part, keys, params in _chunks(req, target.device):
        mine = [r - lo for r in req.capture if lo <= r < lo + len(part)]
        run = functools.partial(
            _spec_run, target, draft, req, prompt_t, keys, params, drafter, variant, mine
        )
        (toks, rounds, rec, cap), defer = deferred_first(pipeline, target.device, defer, run)
        chunks.append(toks.cpu())
        rounds["row"] += lo
        frames.append(rounds)
        if rec is not None:
            wb_parts.append(_wb_frame(rec, T, req.whitebox_roles))
        if cap is not None:
            kept.append(cap.logits())
        req.tick(lo + len(part))
    wb = pd.concat(wb_parts, ignore_index=True) if req.whitebox else None
    rounds = pd.concat(frames, ignore_index=True)
    verify = torch.cat(kept) if kept else None  # [len(capture), T, V]
    return ArmOutput(torch.cat(chunks, dim=0).numpy(), rounds, True, wb, verify=verify)


def _spec_run(
    target: LanguageModel,
    draft: LanguageModel,
    req: DecodeRequest,
    prompt: torch.Tensor,
    keys: torch.Tensor,
    params: SamplingTensors,
    drafter: DrafterSpec,
    variant: SpecVariant,
    capture: list[int],
    pipeline: Pipeline,
) -> tuple[torch.Tensor, pd.DataFrame, RoundObserver | None, VerifyCapture | None]:
    """One chunk of ``speculative_decode`` on ``pipeline``: tokens, rounds and its watchers."""
    T, K, dev = req.num_positions, drafter.k, target.device
    sampler = RoundSampler(pipeline, variant, params, drafter.onehot, drafter.q_mode)
    rec = cap = None
    if req.whitebox:
        rec = RoundObserver(int(keys.shape[0]), T + K + 1, dev, sampler, drafter)
    if capture:
        cap = VerifyCapture(torch.tensor(capture, device=dev), T)
    watch = [w for w in (rec, cap) if w is not None]
    toks, rounds = _spec_chunk(target, draft, prompt, keys, sampler, T, K, watch)
    return toks, rounds, rec, cap


def _spec_chunk(
    target: LanguageModel,
    draft: LanguageModel,
    prompt: torch.Tensor,
    keys: torch.Tensor,
    sampler: RoundSampler,
    T: int,
    K: int,
    watch: Sequence[RoundObserver | VerifyCapture] = (),
) -> tuple[torch.Tensor, pd.DataFrame]:
    B, dev = int(keys.shape[0]), target.device
    slots = spec_slots(K, sampler.onehot)
    tc, _ = target.prefill_shared(prompt[:-1], B)  # all but the pending token, once for B rows
    dc, _ = draft.prefill_shared(prompt[:-1], B)
    last = prompt[-1:].expand(B).clone()  # [B] pending token (committed, not yet in the caches)
    pos = torch.zeros(B, dtype=torch.int64, device=dev)  # [B] tokens emitted so far
    out = torch.full((B, T + K + 2), schema.PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=dev)
    DUMP = T + K + 1  # a scratch column for tokens that are not committed
    j = torch.arange(K + 1, device=dev)  # [K+1]
    log: list[tuple[torch.Tensor, ...]] = []
    u_at = round_draws(keys, T, K, slots.num_slots)
    while _more_rounds(len(log), pos, T, K, sampler.pipeline.deferred):
        active = pos < T  # [B]
        u = u_at(pos)  # [B, 2K+1] or [B, K+1]: uniforms(keys, STREAM_SPEC, pos, num_slots)
        # 1. draft: x_i ~ q_i = q(. | prefix, x_<i) for i = 1..K (the argmax for a one-hot drafter)
        tok, drafted, qs, d_logits = last, [], [], []
        for i in range(K):
            d_logits.append(draft.forward(dc, tok[:, None])[:, 0])  # [B, V]
            tok, q = sampler.draft(d_logits[-1], u[:, i])  # [B] x_i, [B, *] q_i (None: δ(x_i))
            drafted.append(tok)
            qs.append(q)
        # x_K too: the draft cache keeps the target's slot layout (and its logits are the
        # draft's law at the bonus slot, for the white-box q)
        d_logits.append(draft.forward(dc, tok[:, None])[:, 0])  # [B, V]
        x = torch.stack(drafted, dim=1)  # [B, K]
        # 2. verify: one target forward over [last, x_1..x_K] gives p_1..p_{K+1}; x_i is accepted
        # while u_i <= p_i(x_i) / q_i(x_i); then one token: recovered ~ norm(max(0, p_i - q_i)) at
        # the first rejection, or bonus ~ p_{K+1} if all K were accepted
        t_logits = target.forward(tc, torch.cat([last[:, None], x], 1))  # [B, K+1, V]
        sampled = sampler.verify(t_logits, qs, x, u[:, slots.accept], u[:, slots.final])
        res = sampled.result
        n = res.num_emitted  # [B] = accepted + 1 (recovered or bonus): the commit signal
        # 3. commit: the emitted tokens of active rows go to positions pos .. pos+n-1
        commit = (j[None, :] < n[:, None]) & active[:, None]  # [B, K+1]
        out.scatter_(1, torch.where(commit, pos[:, None] + j, DUMP), res.emitted)
        for w in watch:  # the white-box columns; claim (b)'s captured rows
            w.on_round(t_logits, d_logits, sampled, x, pos, commit)
        # 4. holes: this round's slots n0+j hold [last, x_1..x_K][j]; keep last and the committed
        # drafts x_1..x_{n-1} (emitted = those drafts + 1 token: the commit signal is n, not a)
        n0 = tc.num_slots - (K + 1)
        hole = torch.zeros((B, tc.num_slots), dtype=torch.bool, device=dev)  # [B, N]
        hole[:, n0:] = j[None, :] >= n[:, None]
        tc.invalidate(hole)
        dc.invalidate(hole)
        last = res.emitted.gather(1, (n - 1)[:, None])[:, 0]  # [B] the last emitted token
        log.append((active, pos.clone(), res.num_accepted, torch.minimum(n, T - pos)))
        pos = pos + torch.where(active, n, 0)
    return out[:, :T], _rounds_frame(log, K)


def _more_rounds(rounds: int, pos: torch.Tensor, T: int, K: int, deferred: Deferred | None) -> bool:
    """Whether the loop runs another round, after ``rounds``: surely while ``rounds · (K + 1)
    < T`` (a round emits at most K + 1 tokens a row, so none can have finished: no host read),
    else whether a row is below ``T`` tokens (``pos`` ``[B]``). The shortlist's ``deferred``
    flag is read after the first round and with every read of ``pos`` (``Undecided``: the chunk
    is redone with the reads made, docs/internals.md "Deferred shortlist reads")."""
    if rounds * (K + 1) < T:
        if deferred is not None and rounds == 1:
            deferred.check()
        return True
    more = (pos < T).any()
    return bool(more) if deferred is None else deferred.check(more)[0]


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


def _wb_frame(rec: PlainObserver | RoundObserver, T: int, roles: bool) -> pd.DataFrame:
    """A chunk's white-box columns (and, with ``roles``, each token's role and round offset)."""
    if not roles:
        return rec.frame(T)
    return pd.concat([rec.frame(T), rec.roles_frame(T)], axis=1)


def _whitebox_draft(
    model: LanguageModel, draft: LanguageModel | None, drafter: DrafterSpec | None
) -> tuple[LanguageModel, DrafterSpec] | None:
    """The (draft, drafter) that defines q for a plain arm's white-box columns, checked."""
    if draft is None:
        return None
    if not isinstance(drafter, DrafterSpec):
        raise InputError("plain_decode: whitebox with a draft needs its drafter (DrafterSpec)")
    _check_same_device(model, draft)
    return draft, drafter


def _check_pair(
    target: LanguageModel, draft: LanguageModel, drafter: Any, req: DecodeRequest
) -> torch.Tensor:
    """The inputs of a speculative call, checked: the prompt as ``[L]`` on the target's device."""
    _check_same_device(target, draft)
    if not isinstance(drafter, DrafterSpec):
        raise ConfigError(f"drafter must be a DrafterSpec, got {drafter!r}")
    return _check_inputs(target, req)


def _check_same_device(target: LanguageModel, draft: LanguageModel) -> None:
    from spectest.models.derive import check_same_vocab

    check_same_vocab(target, draft)
    if target.device != draft.device:
        raise ModelError(
            f"target {target.name!r} is on {target.device}, draft {draft.name!r} on {draft.device}"
        )


# ----------------------------------------------------------------------------- references


def plain_decode_reference(model: LanguageModel, req: DecodeRequest) -> torch.Tensor:
    """Slow reference of ``plain_decode``: one row at a time, full forward per token, no cache."""
    out = []
    for r in req.rows:
        key = _keys([r], req.run_key, req.prompt_id, model.device)  # [1]
        params = SamplingTensors.from_params([r.params], device=model.device)
        seq = list(req.prompt)
        for t in range(req.num_positions):
            logits = model.logits_full(torch.tensor([seq], device=model.device))[:, -1]  # [1, V]
            u = uniforms(key, STREAM_PLAIN, t, 1)[:, 0]  # [1]
            seq.append(int(categorical(logits_to_probs(logits, params), u)[0]))
        out.append(seq[len(req.prompt) :])
    return torch.tensor(out, dtype=torch.int64)  # [B, T]


def speculative_decode_reference(
    target: LanguageModel,
    draft: LanguageModel,
    req: DecodeRequest,
    *,
    drafter: DrafterSpec,
    variant: SpecVariant,
) -> tuple[torch.Tensor, list[list[tuple[int, int]]]]:
    """Slow reference of ``speculative_decode``: one row at a time, full forwards on the committed
    sequence (no cache, no holes), rounds until ``num_positions`` tokens, then truncation.
    Returns tokens ``[B, T]`` and, per row, its rounds as ``(num_accepted, num_emitted)``."""
    K, dev, num_positions = drafter.k, target.device, req.num_positions
    slots = spec_slots(K, drafter.onehot)
    out, telemetry = [], []
    for r in req.rows:
        key = _keys([r], req.run_key, req.prompt_id, dev)  # [1]
        params = SamplingTensors.from_params([r.params], device=dev)
        seq, emitted, rounds = list(req.prompt), list[int](), list[tuple[int, int]]()
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


# ----------------------------------------------------------------------------- helpers


def _keys(
    rows: Sequence[RowSpec], run_key: int, prompt_id: str, device: torch.device
) -> torch.Tensor:
    keys = [row_key(run_key, prompt_id, r.config_id, r.seed) for r in rows]
    return torch.tensor(keys, dtype=torch.int64, device=device)  # [B]


def _chunks(
    req: DecodeRequest, device: torch.device
) -> Iterator[tuple[int, Sequence[RowSpec], torch.Tensor, SamplingTensors]]:
    """``(lo, rows, keys [B], params)`` of each chunk of ``req.batch_size`` rows."""
    for lo in range(0, len(req.rows), req.batch_size):
        part = req.rows[lo : lo + req.batch_size]
        params = SamplingTensors.from_params([r.params for r in part], device=device)
        yield lo, part, _keys(part, req.run_key, req.prompt_id, device), params


def _check_inputs(model: LanguageModel, req: DecodeRequest) -> torch.Tensor:
    check_rows(req.rows, req.num_positions, req.batch_size)
    ids = list(req.prompt)
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
    fast_variant: ClassVar[str | None] = "fast"  # --fast: engines/fast.py, same tokens, law

    @classmethod
    def needs_draft(cls, variant: str | None) -> bool:
        return variant is not None

    def speculative(self, job: ArmJob) -> bool:
        """Whether the job runs the speculative loop (else plain decode)."""
        return job.variant is not None

    def variant(self, job: ArmJob) -> SpecVariant:
        """The sampler of a speculative job (the acceptor engine swaps in the user's kernel)."""
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
        req = job.decode_request()
        if not self.speculative(job):
            # NOTE: the plain arm records q_t too (the draft run along its sequence, same
            # drafter law), so the white-box tests run on it as the control on spectest's own p
            wb_draft = draft if job.whitebox else None
            return self.plain_loop(target, req, draft=wb_draft, drafter=job.drafter)
        if draft is None:
            raise ModelError(f"engine {self.name}: arm {job.arm!r} needs the draft model")
        variant = self.variant(job)
        return self.speculative_loop(target, draft, req, drafter=job.drafter, variant=variant)
