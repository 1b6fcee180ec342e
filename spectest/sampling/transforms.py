"""Logits → float64 probabilities: the pipeline temperature → top-k → top-p → min-p per row, its
tie rules, greedy rows and the non-finite-logit check. Knows nothing about uniforms, drafts or
models. Why and details: docs/internals.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from spectest.errors import InputError, NumericsError
from spectest.sampling.params import SamplingTensors

ORDERS = ("top_k_then_top_p", "top_p_then_top_k")


def logits_to_probs(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    order: str = "top_k_then_top_p",
    check: bool = True,
) -> torch.Tensor:
    """Turn logits into the float64 law that plain sampling draws from.

    Parameters
    ----------
    logits : Tensor ``[B, V]`` or ``[B, S, V]``, any float dtype.
    params : per-row parameters ``[B]``, broadcast over ``S``.
    order : ``"top_k_then_top_p"`` (the pipeline) or ``"top_p_then_top_k"`` (mutant only).
    check : validate params and raise ``NumericsError`` on NaN/±inf logits (one host sync).

    Returns
    -------
    Tensor of the same shape as ``logits``, float64: filtered tokens are exact zeros, rows sum to 1.

    Notes
    -----
    Float64 throughout, logits converted *before* temperature: the ratio p/q and the residual
    subtract nearly equal numbers in small tails (float32: ~1e-7 error per token, visible to
    large-N statistics; vLLM #43150), and the law is one function of the logits for the plain and
    speculative paths. Tested equal to ``logits_to_probs_reference`` and HF's warpers.
    """
    if order not in ORDERS:
        raise InputError(f"logits_to_probs: order must be one of {ORDERS}, got {order!r}")
    B, S, V = logits_dims(logits)
    if check:
        params.validate(batch_size=B, where="logits_to_probs params")
        _check_finite(logits.reshape(B * S, V), S, logits.dim() == 3)
    x = logits.to(torch.float64).reshape(B * S, V)  # [N, V], N = B*S, row n = (b, s) = divmod(n, S)
    p = params.per_position(S, x.device)  # [N] each
    temperature = p.temperature
    greedy = temperature == 0  # [N] bool
    t = torch.where(greedy, torch.ones_like(temperature), temperature)  # [N]
    # NOTE subtracting the max before dividing keeps every exponent <= 0 with the max exactly 0, so
    # w has no overflow, no NaN (even for tiny T) and sum(w) >= 1.
    w = torch.exp((x - x.amax(-1, keepdim=True)) / t[:, None])  # [N, V] in [0, 1]
    keep = _filters_keep(w, p.top_k, p.top_p, p.min_p, order)
    probs = _normalise(w, keep)  # [N, V]
    if bool(greedy.any()):
        onehot = torch.zeros_like(probs).scatter_(-1, _argmax_lowest(x)[:, None], 1.0)  # [N, V]
        probs = torch.where(greedy[:, None], onehot, probs)
    return probs.reshape(logits.shape)


def logits_dims(logits: torch.Tensor) -> tuple[int, int, int]:
    """``(B, S, V)`` of logits ``[B, V]`` (``S = 1``) or ``[B, S, V]``; ``InputError`` otherwise."""
    if logits.dim() not in (2, 3):
        raise InputError(f"logits must be [B, V] or [B, S, V], got shape {tuple(logits.shape)!r}")
    S = int(logits.shape[1]) if logits.dim() == 3 else 1
    return int(logits.shape[0]), S, int(logits.shape[-1])


def _filters_keep(
    w: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor, order: str
) -> torch.Tensor | None:
    """The ``[N, V]`` mask of tokens that survive top-k, top-p and min-p in ``order``; None = all.
    A filter runs only if some row has it active (one host sync each)."""
    keep: torch.Tensor | None = None
    k_on = bool(((top_k > 0) & (top_k < w.shape[-1])).any())
    p_on = bool((top_p < 1).any())
    for step in ("k", "p") if order == "top_k_then_top_p" else ("p", "k"):
        if step == "k" and k_on:
            keep = _and(keep, _top_k_keep(_normalise(w, keep), top_k))
        elif step == "p" and p_on:
            keep = _and(keep, _top_p_keep(_normalise(w, keep), top_p))
    if bool((min_p > 0).any()):
        keep = _and(keep, _min_p_keep(_normalise(w, keep), min_p))
    return keep


def _and(keep: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    return new if keep is None else keep & new


def _normalise(w: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``w`` restricted to ``keep`` and renormalised; the argmax is always kept, so sum > 0."""
    wk = w if keep is None else w.masked_fill(~keep, 0.0)  # [N, V]
    return wk / wk.sum(-1, keepdim=True)


def _top_k_keep(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[N, V] bool: tokens with prob >= the k-th largest (ties at the boundary all kept)."""
    V = probs.shape[-1]
    active = (top_k > 0) & (top_k < V)  # [N]
    k_max = int(torch.where(active, top_k, 1).max())
    # NOTE topk(k_max) instead of a full sort: its sorted *values* are unique whatever the order
    # of ties, so the k-th largest value is exact.
    top_vals = torch.topk(probs, k_max, dim=-1, sorted=True).values  # [N, k_max] descending
    kth = top_vals.gather(-1, (top_k.clamp(1, k_max) - 1)[:, None])  # [N, 1]
    return (probs >= kth) | ~active[:, None]


def _top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[N, V] bool: the smallest prob-descending (ties by id) prefix with mass >= top_p."""
    V = probs.shape[-1]
    active = top_p < 1  # [N]
    # NOTE top_p == 1 skips the filter: otherwise a rounded cumsum could reach 1 before the tail.
    support = (probs > 0).sum(-1)  # [N]
    width = int(torch.where(active, support, 1).max())
    if width < V:
        # NOTE only positive tokens can matter: sort the `width` largest (all positive tokens of
        # every active row, e.g. after top-k) instead of all V. Ids ascending, then a stable sort
        # by value: the same order (desc, ties by id), so the same running sum bit for bit.
        cand = torch.topk(probs, width, dim=-1, sorted=False).indices.sort(dim=-1).values  # [N, w]
        vals, order = torch.sort(probs.gather(-1, cand), dim=-1, descending=True, stable=True)
        idx = cand.gather(-1, order)  # [N, w] token ids, prob-descending, ties by id
    else:
        vals, idx = torch.sort(probs, dim=-1, descending=True, stable=True)  # [N, V] ties by id
    # NOTE the mass strictly before each token is the shifted running sum (not cumsum - p, which
    # adds a rounding), so it equals the sequential sum of the Python reference bit for bit.
    csum = torch.cumsum(vals, dim=-1)  # [N, w]
    before = torch.cat([torch.zeros_like(csum[:, :1]), csum[:, :-1]], dim=-1)  # [N, w]
    keep_sorted = before < top_p[:, None]  # [N, w]
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, idx, keep_sorted)  # [N, V] by id
    return keep | ~active[:, None]


def _min_p_keep(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """[N, V] bool: tokens with p >= min_p * max p (min_p == 0 keeps all)."""
    return probs >= min_p[:, None] * probs.amax(-1, keepdim=True)


def _argmax_lowest(x: torch.Tensor) -> torch.Tensor:
    """[N] int64 argmax of each row of ``x`` [N, V], the lowest id on ties (device independent)."""
    V = x.shape[-1]
    ar = torch.arange(V, device=x.device).expand_as(x)  # [N, V]
    return torch.where(x == x.amax(-1, keepdim=True), ar, V).amin(-1)


def _check_finite(x: torch.Tensor, S: int, has_positions: bool) -> None:
    bad = ~torch.isfinite(x)  # [N, V]
    if bool(bad.any()):
        n, v = (int(i) for i in torch.nonzero(bad)[0])
        row, pos = divmod(n, S)
        where = f"row {row}, position {pos}" if has_positions else f"row {row}"
        raise NumericsError(
            f"logits {where} has a non-finite value at token {v}: {float(x[n, v])!r}"
        )


def logits_to_probs_reference(
    logits: Sequence[float],
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    order: str = "top_k_then_top_p",
) -> list[float]:
    """Slow, obviously-correct reference for ONE row (pure Python), tested equal to the fast one."""
    V = len(logits)
    if temperature == 0:
        best = min(range(V), key=lambda i: (-logits[i], i))
        return [1.0 if i == best else 0.0 for i in range(V)]
    mx = max(logits)
    w = [math.exp((v - mx) / temperature) for v in logits]
    keep = [True] * V

    def current() -> list[float]:
        s = sum(w[i] for i in range(V) if keep[i])
        return [w[i] / s if keep[i] else 0.0 for i in range(V)]

    def do_top_k() -> None:
        if 0 < top_k < V:
            pr = current()
            kth = sorted(pr, reverse=True)[top_k - 1]
            for i in range(V):
                keep[i] = keep[i] and pr[i] >= kth

    def do_top_p() -> None:
        if top_p < 1:
            pr = current()
            mass = 0.0
            for i in sorted(range(V), key=lambda i: (-pr[i], i)):
                keep[i] = keep[i] and mass < top_p
                mass += pr[i]

    for step in (do_top_k, do_top_p) if order == "top_k_then_top_p" else (do_top_p, do_top_k):
        step()
    pr = current()
    top = max(pr)
    for i in range(V):
        keep[i] = keep[i] and pr[i] >= min_p * top
    return current()
