"""An analytic toy language model: a seeded order-n Markov chain (``ToyLM``, ``ToyCache``). Knows
nothing about sampling. Why and details: docs/internals.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from spectest.errors import ModelError
from spectest.models.base import Cache, LanguageModel

MAX_TABLE_ENTRIES = 1 << 24  # the table is materialised: a typo (V=50000, order=3) fails fast


class ToyCache(Cache):
    """Token history per slot (the toy LM's whole "KV" state is the tokens themselves)."""

    def __init__(self, batch_size: int, device: torch.device) -> None:
        self.tokens = torch.zeros((batch_size, 0), dtype=torch.int64, device=device)  # [B, N]
        self.valid = torch.zeros((batch_size, 0), dtype=torch.bool, device=device)  # [B, N]

    def repeat_rows(self, n: int) -> None:
        assert self.batch_size == 1, self.batch_size
        self.tokens = self.tokens.expand(n, -1).clone()  # [n, N]
        self.valid = self.valid.expand(n, -1).clone()  # [n, N]


class ToyLM(LanguageModel):
    """A seeded order-``n`` Markov chain with closed-form conditionals.

    Parameters
    ----------
    vocab_size : ``V`` >= 2.
    order : ``n`` >= 1; the logits depend on the last ``n - 1`` valid tokens.
    scale : the logits' standard deviation (iid normal); sets the entropy.
    seed : the table's seed (a private ``torch.Generator``; global RNG untouched).
    device : where the table lives.

    Notes
    -----
    ``forward`` recomputes each query's context from the cache's token history and validity, so
    holes are honoured by construction (tested against ``conditional_logits``).
    """

    def __init__(
        self,
        vocab_size: int,
        order: int = 2,
        scale: float = 1.0,
        seed: int = 0,
        *,
        device: torch.device | str = "cpu",
        table: torch.Tensor | None = None,
        name: str | None = None,
        numerics: float = 0.0,
        verify_numerics: float | None = None,
    ) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
            raise ModelError(f"toy: V must be an integer >= 2, got {vocab_size!r}")
        if isinstance(order, bool) or not isinstance(order, int) or order < 1:
            raise ModelError(f"toy: order must be an integer >= 1, got {order!r}")
        if not isinstance(scale, (int, float)) or not (scale >= 0.0) or scale == float("inf"):
            raise ModelError(f"toy: scale must be a finite number >= 0, got {scale!r}")
        for what, v in (("numerics", numerics), ("verify_numerics", verify_numerics)):
            if v is not None and not (isinstance(v, (int, float)) and 0.0 <= v < float("inf")):
                raise ModelError(f"toy: {what} must be a finite number >= 0, got {v!r}")
        self.numerics = float(numerics)
        self.verify_numerics = self.numerics if verify_numerics is None else float(verify_numerics)
        num_contexts = (vocab_size + 1) ** (order - 1)
        if num_contexts * vocab_size > MAX_TABLE_ENTRIES:
            raise ModelError(
                f"toy: table of (V+1)^(order-1) x V = {num_contexts * vocab_size} entries exceeds "
                f"{MAX_TABLE_ENTRIES}; got V={vocab_size!r}, order={order!r}"
            )
        self.vocab_size = vocab_size
        self.order = order
        self.scale = float(scale)
        self.seed = int(seed)
        self.name = name or f"toy:V={vocab_size},order={order},scale={scale},seed={seed}"
        if table is None:
            gen = torch.Generator().manual_seed(int(seed))
            # float64 on CPU from a private generator (every machine alike), stored as float32
            table = float(scale) * torch.randn(
                (num_contexts, vocab_size), generator=gen, dtype=torch.float64
            )
        assert table.shape == (num_contexts, vocab_size), table.shape
        self.table = table.to(device=device, dtype=torch.float32)  # [(V+1)^(n-1), V]

    # -- LanguageModel -------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.table.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def new_cache(self, batch_size: int) -> ToyCache:
        return ToyCache(batch_size, self.device)

    def forward(self, cache: Cache, input_ids: torch.Tensor) -> torch.Tensor:
        assert isinstance(cache, ToyCache), type(cache)
        assert input_ids.dim() == 2 and input_ids.shape[0] == cache.batch_size, input_ids.shape
        _check_ids(input_ids, self.vocab_size, self.name)
        B, S = input_ids.shape
        n0 = cache.num_slots
        cache.tokens = torch.cat([cache.tokens, input_ids.to(self.device)], dim=1)  # [B, N]
        cache.valid = torch.cat(
            [cache.valid, torch.ones((B, S), dtype=torch.bool, device=self.device)], dim=1
        )  # [B, N]
        if S == 0:
            return torch.zeros((B, 0, self.vocab_size), dtype=torch.float32, device=self.device)
        idx = self._context_index(cache.tokens, cache.valid, n0)  # [B, S]
        sigma = self.verify_numerics if S > 1 else self.numerics
        if sigma > 0.0:
            return self.table[idx] + sigma * self._shape_noise(idx, B, S)
        return self.table[idx]  # [B, S, V]

    def _shape_noise(self, idx: torch.Tensor, B: int, S: int) -> torch.Tensor:
        """``z`` ``[B, S, V]`` float32, variance 1, a function of (context, offset, S, B, seed,
        token): the simulated numerics of docs/internals.md (one kept table per shape (S, B))."""
        tables = self.__dict__.setdefault("_noise", {})
        if (S, B) not in tables:
            digest = hashlib.sha256(f"toy-numerics:{self.seed}:{S}:{B}".encode()).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
            u = torch.rand((self.table.shape[0], S, self.vocab_size), generator=gen)
            tables[(S, B)] = ((u - 0.5) * 12**0.5).to(device=self.device, dtype=torch.float32)
        j = torch.arange(S, device=idx.device)[None, :].expand_as(idx)
        return tables[(S, B)][idx, j]

    # -- closed form -----------------------------------------------------------------------------
    def context_index(self, context: Sequence[int]) -> int:
        """Row of the table used after ``context`` (a hole-free token list)."""
        m = self.order - 1
        padded = [self.vocab_size] * m + [int(t) for t in context]  # start symbols on the left
        idx = 0
        for tok in padded[len(padded) - m :]:
            idx = idx * (self.vocab_size + 1) + tok
        return idx

    def conditional_logits(self, context: Sequence[int]) -> torch.Tensor:
        """Exact float32 logits ``[V]`` of the next token after a hole-free ``context``."""
        for tok in context:
            if not 0 <= int(tok) < self.vocab_size:
                raise ModelError(f"{self.name}: token id {tok!r} outside [0, {self.vocab_size})")
        return self.table[self.context_index(context)].clone()

    def perturbed(self, noise: float, seed: int) -> ToyLM:
        """A related draft: the same table plus iid ``noise * N(0, 1)`` (seeded); same V, order."""
        if not isinstance(noise, (int, float)) or not noise >= 0.0:
            raise ModelError(f"toy: noise must be a number >= 0, got {noise!r}")
        gen = torch.Generator().manual_seed(int(seed))
        eps = torch.randn(tuple(self.table.shape), generator=gen, dtype=torch.float64)
        table = self.table.double().cpu() + float(noise) * eps
        return ToyLM(
            self.vocab_size,
            self.order,
            self.scale,
            self.seed,
            device=self.device,
            table=table,
            name=f"{self.name}+noise={noise},seed={seed}",
        )

    # -- internals -------------------------------------------------------------------------------
    def _context_index(self, tokens: torch.Tensor, valid: torch.Tensor, n0: int) -> torch.Tensor:
        """Table rows for the queries at slots ``n0..N-1`` of every row. Returns [B, S] int64."""
        B, N = tokens.shape  # [B, N]
        m = self.order - 1
        if m == 0:
            return torch.zeros((B, N - n0), dtype=torch.int64, device=tokens.device)
        # Compact the valid tokens of each row to the left (stable: keeps their order).
        perm = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)  # [B, N]
        compact = torch.gather(tokens, 1, perm)  # [B, N], valid tokens first
        rank = (
            valid.to(torch.int64).cumsum(1)[:, n0:] - 1
        )  # [B, S] rank of each query among valid slots
        idx = torch.zeros_like(rank)  # [B, S]
        for j in range(m - 1, -1, -1):  # oldest context token first
            r = rank - j  # [B, S]
            tok = torch.gather(compact, 1, r.clamp(min=0))  # [B, S]
            tok = torch.where(r >= 0, tok, torch.full_like(tok, self.vocab_size))  # start symbol
            idx = idx * (self.vocab_size + 1) + tok
        return idx


def _check_ids(input_ids: torch.Tensor, vocab_size: int, name: str) -> None:
    if input_ids.dtype != torch.int64:
        raise ModelError(f"{name}: input_ids must be int64, got {input_ids.dtype!r}")
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)][0].item()
        raise ModelError(f"{name}: token id {bad!r} outside [0, {vocab_size})")
