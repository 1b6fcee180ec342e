"""The mutant round samplers of the ``mutants`` catalogue: one per mutant that changes the round
itself, each with ``rejection.rejection_sample``'s signature. The bug each mirrors: docs/bugs.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from spectest.sampling.draw import argmax_tokens, categorical
from spectest.sampling.rejection import (
    RoundInputs,
    RoundResult,
    SampleFn,
    accepted_prefix_len,
    assemble_round,
    check_round_inputs,
    drafted_probs,
    final_law,
    rejection_sample,
    round_sampler,
)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return torch.arange(int(t.shape[0]), device=t.device)


class _Round(RoundInputs):
    """One round's inputs with the steps the mutant samplers recombine."""

    def lens(self) -> Tensor:
        """``[B]`` draft lengths, after checking the inputs (``check_round_inputs``)."""
        return check_round_inputs(self.tp, self.dp, self.dt, self.ua, self.uf, self.draft_lens)

    def exact(self) -> RoundResult:
        """The exact round under the same uniforms."""
        return rejection_sample(
            self.tp, self.dp, self.dt, self.ua, self.uf, draft_lens=self.draft_lens
        )

    def accept(
        self, lens: Tensor, ratio: Callable[[Tensor, Tensor], Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(mask [B, K], n [B])``: accept iff ``u <= ratio(p(x), q(x))`` (default ``p/q``)."""
        p_x, q_x, in_draft = drafted_probs(self.tp, self.dp, self.dt, lens)  # [B, K]
        mask = in_draft & (p_x > 0) & (self.ua <= (p_x / q_x if ratio is None else ratio(p_x, q_x)))
        return mask, accepted_prefix_len(mask)

    def weights(self, n: Tensor, lens: Tensor) -> Tensor:
        """``[B, V]`` float64: the exact final law (residual or bonus), dense."""
        return final_law(self.tp, self.dp, self.dt, n, lens).dense()

    def final(self, n: Tensor, lens: Tensor, uf: Tensor | None = None) -> Tensor:
        """``[B]`` the exact final token drawn with ``uf`` (default ours)."""
        return categorical(self.weights(n, lens), self.uf if uf is None else uf)


def _sampler(body: Callable[[_Round], RoundResult]) -> SampleFn:
    return round_sampler(body, _Round)


def sample_eps(eps: float) -> SampleFn:
    def body(r: _Round) -> RoundResult:
        lens = r.lens()
        mask, n = r.accept(lens, lambda p_x, q_x: (1.0 + eps) * (p_x / q_x))  # biased acceptor
        return assemble_round(r.dt, n, r.final(n, lens), mask)  # residual unchanged

    return _sampler(body)


@_sampler
def sample_residual_from_p(r: _Round) -> RoundResult:
    exact = r.exact()
    n = exact.num_accepted  # [B]
    final = categorical(r.tp[_rows(r.tp), n], r.uf)  # p at the stop, never the residual
    return assemble_round(r.dt, n, final, exact.telemetry.accepted_mask)


@_sampler
def sample_bonus_wrong_row(r: _Round) -> RoundResult:
    lens = r.lens()
    mask, n = r.accept(lens)
    w = r.weights(n, lens)  # [B, V]
    wrong = (n == lens) & (lens > 0)  # [B] full acceptance: bonus read from index lens - 1
    w = torch.where(wrong[:, None], r.tp[_rows(r.tp), (lens - 1).clamp(min=0)], w)
    return assemble_round(r.dt, n, categorical(w, r.uf), mask)


@_sampler
def sample_reuse_accept_uniform(r: _Round) -> RoundResult:
    lens = r.lens()
    mask, n = r.accept(lens)
    K, uf = int(r.dt.shape[1]), r.uf
    if K > 0:  # the recovered draw reuses the uniform that rejected position n
        uf = torch.where(n < lens, r.ua[_rows(r.ua), n.clamp(max=K - 1)], uf)
    return assemble_round(r.dt, n, r.final(n, lens, uf), mask)


@_sampler
def sample_bonus_reuse_accept_uniform(r: _Round) -> RoundResult:
    lens = r.lens()
    mask, n = r.accept(lens)
    K, uf = int(r.dt.shape[1]), r.uf
    if K > 0:  # full acceptance: the bonus reuses the last acceptance uniform (<= p/q given it)
        u_last = r.ua[_rows(r.ua), (lens - 1).clamp(min=0)]  # [B]
        uf = torch.where((n == lens) & (lens > 0), u_last, uf)
    return assemble_round(r.dt, n, r.final(n, lens, uf), mask)


@_sampler
def sample_commit_on_telemetry(r: _Round) -> RoundResult:
    exact = r.exact()
    final = exact.emitted[_rows(r.dt), exact.num_accepted]  # [B] the exact round's last token
    m = exact.telemetry.num_accepted_any  # [B] >= num_accepted: commits rejected drafts too
    return assemble_round(r.dt, m, final, exact.telemetry.accepted_mask)


@_sampler
def sample_greedy_verify(r: _Round) -> RoundResult:
    lens, K = r.lens(), int(r.dt.shape[1])
    in_draft = torch.arange(K, device=r.dt.device)[None, :] < lens[:, None]  # [B, K]
    amax = argmax_tokens(r.tp)  # [B, K+1]
    mask = in_draft & (r.dt == amax[:, :K])  # accept iff the draft equals the target's argmax
    n = accepted_prefix_len(mask)
    return assemble_round(r.dt, n, amax[_rows(r.dt), n], mask)


@_sampler
def sample_always_accept(r: _Round) -> RoundResult:
    lens, K = r.lens(), int(r.dt.shape[1])
    mask = torch.arange(K, device=r.dt.device)[None, :] < lens[:, None]  # [B, K] all drafted
    return assemble_round(r.dt, lens, categorical(r.tp[_rows(r.tp), lens], r.uf), mask)


@_sampler
def sample_bf16_ratio(r: _Round) -> RoundResult:
    lens = r.lens()
    mask, n = r.accept(
        lens, lambda p_x, q_x: p_x.to(torch.bfloat16).double() / q_x.to(torch.bfloat16).double()
    )
    return assemble_round(r.dt, n, r.final(n, lens), mask)
