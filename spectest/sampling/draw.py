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
    NOTE float64 cumsum: a float32 CDF cannot resolve tokens below ~2^-24 of the mass (vLLM #43150).
    NOTE positive-weight guarantee: ``u * total`` can round up to ``total`` (u near 1), and a
    parallel scan may make ``cdf`` differ between a token and a zero-weight neighbour; either could
    land on a zero-weight id (SGLang #35771, FlashInfer #879). The found index is moved to the next
    positive-weight token at or after it, else to the last positive-weight token. These moves only
    happen on rounding events (probability ~1e-16 per draw), so only rows whose found index has
    zero weight get the ``[V]``-wide fix-up (``_next_positive``). Verified equal to the
    Python-loop ``categorical_reference`` on random inputs, on u → 0, u → 1 edge cases and on rows
    forced through the fix-up (tests/test_sampling*.py).
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
    # NOTE the found index has positive weight except on a rounding event (docstring): only those
    # rows get the "next positive-weight id" fix-up, decided by one host sync (shared with the
    # input check); the fix-up is ``_next_positive`` on them, the rule of ``categorical_reference``
    zero = ~(w.gather(-1, idx[:, None]).squeeze(-1) > 0)  # [N] rounding events
    if not check and V <= SYNC_FREE_WIDTH:
        # NOTE the same fix-up on the same rows (``where`` keeps every other row's index), with no
        # host sync: ``_next_positive`` over ``[N, V]`` is cheap at a shortlist's width
        return torch.where(zero, _next_positive(w, idx), idx).reshape(u.shape)
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
    last positive-weight id (a reversed running minimum over each row)."""
    V = int(w.shape[-1])
    ar = torch.arange(V, device=w.device).expand_as(w)  # [F, V]
    positive = w > 0  # [F, V]
    # next_pos[n, i] = smallest j >= i with w[n, j] > 0, else V
    next_pos = torch.where(positive, ar, V).flip(-1).cummin(-1).values.flip(-1)  # [F, V]
    last_pos = torch.where(positive, ar, -1).amax(-1)  # [F]
    tok = next_pos.gather(-1, idx[:, None]).squeeze(-1)  # [F]
    return torch.where(tok == V, last_pos, tok)


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
