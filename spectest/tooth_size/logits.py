"""The next-token logits a tooth's size is computed from: one model after ``prompt + ctx`` for
many contexts, batched over the prompt's shared KV cache and kept within ``CACHE_BYTES``
(docs/statistics.md "Tooth sizes: the method"). Knows nothing about round laws or TV.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FORWARD_ROWS = 256  # rows per batched forward (and per expansion step of the completion)
CACHE_BYTES = 256 << 20  # logits kept per prompt and model (float32): 256 MiB


class ContextLogits:
    """Next-token logits of one model after ``prompt + ctx``, for many contexts ``ctx``: batched
    forwards over the prompt's shared KV cache (``prefill_shared``), kept by context up to
    ``CACHE_BYTES`` (the oldest dropped first: a large vocabulary keeps fewer). Kept on the
    model's device (``many(..., on_device=True)`` for the completion) with a host copy made once
    per batch for the round laws (on CPU the two are the same tensor)."""

    def __init__(
        self,
        model: Any,
        prompt: Sequence[int],
        *,
        keep_prompt: bool = True,
        rows: int = FORWARD_ROWS,
        attention: Any = None,
    ) -> None:
        import torch

        self.model = model
        self.keep_prompt = keep_prompt  # False: every batch prefills the prompt (the reference)
        self.forward_rows = rows  # contexts per batched forward
        self.attention = attention or contextlib.nullcontext  # a context around each forward
        self.prompt = torch.tensor(list(prompt), dtype=torch.int64, device=model.device)
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}  # on the model's device
        self.host: dict[tuple[int, ...], torch.Tensor] = {}  # CPU copies of some of them
        self.max_entries = max(16, CACHE_BYTES // (4 * int(model.vocab_size)))
        self.rows = 0  # forward rows computed (for the timings)
        self._one: tuple[Any, torch.Tensor] | None = None  # one-row prompt cache, its logits

    def get(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self.many([ctx])[0]

    def fill(self, ctxs: Sequence[tuple[int, ...]]) -> None:
        """Compute (and keep, as room allows) the contexts not kept yet, with host copies."""
        self._store(self._compute([c for c in ctxs if c not in self.cache]))
        self._host([c for c in dict.fromkeys(ctxs) if c in self.cache])

    def many(self, ctxs: Sequence[tuple[int, ...]], *, on_device: bool = False) -> torch.Tensor:
        """Logits ``[N, V]`` float32 after each context: on the CPU, or the model's device."""
        import torch

        if not on_device and all(c in self.host for c in ctxs):  # all kept (host ⊆ cache)
            return torch.stack([self.host[c] for c in ctxs])
        new = self._compute([c for c in ctxs if c not in self.cache])
        out = torch.stack([new[c] if c in new else self.cache[c] for c in ctxs])
        self._store(new)
        return out if on_device else out.cpu()

    def _shared_prefill(self) -> bool:
        """True when the model prefills a shared prompt as ``LanguageModel.prefill_shared`` does
        (one row, then ``repeat_rows``): its one-row prompt cache is then kept and copied."""
        from spectest.models.base import LanguageModel

        return self.keep_prompt and type(self.model).prefill_shared is LanguageModel.prefill_shared

    def _prompt_logits(self) -> torch.Tensor:
        """The prompt's logits [L, V] from one one-row forward, kept with its cache."""
        import torch

        if not self._shared_prefill():
            return self.model.prefill_shared(self.prompt, 1)[1]
        if self._one is None:
            with torch.inference_mode(), self.attention():
                cache = self.model.new_cache(1)
                self._one = (cache, self.model.forward(cache, self.prompt[None, :])[0])
        return self._one[1]

    def _prefilled(self, n: int) -> Any:
        """An ``n``-row cache holding the prompt: ``prefill_shared(prompt, n)``'s, the prompt's
        forward done once per model and prompt (a copy of the kept one-row cache, repeated)."""
        if not self._shared_prefill():
            return self.model.prefill_shared(self.prompt, n)[0]
        self._prompt_logits()
        assert self._one is not None
        cache = copy.deepcopy(self._one[0])
        cache.repeat_rows(n)
        return cache

    def _host(self, ctxs: Sequence[tuple[int, ...]]) -> None:
        todo = [c for c in ctxs if c not in self.host]
        if todo:  # one transfer for the batch
            import torch

            rows = torch.stack([self.cache[c] for c in todo]).cpu()
            self.host.update(zip(todo, rows.unbind(0), strict=True))

    def _store(self, new: dict[tuple[int, ...], torch.Tensor]) -> None:
        self.cache.update(new)
        while len(self.cache) > self.max_entries:
            self.host.pop(old := next(iter(self.cache)), None)
            del self.cache[old]

    def _compute(self, ctxs: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], torch.Tensor]:
        import torch

        todo = sorted(set(ctxs))
        out: dict[tuple[int, ...], torch.Tensor] = {}
        if () in todo:
            out[()] = self._prompt_logits()[-1].float().clone()
            self.rows += 1
            todo.remove(())
        by_len: dict[int, list[tuple[int, ...]]] = {}
        for c in todo:
            by_len.setdefault(len(c), []).append(c)
        with torch.inference_mode(), self.attention():
            for _, group in sorted(by_len.items()):
                for a in range(0, len(group), self.forward_rows):
                    part = group[a : a + self.forward_rows]
                    cache = self._prefilled(len(part))
                    ids = torch.tensor(part, dtype=torch.int64, device=self.model.device)
                    logits = self.model.forward(cache, ids)[:, -1].float().contiguous()  # [B, V]
                    self.rows += len(part)
                    out.update(zip(part, logits.unbind(0), strict=True))
        return out
