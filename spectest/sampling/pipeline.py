"""How a decode loop turns logits into laws: ``Pipeline`` (the exact ``REFERENCE`` and the
shortlist ``FAST``) and ``RoundSampler``, the draft and verify steps of a round for a chunk of rows
(``SampledRound``). Knows nothing about models, caches, uniforms' origin or white-box columns. Why
and details: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from spectest.errors import SpectestError
from spectest.sampling.draw import argmax_tokens, categorical
from spectest.sampling.laws import DenseLaw, Law, ShortlistLaw, stack_laws
from spectest.sampling.mutants import SpecVariant
from spectest.sampling.params import SamplingTensors
from spectest.sampling.rejection import RoundResult, rejection_sample
from spectest.sampling.shortlist import (
    Deferred,
    Undecided,
    fast_variant,
    logits_to_probs_fast,
    shortlist_probs,
)
from spectest.sampling.transforms import logits_to_probs

ProbsFn = Callable[[torch.Tensor, SamplingTensors], torch.Tensor]  # [.., V] → [.., V] float64
# (logits, params) → the law on a shortlist or None; takes ``defer=`` (``Pipeline.deferring``)
ShortlistFn = Callable[..., ShortlistLaw | None]

# device types whose decode loops defer the shortlist's host reads (``Pipeline.deferring``): a
# read costs a sync there; on CPU it costs nothing, and the loops read at once
DEFER_ON = frozenset({"cuda"})
# plain decode steps between two reads of a deferred flag (and one after the first step)
DEFERRED_EVERY = 8

R = TypeVar("R")


@dataclass(frozen=True)
class Pipeline:
    """The probability pipeline of a decode loop (docs/internals.md).

    ``probs``: logits → float64 probabilities; ``variant``: a variant's hooks on this pipeline;
    ``check``: validate the inputs of every draw; ``shortlist``: the law on a shortlist, or
    ``None`` when some row is not decided on it (fast pipeline only); ``deferred``: where the
    shortlist's host reads go when they are deferred (``deferring``), else None."""

    name: str
    probs: ProbsFn
    variant: Callable[[SpecVariant], SpecVariant]
    check: bool
    shortlist: ShortlistFn | None = None
    deferred: Deferred | None = None

    def deferring(self, device: torch.device) -> Pipeline:
        """This pipeline with its shortlist's host reads deferred to a fresh ``Deferred`` (its
        calls return a law without a sync; the decode loop reads the flag, docs/internals.md
        "Deferred shortlist reads"), on a device type of ``DEFER_ON``; else itself."""
        if self.shortlist is None or device.type not in DEFER_ON:
            return self
        d = Deferred()
        short = functools.partial(self.shortlist, defer=d)
        return dataclasses.replace(self, shortlist=short, deferred=d)

    def law(self, logits: torch.Tensor, params: SamplingTensors) -> Law:
        """The law plain sampling draws from, ``[.., *]`` for logits ``[.., V]``: on the
        shortlist where it decides every row, else dense."""
        if self.shortlist is not None:
            law = self.shortlist(logits, params)
            if law is not None:
                return law
        return DenseLaw(self.probs(logits, params))


REFERENCE = Pipeline("reference", logits_to_probs, lambda v: v, True)
FAST = Pipeline("fast", logits_to_probs_fast, fast_variant, False, shortlist_probs)


def deferred_first(
    pipeline: Pipeline, device: torch.device, defer: bool, run: Callable[[Pipeline], R]
) -> tuple[R, bool]:
    """``run(pipeline)``'s result, computed first with the shortlist's host reads deferred
    (``Pipeline.deferring``) when ``defer``, and again with them made when a deferred read finds
    a call undecided or a logit not finite (or the deferred run raises), so the tokens and errors
    are ``run(pipeline)``'s. Returns ``(result, defer)``: after a redo the caller's later chunks
    read at once (docs/internals.md "Deferred shortlist reads")."""
    pipe = pipeline.deferring(device) if defer else pipeline
    if pipe.deferred is None:
        return run(pipeline), defer
    try:
        return run(pipe), True
    except (Undecided, SpectestError):
        return run(pipeline), False


@dataclass(frozen=True)
class SampledRound:
    """One round's outcome and the laws it was decided on."""

    result: RoundResult
    p: Law  # [B, K+1, *] the target law the verifier used
    q: Law | None  # [B, K, *] the q's the drafter reported; None: one-hot, q = δ(x)


@dataclass(frozen=True)
class RoundSampler:
    """The draft and verify steps of a speculative round for one chunk of rows.

    ``variant`` is already on ``pipeline`` (``pipeline.variant(v)``); ``params`` ``[B]``."""

    pipeline: Pipeline
    variant: SpecVariant
    params: SamplingTensors
    onehot: bool
    q_mode: str

    @property
    def on_shortlist(self) -> bool:
        """Whether rounds try the shortlist laws (docs/internals.md)."""
        return (
            self.pipeline.shortlist is not None
            and self.variant.round_on_shortlist
            and (self.onehot or self.q_mode == "processed")
        )

    def draft(self, d_logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, Law | None]:
        """``x ~ q`` for draft logits ``[B, V]`` under uniforms ``u`` ``[B]`` (argmax for a one-hot
        drafter: no uniform used): ``(x [B], q [B, *])``, the q reported, ``None`` = δ(x)."""
        if self.on_shortlist and self.onehot:
            x = argmax_tokens(d_logits, defer=self.pipeline.deferred)  # [B]
            return x, None  # == the argmax of the one-hot law
        if self.on_shortlist and self.pipeline.shortlist is not None:
            q_short = self.pipeline.shortlist(d_logits, self.params)  # the processed q
            if q_short is not None:
                return q_short.draw(u, check=self.pipeline.check), q_short
        law, q = self.variant.draft_law(
            d_logits, self.params, onehot=self.onehot, q_mode=self.q_mode
        )  # [B, V] the law x is drawn from, [B, V] | None the q reported
        x = argmax_tokens(law) if self.onehot else categorical(law, u, check=self.pipeline.check)
        return x, None if q is None else DenseLaw(q)

    def verify(
        self,
        t_logits: torch.Tensor,
        qs: Sequence[Law | None],
        draft_tokens: torch.Tensor,
        u_accept: torch.Tensor,
        u_final: torch.Tensor,
    ) -> SampledRound:
        """The round on the target logits ``[B, K+1, V]`` of ``[last, x_1..x_K]``: p, then the
        variant's sampler (the exact chain on shortlist laws where ``on_shortlist``)."""
        q = stack_laws(qs)  # [B, K, *] or None (one-hot)
        if self.on_shortlist and self.pipeline.shortlist is not None:
            if q is None or q.is_shortlist:
                p_short = self.pipeline.shortlist(t_logits, self.params)  # [B, K+1, W] or None
                if p_short is not None:
                    check, scale = self.pipeline.check, self.variant.accept_scale
                    res = rejection_sample(
                        p_short, q, draft_tokens, u_accept, u_final, check=check, accept_scale=scale
                    )  # the pipeline's own laws and uniforms: checked where the pipeline checks
                    return SampledRound(res, p_short, q)
        p = DenseLaw(self.variant.verify_probs(t_logits, self.params))  # [B, K+1, V] float64
        q_dense = None if q is None else q.dense()  # [B, K, V]
        res = self.variant.sample(p.probs, q_dense, draft_tokens, u_accept, u_final)
        return SampledRound(res, p, q)
