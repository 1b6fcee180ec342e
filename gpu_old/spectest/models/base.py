"""The ``LanguageModel`` interface: batched next-token logits over a slot-based KV cache.

Owns: the abstract interface every model in the zoo implements, and the cache contract the
engines rely on. Knows nothing about sampling, temperatures or speculative decoding.

Cache contract (slots with validity)
------------------------------------
A cache holds, per row, a sequence of *slots*; slot ``j`` holds the keys/values (or, for the toy
LM, the token) written by the ``j``-th input position ever fed to this cache. All rows of a cache
always have the same number of slots (static shapes, no per-row Python loops).

- ``forward(cache, input_ids[B, S])`` appends ``S`` slots to every row. Query ``i`` of the call
  attends to every *valid* earlier slot of its row and to the current positions ``0..i`` (causal).
  Position ids are *per row*: the number of valid slots before the token. Returns float32 logits
  ``[B, S, V]`` for the next token after each input position.
- ``cache.invalidate(mask[B, num_slots])`` marks slots invalid: they are excluded from all later
  attention and from later position counting (a "hole"). This is how the speculative engine
  drops rejected draft tokens without ragged cropping: holes never occur inside the current call,
  so no query is ever fully masked.
- ``cache.valid`` is a bool tensor ``[B, num_slots]``; ``cache.num_slots`` an int.

Rows of one cache share nothing but shapes; row ``b``'s logits depend only on row ``b``'s valid
slots (batch invariance up to floating-point reduction order on GPU).
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
        """Append ``input_ids`` [B, S] (int64) to ``cache``; return logits [B, S, V] float32."""

    def prefill_shared(self, prompt: torch.Tensor, batch_size: int) -> tuple[Cache, torch.Tensor]:
        """Prefill one prompt once and share it: a ``batch_size``-row cache and logits [L, V].

        ``prompt`` is [L] int64. The prompt is run as a single row, then its cache is repeated,
        so a batch of B rows costs one prompt forward instead of B. NOTE: every row then holds
        bit-identical prompt state whatever the batch size, which also makes rows independent of
        the batch composition during prefill (GEMM kernels can differ with the row count).
        """
        assert prompt.dim() == 1, prompt.shape
        cache = self.new_cache(1)
        logits = self.forward(cache, prompt[None, :])[0]  # [L, V]
        cache.repeat_rows(batch_size)
        return cache, logits

    def reserve(self, max_slots: int) -> None:
        """Make room for ``max_slots`` slots per row before a decode (a growing cache needs
        none; a preallocated one, ``engines.fast.StaticHFModel``, grows its pool)."""
        return None

    def logits_full(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits [B, L, V] for full sequences [B, L] (fresh cache, no holes)."""
        return self.forward(self.new_cache(int(input_ids.shape[0])), input_ids)
