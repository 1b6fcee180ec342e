"""Completing a tooth's first-round law by plain sampling: the signed marginals per position, on
the model's device or, slowly, on the host (``complete``), and the TV per position they give
(docs/statistics.md "Tooth sizes: the method").
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from spectest.tooth_size.logits import FORWARD_ROWS, ContextLogits

if TYPE_CHECKING:
    import torch


def complete(
    todo: dict[int, tuple[np.ndarray, np.ndarray]],
    marg: np.ndarray,
    slack: np.ndarray,
    target: ContextLogits,
    params: Any,
    budget: int,
    *,
    reference: bool = False,
    prefetch: bool = False,
) -> None:
    """Complete the round-law differences ``todo`` by plain sampling, most weight first within
    ``budget`` contexts, into the marginals ``marg`` [n, V] and ``slack`` [n] (in place). The
    dense work stays on the model's device (each chunk's plain law ``[rows, V]`` float64, the
    marginals, the children's nonzeros): per length one transfer of the children, one of the
    marginals at the end. ``prefetch``: the logits of all the contexts of a length come from one
    ``target.many`` call (``target.forward_rows`` rows per forward) instead of one per chunk.
    ``reference``: the slow reference (numpy, every chunk's law copied to the host).

    Notes
    -----
    Equal to the reference bit for bit on CPU (the same float64 operations in the same order:
    the weighted sum of rows is numpy's there). On another device the plain law and the weighted
    sum of rows are that device's float64 (the law the sampler under test draws from there);
    ``tools/gpu/tooth_size_bench.sh`` reports the largest difference in TV from the reference.
    """
    import torch

    from spectest.sampling.params import SamplingTensors

    n = marg.shape[0]
    if reference:
        prm = SamplingTensors.from_params([params])
        _complete_by(todo, slack, budget, n, _merge, partial(_expand_host, target, prm, marg))
        return
    dev = torch.device(target.model.device)
    prm = SamplingTensors.from_params([params], device=dev)
    m = torch.from_numpy(marg).to(dev)  # [n, V] on the device (on CPU: marg itself)
    _complete_by(todo, slack, budget, n, _merge_fast, partial(_expand, target, prm, m, prefetch))
    marg[:] = m.cpu().numpy()


def _complete_by(
    todo: dict[int, tuple[np.ndarray, np.ndarray]],
    slack: np.ndarray,
    budget: int,
    n: int,
    merge: Any,
    expand: Any,
) -> None:
    """Both completions' bookkeeping: per length, the ``merge``d sequences (token order) most
    weight first, those within ``budget`` to ``expand(seqs, w, length, children)`` (adds their
    plain law to the marginal, returns the children ``[(tokens [M, length + 1], weights
    [M])]``), the rest's mass to ``slack`` [n]."""
    spent = 0
    for length in range(1, n):
        if length not in todo:
            continue
        seqs, w = merge(*todo.pop(length))
        order = np.argsort(-np.abs(w), kind="stable")  # most weight first, ties by tokens
        seqs, w = seqs[order], w[order]
        k = min(len(w), max(0, budget - spent))
        slack[length:] += 0.5 * float(np.abs(w[k:]).sum())  # left out: at most |w|/2 each
        if k == 0:
            continue
        spent += k
        kids = expand(seqs[:k], w[:k], length, length + 1 < n)
        if kids:
            if length + 1 in todo:
                kids.insert(0, todo[length + 1])
            todo[length + 1] = (
                np.concatenate([c for c, _ in kids]),
                np.concatenate([cw for _, cw in kids]),
            )


def _expand(
    target: ContextLogits,
    prm: Any,
    marg: torch.Tensor,
    prefetch: bool,
    seqs: np.ndarray,
    w: np.ndarray,
    length: int,
    children: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Add the plain law after each of the sequences ``seqs`` [k, length], weighted by ``w``
    [k], to ``marg[length]`` [V] (in place, on the device), ``FORWARD_ROWS`` at a time; with
    ``children``, return their nonzero continuations ``[(tokens [M, length + 1], weights [M])]``
    (one transfer to the host)."""
    import torch

    from spectest.sampling.transforms import logits_to_probs

    dev = marg.device
    k = len(w)
    kids: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    ctxs = [tuple(r) for r in seqs.tolist()] if prefetch else []
    pre = target.many(ctxs, on_device=True) if prefetch else None  # [k, V]
    for a in range(0, k, FORWARD_ROWS):  # in chunks: [rows, V] float64 for a large V
        s_a, w_a = seqs[a : min(k, a + FORWARD_ROWS)], w[a : min(k, a + FORWARD_ROWS)]
        if pre is not None:
            logits = pre[a : a + len(w_a)]  # [rows, V]
        else:
            logits = target.many([tuple(r) for r in s_a.tolist()], on_device=True)
        rows_p = prm.index(torch.zeros(len(w_a), dtype=torch.int64, device=dev))
        probs = logits_to_probs(logits, rows_p)  # [rows, V] the plain law, on the device
        w_t = torch.from_numpy(w_a).to(dev)
        marg[length] += _weighted_rows(w_a, w_t, probs)
        if children:
            rows, toks = (probs > 0.0).nonzero(as_tuple=True)  # row-major, as numpy's
            kids.append((rows + a, toks, w_t[rows] * probs[rows, toks]))
    if not kids:
        return []
    rows_k, toks_k, w_k = (torch.cat(x).cpu().numpy() for x in zip(*kids, strict=True))
    return [(np.concatenate([seqs[rows_k], toks_k[:, None]], axis=1), w_k)]


def _expand_host(
    target: ContextLogits,
    prm: Any,
    marg: np.ndarray,
    seqs: np.ndarray,
    w: np.ndarray,
    length: int,
    children: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``_expand``'s slow reference: numpy on the host, every chunk's law copied there."""
    import torch

    from spectest.sampling.transforms import logits_to_probs

    kids: list[tuple[np.ndarray, np.ndarray]] = []
    for a in range(0, len(w), FORWARD_ROWS):  # in chunks: [rows, V] float64 for a large V
        s_a, w_a = seqs[a : a + FORWARD_ROWS], w[a : a + FORWARD_ROWS]
        logits = target.many([tuple(r) for r in s_a.tolist()])  # [rows, V]
        rows_p = prm.index(torch.zeros(len(w_a), dtype=torch.int64))
        probs = logits_to_probs(logits, rows_p).numpy()  # [rows, V] the plain law
        marg[length] += w_a @ probs
        if children:
            rows, toks = np.nonzero(probs > 0.0)
            child = np.concatenate([s_a[rows], toks[:, None]], axis=1)  # [M, length + 1]
            kids.append((child, w_a[rows] * probs[rows, toks]))
    return kids


def _weighted_rows(w: np.ndarray, w_t: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``w @ probs`` ``[V]``: numpy's on CPU (the reference's bits), the device's elsewhere."""
    import torch

    if probs.device.type == "cpu":
        return torch.from_numpy(w @ probs.numpy())
    return w_t @ probs


def round_marginals(
    delta: dict[tuple[int, ...], float], marg: np.ndarray
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Add the signed round-law differences ``delta`` to the marginals ``marg`` [n, V] at the
    positions they cover; return the sequences still to complete by plain sampling, by length:
    ``{length: (tokens [N, length], signed weights [N])}`` for lengths 1..n-1."""
    n = marg.shape[0]
    todo: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for s, dw in sorted(delta.items()):
        for i in range(min(len(s), n)):
            marg[i, s[i]] += dw
    for length in range(1, n):
        group = sorted((s, w) for s, w in delta.items() if len(s) == length)
        if group:
            todo[length] = (
                np.array([s for s, _ in group], dtype=np.int64).reshape(len(group), length),
                np.array([w for _, w in group]),
            )
    return todo


def position_tvs(marg: np.ndarray, slack: np.ndarray, round_tv: float) -> list[tuple[float, float]]:
    """``(tv, slack)`` per position from the signed marginals [n, V] and their slack [n]."""
    out = []
    for i in range(marg.shape[0]):
        known = 0.5 * float(np.abs(marg[i]).sum())
        # the round laws' own TV bounds every position's (completion only shrinks TV)
        tv = min(known + float(slack[i]), round_tv, 1.0)
        out.append((tv, max(0.0, tv - known) if slack[i] > 0.0 else 0.0))
    return out


def _merge(seqs: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per distinct sequence in token order, its weights summed (exact zeros dropped)."""
    uniq, inv = np.unique(seqs, axis=0, return_inverse=True)
    tot = np.zeros(len(uniq))
    np.add.at(tot, inv.reshape(-1), w)
    keep = tot != 0.0
    return uniq[keep], tot[keep]


def _merge_fast(seqs: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_merge`` by a stable sort of the columns (``np.unique(axis=0)`` sorts a structured
    view, slow for many rows): the same rows in the same (token) order, each weight the same
    sum in the same order (``np.add.at`` in input order within a row's group)."""
    if not len(w):
        return _merge(seqs, w)
    order = np.lexsort(seqs.T[::-1])  # stable: equal rows keep their input order
    s = seqs[order]
    new = np.ones(len(s), dtype=bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    inv = np.empty(len(s), dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    tot = np.zeros(int(new.sum()))
    np.add.at(tot, inv, w)
    keep = tot != 0.0
    return s[new][keep], tot[keep]
