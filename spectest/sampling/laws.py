"""Laws over the vocabulary (``Law``): ``DenseLaw`` (float64 ``[..., V]``) and ``ShortlistLaw``
(float64 at ``W`` ascending ids, zero elsewhere), with one set of methods, and ``onehot_law``,
``stack_laws``/``cat_laws`` and ``probs_at``. Knows nothing about how a law was computed, about
models or uniforms. Why and details: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from spectest.sampling.draw import categorical


@dataclass(frozen=True)
class DenseLaw:
    """A law as float64 probabilities over the whole vocabulary: ``probs`` ``[..., V]``. Its
    methods are every ``Law``'s (a ``ShortlistLaw``'s compute the same, docs/internals.md)."""

    probs: torch.Tensor  # [..., V] float64
    is_shortlist: ClassVar[bool] = False

    @property
    def vocab_size(self) -> int:
        return int(self.probs.shape[-1])

    @property
    def width(self) -> int:
        return int(self.probs.shape[-1])

    def dense(self) -> torch.Tensor:
        """``[..., V]`` float64: the law over the whole vocabulary."""
        return self.probs

    def draw(self, u: torch.Tensor, *, check: bool = True) -> torch.Tensor:
        """``categorical`` under uniforms ``u`` ``[...]``: token ids ``[...]``."""
        return categorical(self.probs, u, check=check)

    def prob_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """The law at token ids ``tokens`` ``[..., J]`` (int64): ``[..., J]`` float64."""
        return self.probs.gather(-1, tokens)

    def rows(self, lo: int, n: int) -> DenseLaw:
        """Rows ``lo .. lo + n - 1`` of the leading dimension."""
        return DenseLaw(self.probs[lo : lo + n])

    def slots(self, lo: int, hi: int) -> DenseLaw:
        """``[B, J, *] → [B, hi - lo, *]``: slots ``lo .. hi - 1`` of dimension 1."""
        return DenseLaw(self.probs[:, lo:hi])

    def pick(self, index: torch.Tensor) -> DenseLaw:
        """``[B, J, *] → [B, *]``: slot ``index[b]`` of row ``b`` (``index`` ``[B]`` int64)."""
        rows = torch.arange(int(index.shape[0]), device=index.device)  # [B]
        return DenseLaw(self.probs[rows, index])

    def flat(self) -> DenseLaw:
        """``[B, J, *] → [B·J, *]``."""
        return DenseLaw(self.probs.reshape(-1, self.width))

    def unsqueeze(self) -> DenseLaw:
        """``[B, *] → [B, 1, *]``."""
        return DenseLaw(self.probs[:, None])

    def residual_with(self, q: Law, where: torch.Tensor) -> DenseLaw:
        """``[B, *]``: the unnormalised ``max(0, p - q)`` where ``where`` ``[B]`` holds (``p`` where
        that is empty), this law elsewhere, on this law's support."""
        return DenseLaw(_residual(self.probs, q.dense(), where))


@dataclass(frozen=True)
class ShortlistLaw:
    """A law on ``W`` shortlisted tokens per row: what ``shortlist.logits_to_probs_fast``
    scatters into its dense ``[..., V]`` output, before the scatter."""

    ids: torch.Tensor  # [..., W] int64 token ids, ascending along the last dim, distinct
    probs: torch.Tensor  # [..., W] float64: the law at ``ids`` (zeros allowed), 0 off them
    vocab_size: int
    is_shortlist: ClassVar[bool] = True

    @property
    def width(self) -> int:
        return int(self.ids.shape[-1])

    def dense(self) -> torch.Tensor:
        """``[..., V]`` float64: the law over the vocabulary (bit-equal to the fast pipeline's)."""
        shape = (*self.ids.shape[:-1], self.vocab_size)
        out = torch.zeros(shape, dtype=torch.float64, device=self.ids.device)
        return out.scatter_(-1, self.ids, self.probs)

    def draw(self, u: torch.Tensor, *, check: bool = True) -> torch.Tensor:
        """``categorical`` on the shortlist: the token ``categorical(self.dense(), u)`` draws
        (docs/internals.md "spectest/sampling/laws.py": why, and when CUDA may differ)."""
        pick = categorical(self.probs, u, check=check)  # [...] index into the shortlist
        return self.ids.gather(-1, pick[..., None]).squeeze(-1)

    def prob_of(self, tokens: torch.Tensor) -> torch.Tensor:
        return probs_at(self.ids, self.probs, tokens)

    def rows(self, lo: int, n: int) -> ShortlistLaw:
        return ShortlistLaw(self.ids[lo : lo + n], self.probs[lo : lo + n], self.vocab_size)

    def slots(self, lo: int, hi: int) -> ShortlistLaw:
        return ShortlistLaw(self.ids[:, lo:hi], self.probs[:, lo:hi], self.vocab_size)

    def pick(self, index: torch.Tensor) -> ShortlistLaw:
        rows = torch.arange(int(index.shape[0]), device=index.device)  # [B]
        return ShortlistLaw(self.ids[rows, index], self.probs[rows, index], self.vocab_size)

    def flat(self) -> ShortlistLaw:
        W = self.width
        return ShortlistLaw(self.ids.reshape(-1, W), self.probs.reshape(-1, W), self.vocab_size)

    def unsqueeze(self) -> ShortlistLaw:
        return ShortlistLaw(self.ids[:, None], self.probs[:, None], self.vocab_size)

    def residual_with(self, q: Law, where: torch.Tensor) -> ShortlistLaw:
        """On ``p``'s shortlist: ``max(0, p - q)`` is 0 wherever ``p`` is (docs/internals.md)."""
        probs = _residual(self.probs, q.prob_of(self.ids), where)  # [B, W]
        return ShortlistLaw(self.ids, probs, self.vocab_size)


