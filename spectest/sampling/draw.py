"""Inverse-CDF categorical draws on a float64 cumsum, and argmax with a fixed tie rule.

Owns: turning (weights, one uniform) into a token id. Knows nothing about where the uniforms come
from (see ``seeding``), nor about which law the weights are (target, residual, draft).

``categorical`` accepts *unnormalised* non-negative weights: the token is the smallest id ``i``
with ``cdf[i] > u * cdf[-1]``, so its law is ``w / sum(w)`` exactly up to float64 rounding. This
lets the rejection sampler draw from the residual ``max(0, p - q)`` without dividing by its mass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spectest.errors import InputError, NumericsError


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
    NOTE float64 cumsum: a float32 CDF cannot resolve tokens below ~2^-24 of the mass (vLLM #43150).
    NOTE positive-weight guarantee: ``u * total`` can round up to ``total`` (u near 1), and a
    parallel scan may make ``cdf`` differ between a token and a zero-weight neighbour; either could
    land on a zero-weight id (SGLang #35771, FlashInfer #879). The found index is moved to the next
    positive-weight token at or after it, else to the last positive-weight token. These moves only
    happen on rounding events (probability ~1e-16 per draw). Verified equal to the Python-loop
    ``categorical_reference`` on random inputs and on u → 0, u → 1 edge cases.
    """
    assert probs.dtype == torch.float64 and u.dtype == torch.float64, (probs.dtype, u.dtype)
    assert probs.shape[:-1] == u.shape, (tuple(probs.shape), tuple(u.shape))
    V = int(probs.shape[-1])
    w = probs.reshape(-1, V)  # [N, V]
    uf = u.reshape(-1)  # [N]
    cdf = torch.cumsum(w, dim=-1)  # [N, V]
    total = cdf[:, -1]  # [N]
    if check:
        _check(w, total, uf)
    target = (uf * total)[:, None].contiguous()  # [N, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=V - 1)  # [N]
    ar = torch.arange(V, device=w.device).expand_as(w)  # [N, V]
    positive = w > 0  # [N, V]
    # next_pos[n, i] = smallest j >= i with w[n, j] > 0, else V (a reversed running minimum)
    next_pos = torch.where(positive, ar, V).flip(-1).cummin(-1).values.flip(-1)  # [N, V]
    last_pos = torch.where(positive, ar, -1).amax(-1)  # [N]
    tok = next_pos.gather(-1, idx[:, None]).squeeze(-1)  # [N]
    tok = torch.where(tok == V, last_pos, tok)
    return tok.reshape(u.shape)


def _check(w: torch.Tensor, total: torch.Tensor, u: torch.Tensor) -> None:
    bad_row = ~torch.isfinite(total) | ~(total > 0) | (w < 0).any(-1)  # [N]
    bad_u = ~((u > 0) & (u < 1))  # [N]
    if bool(bad_row.any() | bad_u.any()):
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


def argmax_tokens(probs: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` → ``[...]`` int64 argmax, the lowest id on ties (the greedy rule everywhere)."""
    V = int(probs.shape[-1])
    ar = torch.arange(V, device=probs.device)  # [V]
    return torch.where(probs == probs.amax(-1, keepdim=True), ar, V).amin(-1)


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
