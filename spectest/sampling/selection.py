"""The shortlist's selection: the ``W`` largest logits of each row, as ascending token ids, with
ties at the ``W``-th value going to the lowest ids (``select_shortlist``). Knows nothing about
sampling parameters, laws or models; ``shortlist`` builds its law on these ids.

The details: docs/architecture.md "The shortlist's selection".
"""

from __future__ import annotations

import os

import torch

from spectest.errors import InputError

# How the ids are chosen: "blocks" (block maxima, then the top ``W`` among the best blocks'
# tokens: ``select_blocks``), "topk" (one ``torch.topk`` over the whole row: the selection before
# h95) or "auto" (blocks on CUDA, where ``torch.topk`` takes the lowest ids on ties too; topk
# elsewhere, where it is the faster). ``SPECTEST_SELECTION=topk`` sets it for a process (an A/B
# in one tree); tools/gpu/selection_bench.py times both on P2's shapes.
SELECTION = os.environ.get("SPECTEST_SELECTION", "auto")
BLOCK = 8  # tokens per block: the block maxima are ``[M, V / BLOCK]``
BLOCKS_PER_TOKEN = 2  # blocks kept per shortlisted token: ``2·W`` blocks, ``2·W·BLOCK`` candidates


def uses_blocks(x: torch.Tensor, W: int) -> bool:
    """Whether ``select_shortlist`` takes the block path for logits ``x`` ``[M, V]`` at width
    ``W``: ``SELECTION`` says so, ``V`` is a multiple of ``BLOCK`` and the candidates are at most
    half a row."""
    if SELECTION not in ("auto", "blocks", "topk"):
        raise InputError(f"SELECTION must be auto, blocks or topk, got {SELECTION!r}")
    V = int(x.shape[-1])
    on = SELECTION == "blocks" or (SELECTION == "auto" and x.device.type == "cuda")
    return on and V % BLOCK == 0 and 2 * BLOCKS_PER_TOKEN * W * BLOCK <= V


def block_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min, max)`` of each block of ``BLOCK`` logits of ``x`` ``[M, V]``: ``[M, V / BLOCK]``
    each, in one read (``torch.aminmax``: NaN propagates, so the row's min and max follow)."""
    M, V = (int(s) for s in x.shape)
    lo, hi = torch.aminmax(x.reshape(M, V // BLOCK, BLOCK), dim=-1)
    return lo, hi


def topk_ids(x: torch.Tensor, W: int) -> torch.Tensor:
    """``[M, W]`` ascending ids of ``torch.topk``'s ``W`` largest per row (the old selection;
    which tied ids it takes at the ``W``-th value is ``torch.topk``'s)."""
    return torch.topk(x, W, dim=-1, sorted=False).indices.sort(dim=-1).values


def select_shortlist(x: torch.Tensor, W: int, bmax: torch.Tensor | None = None) -> torch.Tensor:
    """``[M, W]`` int64 ascending ids: the ``W`` largest of each row of ``x`` ``[M, V]`` (logits
    as given: float32, float64, bfloat16, float16; comparisons only).

    ``bmax``: ``block_max(x)[1]`` when the caller has it. On the block path the ties at the
    ``W``-th value go to the lowest ids (what ``torch.topk`` does on CUDA); rows the blocks do not
    decide, and every row off the block path, take ``topk_ids`` (one host sync for the count).

    Notes
    -----
    Equal to ``topk_ids`` wherever the ``W``-th value is not tied (on CUDA, where ``torch.topk``
    takes the first-seen ties, tied or not), and on the rows the blocks decide to a stable
    descending sort's first ``W`` ids (tests/test_sampling_selection.py).
    """
    if not uses_blocks(x, W):
        return topk_ids(x, W)
    ids, bad = select_blocks(x, W, block_max(x)[1] if bmax is None else bmax)
    return patch_rows(ids, bad, x, W, int(bad.sum()))


def patch_rows(
    ids: torch.Tensor, bad: torch.Tensor, x: torch.Tensor, W: int, n_bad: int
) -> torch.Tensor:
    """``ids`` ``[M, W]`` with the ``n_bad`` rows of ``bad`` ``[M]`` taken by ``topk_ids``."""
    if not n_bad:
        return ids
    rows = torch.nonzero(bad).squeeze(-1)  # [F]
    return ids.index_put((rows,), topk_ids(x[rows], W))


def select_blocks(x: torch.Tensor, W: int, bmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [M, W] ascending, bad [M] bool)``: the ``W`` largest of each row of ``x`` ``[M, V]``
    (ties to the lowest ids) found among the tokens of its ``2·W`` blocks of largest maximum
    (``bmax`` ``[M, V / BLOCK]``); ``bad`` marks rows where that is not decided (their ids are
    arbitrary). No host sync.

    Notes
    -----
    Why it is exact: every block left out has its maximum ``<= thr``, the smallest kept block
    maximum, so every token ``> thr`` is a candidate. When the candidates' ``W``-th largest ``kv``
    is ``> thr``, the row's ``W`` largest and every token equal to ``kv`` are candidates, so the
    candidates' top ``W`` (ties by id) is the row's. Else (``kv <= thr``, or NaN) the row is bad.
    """
    M, V = (int(s) for s in x.shape)
    L, nb = BLOCK, BLOCKS_PER_TOKEN * W
    top = torch.topk(bmax, nb, dim=-1, sorted=False)  # [M, nb] the blocks of largest maximum
    thr = top.values.amin(-1)  # [M] no block left out has a larger maximum
    blocks = top.indices.sort(dim=-1).values  # [M, nb] ascending: candidates in id order
    cv = x.reshape(M, V // L, L).gather(1, blocks[:, :, None].expand(M, nb, L)).reshape(M, nb * L)
    kv = torch.topk(cv, W, dim=-1, sorted=False).values.amin(-1)  # [M] W-th largest candidate
    bad = ~(kv > thr)  # [M] (NaN: amin propagates it)
    # the row's W: every candidate > kv, then the lowest-id candidates == kv up to W
    gt = cv > kv[:, None]  # [M, nb·L]
    eq = cv == kv[:, None]  # [M, nb·L]
    need = W - gt.sum(-1, keepdim=True)  # [M, 1] in [1, W] on a decided row
    sel = gt | (eq & (eq.cumsum(-1, dtype=torch.int32) <= need))  # [M, nb·L] W per decided row
    # NOTE a bad row keeps its first W candidates, so every row has W and the row-major
    # positions below stay aligned (a bad row's ids are replaced by the caller)
    first = torch.arange(nb * L, device=x.device) < W  # [nb·L]
    sel = torch.where(bad[:, None], first, sel)
    pos = torch.nonzero_static(sel, size=M * W)[:, 1].reshape(M, W)  # [M, W] ascending
    ids = blocks.gather(-1, pos // L) * L + pos % L  # [M, W] ascending token ids
    return ids, bad
