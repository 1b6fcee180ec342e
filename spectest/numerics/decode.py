"""Plain decode along fixed tokens for claim (b): ``decode_logits`` (one batch, the run's
schedule or a prefix-cache hit) and ``decode_and_alone``, the batch decode together with its
floor rows decoded alone (batch 1) — on CUDA as ``alone.FloorBranches`` beside the batch's
steps, on a stream of their own. Knows nothing about TVs, tables or which rows are measured.
Details: docs/internals.md "spectest/numerics/alone.py".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

import torch

from spectest.models.base import LanguageModel
from spectest.numerics.alone import FloorBranches, decode_steps

# a batch's floor rows (as ``FloorBranches``) decoded beside its batch decode, their steps
# interleaved and the branches on a stream of their own (``_decode_beside_alone``); False: one
# after the other
FLOOR_BESIDE_BATCH = True


@torch.no_grad()
def decode_logits(
    model: LanguageModel,
    prompt: torch.Tensor,
    tokens: torch.Tensor,
    keep: torch.Tensor,
    *,
    split: int | None = None,
) -> torch.Tensor:
    """Plain decode along ``tokens`` ``[B, T]`` in one batch: float32 logits ``[len(keep), T,
    V]`` of the rows ``keep``. ``split`` None: the prompt prefilled in one forward and shared
    (the reference loop's schedule); else ``prompt[:split]`` prefilled and shared, then
    ``prompt[split:]`` as one forward over every row (a prefix-cache hit at ``split``,
    ``numerics.floors``)."""
    out, steps = _decoding(model, prompt, tokens, keep, split)
    for _ in steps:
        pass
    return out


def _decoding(
    model: LanguageModel,
    prompt: torch.Tensor,
    tokens: torch.Tensor,
    keep: torch.Tensor,
    split: int | None = None,
) -> tuple[torch.Tensor, Iterator[int]]:
    """``decode_logits`` with its prefill done: the output ``[len(keep), T, V]``, complete once
    the returned steps (``decode_steps``) are exhausted. The caller holds ``torch.no_grad``."""
    B, T = int(tokens.shape[0]), int(tokens.shape[1])
    if split is None:
        cache, prompt_logits = model.prefill_shared(prompt, B)
        logits = prompt_logits[-1].expand(B, -1)
    else:
        assert 0 < split < len(prompt), (split, len(prompt))
        cache, _ = model.prefill_shared(prompt[:split], B)
        rest = prompt[split:][None, :].expand(B, -1).contiguous()
        logits = model.forward(cache, rest)[:, -1]
    out = torch.empty((len(keep), T, model.vocab_size), dtype=torch.float32, device=model.device)
    return out, decode_steps(model, cache, logits, tokens, keep, out)


@torch.no_grad()
def _decode_beside_alone(
    target: LanguageModel,
    prompt: torch.Tensor,  # [L]
    prompt_ids: Sequence[int],
    toks: torch.Tensor,  # [B, T] the batch's tokens
    keep: torch.Tensor,  # [M] the measured rows
    rows: Sequence[int],  # the batch's rows decoded alone too
    branches: FloorBranches,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``decode_logits(target, prompt, toks, keep)`` and ``branches(prompt, prompt_ids,
    toks[rows])`` with their steps interleaved, on CUDA the branches on a stream of their own
    (``FloorBranches.stream``): the device runs a floor step beside each batch step.

    Notes
    -----
    The same forwards on the same inputs as one after the other: only the issue order changes,
    hence the same bits (tests/test_numerics_alone.py). The caller checked that the branches'
    ``reserve`` is a no-op (it would drop the batch's pool). Order on the device: the kept
    prefill and the batch's restore on the caller's stream, then the branches' stream waits for
    them (worker 0 is the replay model itself, whose one-row pool the kept prefill is computed
    in); the caller's stream waits for the branches before their logits are read, and they are
    ``record_stream``-ed to it.
    """
    dev = target.device
    alone_toks = toks[list(rows)]  # [R, T] on the caller's stream, before the branches wait
    dec, batch = _decoding(target, prompt, toks, keep)  # the prompt's kept prefill, restored
    side = branches.stream
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(dev))
    alone: list[torch.Tensor] = []
    floor = branches.steps(prompt, prompt_ids, alone_toks, alone)
    live = [(batch, None), (floor, side)]
    while live:  # one step of each in turn
        for gen, stream in list(live):
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                if next(gen, None) is None:
                    live.remove((gen, stream))
    if side is not None:
        main = torch.cuda.current_stream(dev)
        main.wait_stream(side)
        for x in alone:
            x.record_stream(main)
    return dec, alone


def decode_and_alone(
    target: LanguageModel,
    prompt: torch.Tensor,
    prompt_ids: Sequence[int],
    toks: torch.Tensor,  # [B, T]
    keep: torch.Tensor,  # [M]
    rows: Sequence[int],
    *,
    streams: int,
    branches: FloorBranches | None,
) -> tuple[torch.Tensor, Iterable[torch.Tensor]]:
    """The batch decode's logits ``[M, T, V]`` and its ``rows`` decoded alone (``[T, V]`` each):
    beside each other where ``beside_batch`` allows, else one after the other (``_alone``)."""
    if (
        rows
        and branches is not None
        and beside_batch(target, branches, len(prompt_ids) + toks.shape[1])
    ):
        return _decode_beside_alone(target, prompt, prompt_ids, toks, keep, rows, branches)
    dec = decode_logits(target, prompt, toks, keep)
    return dec, _alone(target, prompt, prompt_ids, toks, rows, streams, branches)


def beside_batch(target: LanguageModel, branches: FloorBranches | None, slots: int) -> bool:
    """Whether ``measure_drift`` runs a batch's floor rows beside its batch decode
    (``_decode_beside_alone``): as ``branches``, when ``FLOOR_BESIDE_BATCH`` is on and the
    branches' reserve of ``slots`` would change nothing (else one after the other, as before)."""
    return FLOOR_BESIDE_BATCH and branches is not None and branches.model.max_slots >= slots


def _alone(
    target: LanguageModel,
    prompt: torch.Tensor,
    prompt_ids: Sequence[int],
    toks: torch.Tensor,  # [B, T] the batch's tokens
    rows: Sequence[int],
    streams: int,
    branches: FloorBranches | None = None,
) -> Iterator[torch.Tensor]:
    """The batch's ``rows`` decoded alone (batch 1), each row's float32 logits ``[T, V]`` in
    order: one at a time, ``streams`` at once on a replay model, or all at once as ``branches``
    of one graph per step (``numerics.alone``: each row still its own batch-1 forwards, the
    same bits)."""
    from spectest.numerics.alone import alone_logits, concurrent

    if branches is not None:
        if rows:
            yield from branches(prompt, prompt_ids, toks[list(rows)])
        return
    if streams > 1 and concurrent(target):
        yield from alone_logits(
            target, prompt, prompt_ids, [toks[r : r + 1] for r in rows], streams
        )
        return
    keep = torch.zeros(1, dtype=torch.int64, device=toks.device)
    for r in rows:  # the row alone: batch 1, logits [T, V]
        yield decode_logits(target, prompt, toks[r : r + 1], keep)[0]
