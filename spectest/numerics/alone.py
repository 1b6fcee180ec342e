"""The batch floor's rows decoded alone, several at once: each row still its own batch-1 plain
decode, on its own worker model and CUDA stream (``FLOOR_STREAMS``: 1 by default, ``decode_steps``,
``concurrent``, ``alone_logits``). Knows nothing about TVs, tables or which rows are measured.
Details: docs/internals.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

import torch

from spectest.models.base import Cache, LanguageModel
from spectest.numerics.replay import ReplayStaticModel

# rows decoded alone at once on CUDA (one stream each): 1, one at a time. 8 at once was measured
# slower on the H200 at P1: the numerics phase passed 140 s against 21.7 s one at a time
# (results/LOG.md "lead (session 11)"); ``drift_table(streams=)`` and the tools still take N
FLOOR_STREAMS = 1
_DONE = -1


def decode_steps(
    model: LanguageModel,
    cache: Cache,
    logits: torch.Tensor,  # [B, V] after the prompt
    tokens: torch.Tensor,  # [B, T]
    keep: torch.Tensor,  # [M] rows kept
    out: torch.Tensor,  # [M, T, V] float32, filled
) -> Iterator[int]:
    """Plain decode's steps after the prefill, one forward per ``next`` (yields the position whose
    logits it gave; ``alone_logits`` interleaves rows'). The caller holds ``torch.no_grad``."""
    T = int(tokens.shape[1])
    for t in range(T):
        out[:, t] = logits[keep].float()
        if t + 1 < T:
            logits = model.forward(cache, tokens[:, t : t + 1])[:, 0]
            yield t + 1


def concurrent(model: LanguageModel) -> TypeGuard[ReplayStaticModel]:
    """True when ``alone_logits`` can run ``model``'s one-row decodes at once: a replay model
    (the ``--fast`` replay's static-cache model; on CPU too, in turn, for the tests)."""
    return isinstance(model, ReplayStaticModel)


@torch.no_grad()
def alone_logits(
    model: ReplayStaticModel,
    prompt: torch.Tensor,  # [L]
    prompt_ids: Sequence[int],  # the same ids, on the host
    rows: Sequence[torch.Tensor],  # each [1, T]
    streams: int,
) -> Iterator[torch.Tensor]:
    """Each row decoded alone after ``prompt`` (``table.decode_logits`` of that row, batch 1):
    its float32 logits ``[T, V]``, in order, ``streams`` rows at a time.

    Notes
    -----
    Bit-identical to one row at a time: the same batch-1 forwards on workers built like
    ``model``, only the issue order changes; the stream order (docs/internals.md
    "spectest/numerics/alone.py") keeps the kept prefill and the logits ready.
    """
    key = tuple(int(t) for t in prompt_ids)
    model.snapshot(key, prompt)  # on the caller's stream, before any worker reads it
    workers = model.workers(max(1, streams))
    for lo in range(0, len(rows), len(workers)):
        yield from _group(workers, key, rows[lo : lo + len(workers)])


def _group(
    workers: Sequence[ReplayStaticModel], key: tuple[int, ...], rows: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``rows`` (at most one per worker) decoded at once: their logits ``[T, V]``, in order."""
    dev = workers[0].device
    main = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
    T = int(rows[0].shape[1])
    keep = torch.zeros(1, dtype=torch.int64, device=dev)
    steps, outs = [], []
    for w, row in zip(workers, rows, strict=False):
        assert row.shape == (1, T), row.shape
        if w.stream is not None and main is not None:
            w.stream.wait_stream(main)  # the row's tokens and the kept prefill are ready
        with _on(w):
            cache, logits = w.restore(key, 1)
            out = torch.empty((1, T, w.vocab_size), dtype=torch.float32, device=dev)
        steps.append(decode_steps(w, cache, logits[-1].expand(1, -1), row, keep, out))
        outs.append(out)
    live = list(range(len(steps)))
    while live:  # one forward of each live row in turn
        for i in list(live):
            with _on(workers[i]):
                if next(steps[i], _DONE) == _DONE:
                    live.remove(i)
    for w, out in zip(workers, outs, strict=False):
        if w.stream is not None and main is not None:
            main.wait_stream(w.stream)
            out.record_stream(main)  # read on the caller's stream from here on
    return [out[0] for out in outs]


def _on(worker: ReplayStaticModel) -> Any:
    """A context issuing work on ``worker``'s stream (nothing on CPU)."""
    if worker.stream is None:
        return contextlib.nullcontext()
    return torch.cuda.stream(worker.stream)