Law = DenseLaw | ShortlistLaw  # a law over ``vocab_size`` tokens for each leading index


def _residual(p: torch.Tensor, q: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``max(0, p - q)`` (``p`` where that is empty) on rows ``where``, ``p`` elsewhere."""
    residual = (p - q).clamp(min=0.0)  # [B, W]
    residual = torch.where(~(residual.sum(-1) > 0)[:, None], p, residual)
    return torch.where(where[:, None], residual, p)


def onehot_law(tokens: torch.Tensor, vocab_size: int) -> ShortlistLaw:
    """δ(tokens) for token ids ``tokens`` ``[...]``: a ``ShortlistLaw`` ``[..., 1]``."""
    ones = torch.ones((*tokens.shape, 1), dtype=torch.float64, device=tokens.device)
    return ShortlistLaw(tokens[..., None], ones, vocab_size)


def cat_laws(laws: Sequence[Law]) -> Law:
    """``[B, J_i, *]`` laws as one ``[B, ΣJ_i, *]`` law along dimension 1: a shortlist when all
    are shortlists of one width, else dense."""
    short = [law for law in laws if isinstance(law, ShortlistLaw)]
    if len(short) == len(laws) and len({law.width for law in short}) == 1:
        ids = torch.cat([law.ids for law in short], dim=1)  # [B, ΣJ, W]
        probs = torch.cat([law.probs for law in short], dim=1)  # [B, ΣJ, W]
        return ShortlistLaw(ids, probs, short[0].vocab_size)
    return DenseLaw(torch.cat([law.dense() for law in laws], dim=1))  # [B, ΣJ, V]


def stack_laws(laws: Sequence[Law | None]) -> Law | None:
    """K per-slot laws ``[B, *]`` as one ``[B, K, *]`` law (``cat_laws``), or ``None`` when all
    are ``None`` (a one-hot drafter's q = δ(x)); mixed ``None``/law is a ``ValueError``."""
    if all(law is None for law in laws):
        return None
    given = [law for law in laws if law is not None]
    if len(given) != len(laws):
        raise ValueError("stack_laws: the law is None at some slots and given at others")
    return cat_laws([law.unsqueeze() for law in given])


def as_law(probs: torch.Tensor | Law) -> Law:
    """A law as given, or float64 probabilities ``[..., V]`` as a ``DenseLaw``."""
    return DenseLaw(probs) if isinstance(probs, torch.Tensor) else probs


def probs_at(ids: torch.Tensor, probs: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """A shortlist law's probabilities at token ids ``tok`` (0 where ``tok`` is not among
    ``ids``: the law is 0 off its shortlist): ``ids``, ``probs`` ``[..., W]`` (ids ascending),
    ``tok`` ``[..., J]`` → ``[..., J]`` float64, by a batched ``searchsorted`` + equality check."""
    W = int(ids.shape[-1])
    if W == 1:  # a one-hot law (``onehot_law``): the same values without the search (2 ops)
        return torch.where(ids == tok, probs, 0.0)
    pos = torch.searchsorted(ids.contiguous(), tok.contiguous()).clamp(max=W - 1)  # [..., J]
    hit = ids.gather(-1, pos) == tok  # [..., J]
    return torch.where(hit, probs.gather(-1, pos), 0.0)
