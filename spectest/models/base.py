"""The ``LanguageModel`` interface: batched next-token logits over a slot-based KV cache, and the
cache contract. Knows nothing about sampling. Why and details: docs/internals.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Cache(ABC):
    """A per-row slot cache. Subclasses hold model-specific state (KV tensors, token history)."""

    valid: torch.Tensor  # [B, num_slots] bool

    @property
    def num_slots(self) -> int:
        return int(self.valid.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.valid.shape[0])

    def invalidate(self, mask: torch.Tensor) -> None:
        """Mark ``mask`` [B, num_slots] bool slots as holes (extra trailing columns allowed)."""
        assert mask.dtype == torch.bool and mask.shape[0] == self.valid.shape[0]
        self.valid = self.valid & ~mask[:, : self.num_slots]

    @abstractmethod
    def repeat_rows(self, n: int) -> None:
        """In place: turn a one-row cache into ``n`` identical rows (shared-prompt prefill)."""


class LanguageModel(ABC):
    """A causal LM that returns next-token logits. Nothing about sampling lives here."""

    name: str
    vocab_size: int

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @abstractmethod
    def new_cache(self, batch_size: int) -> Cache:
        """An empty cache (0 slots) for ``batch_size`` rows."""

    @abstractmethod
    def forward(self, cache: Cache, input_ids: torch.Tensor) -> torch.Tensor:
        """Append ``input_ids`` [B, S] (int64) to ``cache``; return logits [B, S, V] float32 (a
        ``StaticHFModel`` with ``native_logits``: the model's own dtype, exact in float32, or under
        a ``logit_scale`` a ``sampling.scaled.ScaledLogits`` standing for the float32 product)."""

    def prefill_shared(self, prompt: torch.Tensor, batch_size: int) -> tuple[Cache, torch.Tensor]:
        """Prefill one prompt ``[L]`` once as a single row and repeat its cache: a
        ``batch_size``-row cache with bit-identical prompt state whatever the batch size, and
        logits [L, V]."""
        assert prompt.dim() == 1, prompt.shape
        cache = self.new_cache(1)
        logits = self.forward(cache, prompt[None, :])[0]  # [L, V]
        cache.repeat_rows(batch_size)
        return cache, logits

    def reserve(self, max_slots: int) -> None:
        """Make room for ``max_slots`` slots per row before a decode (a growing cache needs
        none; a preallocated one, ``models.static.StaticHFModel``, grows its pool)."""
        return None

    def logits_full(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits [B, L, V] for full sequences [B, L] (fresh cache, no holes)."""
        return self.forward(self.new_cache(int(input_ids.shape[0])), input_ids)
