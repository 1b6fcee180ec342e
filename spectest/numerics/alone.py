"""The batch floor's rows decoded alone (batch 1): along their shared token prefixes, each prefix
decoded once (``SHARE_PREFIXES``, ``shared_logits``), or several rows at once, each on its own
worker model and CUDA stream (``FLOOR_STREAMS``: 1 by default, ``decode_steps``, ``concurrent``,
``alone_logits``). Knows nothing about TVs, tables or which rows are measured. Details:
docs/internals.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

import numpy as np
import torch

from spectest.models.base import Cache, LanguageModel
from spectest.models.static import StaticHFModel
from spectest.numerics.replay import ReplayStaticModel

# rows decoded alone at once on CUDA (one stream each): 1, one at a time. 8 at once was measured
# slower on the H200 at P1: the numerics phase passed 140 s against 21.7 s one at a time
# (results/LOG.md "lead (session 11)"); ``drift_table(streams=)`` and the tools still take N
FLOOR_STREAMS = 1
# one row at a time on a static-cache model: a row's forwards start where its tokens leave the
# previous row's (rows in token order); False: every row from its prompt (the same bits, slower)
SHARE_PREFIXES = True
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


def shares(model: LanguageModel) -> TypeGuard[StaticHFModel]:
    """True when ``shared_logits`` can run ``model``'s one-row decodes (``SHARE_PREFIXES`` and a
    static-cache model, whose cache goes back to a prefix by its slot count)."""
    return SHARE_PREFIXES and isinstance(model, StaticHFModel)


@torch.no_grad()
def shared_logits(
    model: StaticHFModel,
    prompt: torch.Tensor,  # [L]
    toks: torch.Tensor,  # [B, T]
    host_toks: np.ndarray,  # [B, T] the same tokens, on the host
    rows: Sequence[int],
) -> list[torch.Tensor]:
    """Each of ``rows`` decoded alone after ``prompt`` (``table.decode_logits`` of that row,
    batch 1): its float32 logits ``[T, V]``, in order. Rows run in token order, one at a time;
    a row sharing its first ``d`` tokens with the row before copies that row's logits at
    positions ``0..d`` and continues from its cache cut back to ``prompt`` + those ``d`` tokens.

    Notes
    -----
    Bit-identical to one row at a time: position ``t``'s logits are a function of the prompt
    and tokens ``0..t-1`` alone (batch 1, one forward per token), and every forward that runs
    is the one the row's own decode runs — same slots, window, graph and inputs; the slots
    from ``L + d`` on are rewritten before they are attended (masked until then), as when a
    row follows another on the one-row pool.
    """
    T = int(host_toks.shape[1])
    order = sorted(rows, key=lambda r: tuple(int(x) for x in host_toks[r]))
    cache, prompt_logits = model.prefill_shared(prompt, 1)
    L = cache.num_slots
    outs: dict[int, torch.Tensor] = {}
    prev: int | None = None
    for i in order:
        out = torch.empty((T, model.vocab_size), dtype=torch.float32, device=model.device)
        d = 0 if prev is None else _common(host_toks[prev], host_toks[i])
        if prev is None:
            out[0] = prompt_logits[-1].float()
        else:
            out[: min(d, T - 1) + 1] = outs[prev][: min(d, T - 1) + 1]
            cache.valid = cache.valid[:, : L + min(d, T - 1)]
        for t in range(min(d, T - 1), T - 1):  # token t in, position t + 1's logits out
            out[t + 1] = model.forward(cache, toks[i : i + 1, t : t + 1])[0, 0].float()
        outs[i], prev = out, i
    return [outs[r] for r in rows]


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the common prefix of two token rows."""
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if len(diff) else len(a)


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
