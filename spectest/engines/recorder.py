"""The white-box observers of the built-in decode loops: the columns recorded at generation time.

Owns ``PlainObserver`` and ``RoundObserver`` (notified by ``builtin``'s loops after each token /
round; the columns from ``teacher.law_columns`` and ``teacher.role_columns``), ``VerifyCapture``
(some rows' logits under the verify schedule, for claim (b)) and ``teacher_q``, the drafter's
exact law at given slots. Knows nothing about statistics or files, nor how the
loops sample. Which p and q: docs/internals-engines.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.engines import teacher
from spectest.engines.base import DrafterSpec
from spectest.models.base import LanguageModel
from spectest.numerics.table import write_committed
from spectest.sampling.draw import argmax_tokens
from spectest.sampling.laws import DenseLaw, Law, cat_laws, onehot_law
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingTensors
from spectest.sampling.pipeline import Pipeline, RoundSampler, SampledRound
from spectest.sampling.scaled import ScaledLogits, parts
from spectest.sampling.transforms import logits_to_probs

ROLES = schema.ROLES  # an emitted token's role; code = index
PLAIN, ACCEPTED, RECOVERED, BONUS = range(len(ROLES))

# NOTE: the float64 [rows, V] temporaries of ``whitebox_columns`` (p, q, the order key, masks)
# stay under ~512 MiB each: 2^26 elements
_WB_CHUNK_ELEMENTS = 1 << 26


class _Recorder:
    """Buffers ``[B, width + 1]`` per white-box column (and the role and round offset), filled
    as tokens are committed; the last column is a scratch slot for tokens not committed. With
    ``roles``, each token's mass and CDF under its role's law too (``teacher.role_columns``),
    and ``frame`` carries ``schema.ROLE_COLUMNS``."""

    def __init__(self, B: int, width: int, device: torch.device, roles: bool = False) -> None:
        self.dump, self.roles = width, roles
        self.buf: dict[str, torch.Tensor] = {}
        for c in self._buffered_columns():
            if c in (schema.WB_IN_A, schema.WB_ROLE_BEYOND):
                self.buf[c] = torch.zeros((B, width + 1), dtype=torch.bool, device=device)
            else:
                self.buf[c] = torch.full(
                    (B, width + 1), float("nan"), dtype=torch.float64, device=device
                )
        self.role = torch.full((B, width + 1), -1, dtype=torch.int64, device=device)  # -1: none
        self.offset = torch.full((B, width + 1), -1, dtype=torch.int64, device=device)

    def _buffered_columns(self) -> tuple[str, ...]:
        """The per-token columns buffered: the white-box ones, and with ``roles`` the role
        columns computed from the laws (``schema.ROLE_COLUMNS`` past the role and slot)."""
        extra = schema.ROLE_COLUMNS[2:] if self.roles else ()
        return (*schema.WHITEBOX_COLUMNS, *extra)

    def record(
        self,
        p: Law,
        q: Law | None,
        tokens: torch.Tensor,
        start: torch.Tensor,
        commit: torch.Tensor,
        role: torch.Tensor,
        ratio: torch.Tensor | None = None,
    ) -> None:
        """Columns of ``tokens`` ``[B, J]`` under ``p`` (and ``q``) ``[B, J, *]``, stored with
        their ``role`` ``[B, J]`` (and, with ``roles``, ``ratio`` ``[B, J]``: ``wb_role_ratio``)
        at positions ``start[b] + j`` where ``commit`` ``[B, J]`` holds; computed
        ``_WB_CHUNK_ELEMENTS`` at a time (``teacher.law_columns``, ``teacher.role_columns``)."""
        B, J = int(tokens.shape[0]), int(tokens.shape[1])
        toks = torch.where(commit, tokens, torch.zeros_like(tokens)).reshape(B * J)  # [B*J]
        flat_p, flat_q = p.flat(), None if q is None else q.flat()  # [B*J, *]
        step = max(1, _WB_CHUNK_ELEMENTS // max(1, flat_p.width, 1 if q is None else q.width))
        cols_out = self._buffered_columns()
        parts: dict[str, list[torch.Tensor]] = {c: [] for c in cols_out}
        flat_role = role.reshape(B * J)  # [B*J]
        for lo in range(0, B * J, step):
            q_rows = None if flat_q is None else flat_q.rows(lo, step)
            p_rows, t_rows = flat_p.rows(lo, step), toks[lo : lo + step]
            # NOTE the tokens are ids the loop drew (or an acceptor kernel's, checked by
            # ``acceptor.check_return``): no id check, no host sync per token / round
            cols = teacher.law_columns(p_rows, q_rows, t_rows, check=False)
            if self.roles:
                assert ratio is not None
                r_rows = ratio.reshape(B * J)[lo : lo + step]
                role_rows = flat_role[lo : lo + step]
                cols |= teacher.role_columns(p_rows, q_rows, t_rows, role_rows, r_rows)
                cols[schema.WB_ROLE_RATIO] = r_rows
            for c in cols_out:
                parts[c].append(cols[c])
        j = torch.arange(J, device=tokens.device)[None, :]  # [1, J]
        idx = torch.where(commit, start[:, None] + j, self.dump)  # [B, J]
        for c in cols_out:
            col = parts[c][0] if len(parts[c]) == 1 else torch.cat(parts[c])  # [B*J]
            self.buf[c].scatter_(1, idx, col.reshape(B, J))
        self.role.scatter_(1, idx, role)
        self.offset.scatter_(1, idx, j.expand(B, J))

    def frame(self, T: int) -> pd.DataFrame:
        """The white-box columns of the first ``T`` positions, row-major (``B * T`` rows); with
        ``roles`` also ``schema.ROLE_COLUMNS`` (role None where nothing was recorded)."""
        out = {c: self.buf[c][:, :T].reshape(-1).cpu().numpy() for c in schema.WHITEBOX_COLUMNS}
        if self.roles:
            codes = self.role[:, :T].reshape(-1).cpu().numpy()
            names = np.asarray([*ROLES, None], dtype=object)  # code -1 → None
            out[schema.WB_ROLE] = names[np.where(codes < 0, len(ROLES), codes)]
            out[schema.WB_SLOT] = self.offset[:, :T].reshape(-1).cpu().numpy().astype(np.int32)
            for c in schema.ROLE_COLUMNS[2:]:
                out[c] = self.buf[c][:, :T].reshape(-1).cpu().numpy()
        return pd.DataFrame(out)

    def roles_frame(self, T: int) -> pd.DataFrame:
        """``role`` (a name of ``ROLES``) and ``round_offset`` (the token's index among its
        round's emitted tokens; 0 for plain decode) of the first ``T`` positions, as ``frame``."""
        codes = self.role[:, :T].reshape(-1).cpu().numpy()
        return pd.DataFrame(
            {
                "role": np.asarray(ROLES, dtype=object)[codes],
                "round_offset": self.offset[:, :T].reshape(-1).cpu().numpy(),
            }
        )


class PlainObserver(_Recorder):
    """Plain decode's observer: each drawn token under the law it was drawn from, q_t from the
    draft run along the emitted sequence under ``drafter`` (unknown without a draft)."""

    def __init__(
        self,
        prompt: torch.Tensor,
        B: int,
        T: int,
        pipeline: Pipeline,
        params: SamplingTensors,
        draft: tuple[LanguageModel, DrafterSpec] | None,
    ) -> None:
        super().__init__(B, T, prompt.device)
        self.T, self.pipeline, self.params, self.draft = T, pipeline, params, draft
        dev = prompt.device
        # per-token constants, built once per chunk (no fill kernels per token)
        self.steps = torch.arange(T, dtype=torch.int64, device=dev)[:, None].expand(T, B)  # [T, B]
        self.every = torch.ones((B, 1), dtype=torch.bool, device=dev)  # [B, 1]
        self.plain = torch.full((B, 1), PLAIN, dtype=torch.int64, device=dev)  # [B, 1]
        if draft is not None:
            self.d_cache, d_prompt_logits = draft[0].prefill_shared(prompt, B)
            self.d_logits = d_prompt_logits[-1].expand(B, -1)  # [B, V] the draft's law at 0

    def on_token(self, p: Law, tokens: torch.Tensor, t: int) -> None:
        """Token ``t`` of every row (``tokens`` ``[B]``) was drawn under ``p`` ``[B, *]``."""
        q = None
        if self.draft is not None:
            q = teacher_q(self.d_logits[:, None], self.params, self.draft[1], self.pipeline)
        self.record(p.unsqueeze(), q, tokens[:, None], self.steps[t], self.every, self.plain)
        if self.draft is not None and t + 1 < self.T:
            self.d_logits = self.draft[0].forward(self.d_cache, tokens[:, None])[:, 0]  # [B, V]


class VerifyCapture:
    """The logits of the rows ``keep`` ``[M]`` (ascending) under the verify schedule, ``[M, T,
    V]``: each position's from the round that committed it, in the model's own dtype (a
    ``ScaledLogits``' native values, its scale kept). What claim (b)'s matched drift would
    otherwise replay, written by the replay's own ``numerics.table.write_committed``
    (docs/internals.md "spectest/numerics/table.py"). Notified by ``builtin``'s speculative
    loop after each round, as ``RoundObserver`` is."""

    def __init__(self, keep: torch.Tensor, T: int) -> None:
        self.keep, self.T = keep, T
        self.buf: torch.Tensor | None = None  # [M, T, V] native; NaN until committed
        self.scale: float | None = None

    def on_round(
        self,
        t_logits: torch.Tensor,
        d_logits: list[torch.Tensor],
        sampled: SampledRound,
        draft_tokens: torch.Tensor,
        pos: torch.Tensor,
        commit: torch.Tensor,
    ) -> None:
        """``RoundObserver.on_round``'s arguments; reads the target logits and the commits."""
        x, self.scale = parts(t_logits)  # [B, K+1, V] native
        M, dev = len(self.keep), x.device
        if self.buf is None:
            self.buf = torch.full((M, self.T, x.shape[-1]), float("nan"), dtype=x.dtype, device=dev)
        m, k = torch.arange(M, device=dev), self.keep
        write_committed(self.buf, x[k], m, pos[k], commit[k])  # the replay's write

    def logits(self) -> torch.Tensor:
        """``[M, T, V]``: the native buffer, as a ``ScaledLogits`` where the model's were."""
        assert self.buf is not None, "no round observed"
        return self.buf if self.scale is None else ScaledLogits.wrap(self.buf, self.scale)


class RoundObserver(_Recorder):
    """The speculative loop's observer: a round's emitted tokens under p and q
    (docs/internals-engines.md), with their roles."""

    def __init__(
        self, B: int, width: int, device: torch.device, sampler: RoundSampler, drafter: DrafterSpec
    ) -> None:
        super().__init__(B, width, device, roles=True)
        self.sampler, self.drafter = sampler, drafter

    def on_round(
        self,
        t_logits: torch.Tensor,
        d_logits: list[torch.Tensor],
        sampled: SampledRound,
        draft_tokens: torch.Tensor,
        pos: torch.Tensor,
        commit: torch.Tensor,
    ) -> None:
        """A round: target logits ``[B, K+1, V]``, the K + 1 draft logits ``[B, V]`` (the last:
        after x_K), its outcome, the drafts ``[B, K]``, positions ``[B]``, commits ``[B, K+1]``."""
        res, K = sampled.result, int(draft_tokens.shape[1])
        j = torch.arange(K + 1, device=pos.device)[None, :]  # [1, K+1]
        a = res.num_accepted[:, None]  # [B, 1]
        final = torch.full_like(a, BONUS).masked_fill(a < K, RECOVERED)  # [B, 1] after a drafts
        role = torch.where(j < a, torch.full_like(a, ACCEPTED), final)  # [B, K+1]
        p, q = self._p(t_logits, sampled), self._q(d_logits, sampled, draft_tokens)
        # the acceptance ratio of the last draft decided before each final token: the rejected
        # x_a for a recovered token at slot a, x_K for the bonus (accepted drafts: NaN)
        x = draft_tokens[..., None]  # [B, K, 1]
        p_x = p.slots(0, K).prob_of(x).squeeze(-1)  # [B, K]
        q_x = q.slots(0, K).prob_of(x).squeeze(-1)  # [B, K]
        r = (p_x / q_x).nan_to_num(nan=0.0).clamp(max=1.0)  # [B, K]; q(x) = 0 < p(x) → 1
        r_at = r.gather(1, j.clamp(max=K - 1).expand_as(role))  # [B, K+1]
        ratio = torch.where(role == ACCEPTED, torch.full_like(r_at, float("nan")), r_at)
        self.record(p, q, res.emitted, pos, commit, role, ratio)

    def _p(self, t_logits: torch.Tensor, sampled: SampledRound) -> Law:
        s = self.sampler
        if not s.variant.exact_verify:  # a mutant's verify law is not the plain law
            return DenseLaw(logits_to_probs(t_logits, s.params))  # [B, K+1, V] float64
        if not sampled.p.is_shortlist and s.pipeline.shortlist is not None:
            p_short = s.pipeline.shortlist(t_logits, s.params)  # [B, K+1, W] or None
            if p_short is not None:
                return p_short
        return sampled.p  # [B, K+1, *] the law the round used

    def _q(self, d_logits: list[torch.Tensor], sampled: SampledRound, x: torch.Tensor) -> Law:
        s, K = self.sampler, int(x.shape[1])
        if s.variant.truthful_draft and self.drafter.onehot:
            bonus = argmax_tokens(d_logits[K], defer=s.pipeline.deferred)[:, None]  # [B, 1]
            return onehot_law(torch.cat([x, bonus], 1), int(d_logits[K].shape[-1]))
        if s.variant.truthful_draft and sampled.q is not None:
            bonus_q = teacher_q(d_logits[K][:, None], s.params, self.drafter, s.pipeline)
            return cat_laws([sampled.q, bonus_q])  # [B, K+1, *]
        return teacher_q(torch.stack(d_logits, dim=1), s.params, self.drafter, s.pipeline)


def teacher_q(
    d_logits: torch.Tensor, params: SamplingTensors, drafter: DrafterSpec, pipeline: Pipeline
) -> Law:
    """The drafter's exact law (what teacher forcing calls q) at J slots: ``[B, J, *]`` for draft
    logits ``[B, J, V]`` — never a mutant's reported q.

    A one-hot drafter: δ(``argmax_tokens``) (the exact draft law's ``_onehot_argmax`` for every
    ``q_mode``). A ``q_mode="processed"`` drafter on a pipeline with a shortlist: the shortlist
    law (its ``dense()`` bit-equal to the fast draft law) where it decides every row. Otherwise
    (temperature/raw ``q_mode``: full support; the reference pipeline; an undecided row) the exact
    variant's sample law on ``pipeline``, one slot at a time (the fast pipeline's law equals the
    reference's up to float64 reduction order, ``sampling/shortlist.py``)."""
    J, V = int(d_logits.shape[1]), int(d_logits.shape[2])
    if drafter.onehot:
        defer = pipeline.deferred  # a deferring loop's: the argmax of native logits
        tok = torch.stack([argmax_tokens(d_logits[:, i], defer=defer) for i in range(J)], 1)
        return onehot_law(tok, V)
    if drafter.q_mode == "processed" and pipeline.shortlist is not None:
        law = pipeline.shortlist(d_logits, params)  # [B, J, W] or None
        if law is not None:
            return law
    exact = pipeline.variant(get_variant("exact"))
    laws = [
        exact.draft_law(d_logits[:, i], params, onehot=False, q_mode=drafter.q_mode)[0]
        for i in range(J)
    ]  # J × [B, V]
    return DenseLaw(torch.stack(laws, dim=1))  # [B, J, V]
