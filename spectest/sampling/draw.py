"""Turning (weights, one uniform) into a token id: inverse-CDF draws on a float64 cumsum of
*unnormalised* weights (so the residual needs no division), and argmax with a fixed tie rule
(of a scaled model's native logits where the caller defers its reads: ``sampling.scaled``).
Knows nothing about where the uniforms come from, nor which law the weights are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from spectest.errors import InputError, NumericsError
from spectest.sampling.scaled import argmax_holds, law_values, parts

# rows at most this wide (a shortlist) take the positive-weight fix-up on every row, without the
# host sync that decides which rows need it, when the inputs are not checked
SYNC_FREE_WIDTH = 4096


def categorical(probs: torch.Tensor, u: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Inverse-CDF draw: one token per row of ``probs`` ``[..., V]`` with uniforms ``u`` ``[...]``.

    Parameters
    ----------
    probs : float64 ``[..., V]``, non-negative weights with a positive finite sum per row.
    u : float64 ``[...]`` strictly inside (0, 1).
    check : raise ``NumericsError`` on a row that is not a distribution and ``InputError`` on a
        uniform outside (0, 1) (one host sync).

    Returns
    -------
    int64 ``[...]``: always a token with positive weight.

    Notes
    -----
    The token is the smallest id ``i`` with ``cdf[i] > u * cdf[-1]``: law ``w / sum(w)`` up to
    float64 rounding (a float32 CDF cannot resolve tokens below ~2^-24 of the mass, vLLM #43150).
    A rounding event (``u * total`` rounding up to ``total``, or a parallel scan) can land on a
    zero-weight id (SGLang #35771, FlashInfer #879): that index moves to the next positive-weight
    token at or after it, else to the last one (``_next_positive``, ``categorical_reference``'s
    rule; tested in tests/test_sampling*.py).
    """
    assert probs.dtype == torch.float64 and u.dtype == torch.float64, (probs.dtype, u.dtype)
    assert probs.shape[:-1] == u.shape, (tuple(probs.shape), tuple(u.shape))
    V = int(probs.shape[-1])
    w = probs.reshape(-1, V)  # [N, V]
    uf = u.reshape(-1)  # [N]
    cdf = torch.cumsum(w, dim=-1)  # [N, V]
    total = cdf[:, -1]  # [N]
    target = (uf * total)[:, None].contiguous()  # [N, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=V - 1)  # [N]
    if not check and V <= SYNC_FREE_WIDTH:  # the fix-up on every row, no host sync: on a row
        return _next_positive(w, idx).reshape(u.shape)  # whose id has weight, it is that id
    zero = ~(w.gather(-1, idx[:, None]).squeeze(-1) > 0)  # [N] rounding events: fix-up rows
    if check:
        fix = _check(w, total, uf, zero)
    else:
        fix = bool(zero.any())
    if fix:
        rows = torch.nonzero(zero).squeeze(-1)  # [F]
        idx = idx.index_put((rows,), _next_positive(w[rows], idx[rows]))
    return idx.reshape(u.shape)


def _next_positive(w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``[F]``: the smallest id ``>= idx`` with positive weight in ``w`` ``[F, V]``, else the
    last positive-weight id; 0 for a row with no positive weight (no law: an id in range for an
    unchecked call, e.g. a deferred one's)."""
    positive = w > 0  # [F, V]
    seen = torch.cumsum(positive, dim=-1)  # [F, V] int64: positive ids at or before each id
    here = idx[:, None]  # [F, 1]
    before = seen.gather(-1, here) - positive.gather(-1, here).long()  # [F, 1] positives below idx
    # NOTE the wanted id is the (before + 1)-th positive one, else the last (the count's own
    # rank): the first id whose count reaches that rank; a row with none asks rank 0, id 0
    rank = torch.minimum(before + 1, seen[:, -1:])  # [F, 1]
    return torch.searchsorted(seen, rank).squeeze(-1)  # [F]


def _check(w: torch.Tensor, total: torch.Tensor, u: torch.Tensor, zero: torch.Tensor) -> bool:
    """Raise on a bad row or uniform; else return whether any row of ``zero`` needs the fix-up
    (one host sync for both)."""
    bad_row = ~torch.isfinite(total) | ~(total > 0) | (w < 0).any(-1)  # [N]
    bad_u = ~((u > 0) & (u < 1))  # [N]
    bad, fix = torch.stack([(bad_row | bad_u).any(), zero.any()]).tolist()
    if bad:
        if bool(bad_row.any()):
            n = int(torch.nonzero(bad_row)[0, 0])
            raise NumericsError(
                f"categorical: row {n} is not a distribution (sum {float(total[n])!r}, "
                f"min {float(w[n].min())!r})"
            )
        n = int(torch.nonzero(bad_u)[0, 0])
        raise InputError(
            f"categorical: uniform {n} must be strictly inside (0, 1), got {float(u[n])!r}"
        )
    return bool(fix)


class Flags(Protocol):
    """Where a call's device flags go instead of a host read (``shortlist.Deferred``)."""

    def add(self, ok: torch.Tensor) -> None: ...


def argmax_tokens(probs: torch.Tensor, *, defer: Flags | None = None) -> torch.Tensor:
    """``[..., V]`` → ``[...]`` int64 argmax, the lowest id on ties (the greedy rule everywhere).

    With ``defer``, a ``ScaledLogits`` is read as its native 16-bit ``x`` (2 bytes a logit, not
    the float32 product made first: 18 bytes), and ``defer`` gets ``scaled.argmax_holds``: the
    rows where that is the product's argmax by construction (a failed flag redoes the caller's
    chunk with the reads made, docs/internals.md "Deferred shortlist reads")."""
    V = int(probs.shape[-1])
    x, scale = parts(probs) if defer is not None else (probs, None)
    # NOTE ``torch.argmax`` returns the first maximal index (documented, CPU and CUDA) in one
    # read, where ``where(x == amax, id, V).amin`` read ``[..., V]`` four times; a row with NaN
    # (argmax picks a NaN) keeps that formula's answer, V (tests/test_engine_host_work.py)
    idx = x.argmax(-1)  # [...]
    at = x.gather(-1, idx[..., None])[..., 0]  # [...]
    if defer is not None and scale is not None:
        defer.add(argmax_holds(law_values(at, scale)))
    return torch.where(torch.isnan(at), V, idx)


def categorical_reference(probs: Sequence[float], u: float) -> int:
    """Slow reference for one row: a Python loop over the running sum (``categorical``'s rule)."""
    total = 0.0
    for p in probs:
        total += p
    target = u * total
    acc = 0.0
    last = -1
    for i, p in enumerate(probs):
        acc += p
        if p > 0:
            last = i
            if acc > target:
                return i
    return last
