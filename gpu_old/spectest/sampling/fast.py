"""A fast sampling pipeline beside the exact one: the same law, no full-vocabulary sort.

Owns: ``logits_to_probs_fast`` (a drop-in for ``transforms.logits_to_probs`` with the pipeline
order ``top_k_then_top_p``) and ``fast_variant`` (a ``SpecVariant`` whose pipeline hooks call it).
Knows nothing about models, engines or uniforms; the exact pipeline, its tie rules and its float64
NOTE live in ``transforms``, which stays the reference this module is tested equal to.

How it avoids the sorts
-----------------------
``transforms.logits_to_probs`` sorts the vocabulary (top-p) and selects the k-th value (top-k) on
float64 probabilities of all ``V`` tokens. Here, per filtered row:

1. *candidates*: ``torch.topk`` on the float32 logits picks the ``W`` (``width``) largest logits.
   Temperature and ``exp`` are monotone non-decreasing, so these are ``W`` tokens of largest
   weight ``w = exp((x - max x) / T)``.
2. their ``w`` is computed in float64 exactly as the reference computes it (``x`` converted to
   float64 before the max, the division and the exponential), and they are stable-sorted by ``w``
   descending with ties by id — the reference's order.
3. the *safe region* is the candidates whose ``w`` is strictly above the smallest candidate
   weight ``w_min``: every token of the vocabulary with ``w > w_min`` is in it, and in the same
   order as in the reference's full sort. Top-k with its k-th weight ``> w_min``, a nucleus that
   closes inside the safe region (the mass before the first ``w_min`` token is already
   ``>= top_p``), and a min-p threshold above ``w_min`` are therefore decided exactly as by the
   reference on the candidates alone. A row for which none of that holds (the nucleus or the kept
   set is wider than ``W``, or ties straddle the boundary) goes through the reference
   ``logits_to_probs`` — the fallback, so the law never depends on ``width``.
4. rows with no filter active need no candidates: ``w / sum(w)`` over ``V`` as the reference.

NOTE numerics (which steps are not the reference's, and why they cannot change a token's law
beyond the tolerance): the only float32 step is the *selection* of candidates by ``torch.topk``,
which compares float32 numbers without arithmetic; every weight, normaliser, running mass and
probability is float64, computed by the same operations as the reference on the same inputs. What
differs is the *reduction order* of two float64 sums (the normaliser over ``W`` candidates instead
of over ``V`` with zeros, and the top-p normaliser, which with top-k off is the full-vocabulary sum
computed by the same ``sum`` on a row subset): probabilities then agree with the reference to a
few float64 ulps (relative ``<= 1e-12`` asserted by the tests), the support is identical except
when a running mass or a min-p ratio lies within that rounding of its threshold (a top-p or min-p
decision at distance ``< 1e-12``), and a draw under the same uniform is identical except when
``u * total`` lies within that rounding of a CDF step. Both events have probability ``~1e-12``
per decision; they are the same class of event as the reference's own CPU-vs-CUDA reduction
differences (results/LOG.md), invisible to any statistical test of this harness.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from spectest.errors import InputError
from spectest.sampling import mutants
from spectest.sampling.draw import categorical
from spectest.sampling.params import SamplingTensors
from spectest.sampling.transforms import _argmax_lowest, _check_finite, logits_to_probs

DEFAULT_WIDTH = 1024  # candidates per row: covers top-k <= 1024 and nuclei of <= ~1000 tokens


def logits_to_probs_fast(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    width: int = DEFAULT_WIDTH,
    check: bool = True,
) -> torch.Tensor:
    """``transforms.logits_to_probs`` (order ``top_k_then_top_p``) without full-vocabulary sorts.

    Parameters
    ----------
    logits : Tensor ``[B, V]`` or ``[B, S, V]`` (float32 or float64; e.g. the K+1 target rows of
        a speculative round, processed in one call).
    params : per-row parameters ``[B]``, broadcast over ``S``.
    width : candidates per filtered row (``W``); rows whose kept set cannot be decided inside
        ``W`` candidates fall back to the reference (module docstring).
    check : validate params and raise ``NumericsError`` on NaN/±inf logits (one host sync).

    Returns
    -------
    float64, the shape of ``logits``: filtered tokens are exact zeros, rows sum to 1.

    Notes
    -----
    Equal to ``logits_to_probs`` up to the float64 reduction order of two sums (module NOTE);
    verified on random and tied logits, every filter combination, narrow widths that force the
    fallback, and under the same uniforms through ``categorical`` (tests/test_sampling_fast.py).
    """
    if logits.dim() not in (2, 3):
        raise InputError(f"logits must be [B, V] or [B, S, V], got shape {tuple(logits.shape)!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise InputError(f"logits_to_probs_fast: width must be an integer >= 1, got {width!r}")
    B, V = int(logits.shape[0]), int(logits.shape[-1])
    S = int(logits.shape[1]) if logits.dim() == 3 else 1
    if check:
        params.validate(batch_size=B, where="logits_to_probs_fast params")
        _check_finite_fast(logits.reshape(B * S, V), S, logits.dim() == 3)
    if width >= V:
        # NOTE every token would be a candidate: the exact pipeline's own reduced sort is then as
        # cheap as this one (measured slower here on the bundled pair, V = 260), so use it as is
        return logits_to_probs(logits, params, check=False)
    x = logits.reshape(B * S, V)  # [N, V] as given (float32 from the models)
    dev = x.device
    rep = _per_row(S, dev)
    temperature, top_k = rep(params.temperature), rep(params.top_k)  # [N] each
    top_p, min_p = rep(params.top_p), rep(params.min_p)  # [N] each
    greedy = temperature == 0  # [N]
    k_on = (top_k > 0) & (top_k < V)  # [N]
    filtered = ~greedy & (k_on | (top_p < 1) | (min_p > 0))  # [N]
    plain = ~greedy & ~filtered  # [N] temperature only

    out = torch.zeros((x.shape[0], V), dtype=torch.float64, device=dev)  # [N, V]
    rows = torch.nonzero(filtered).squeeze(-1)  # [M]
    every = int(rows.shape[0]) == int(x.shape[0])  # the common call: no row gathers over [N, V]
    if rows.numel():
        sub = SamplingTensors(temperature, top_k, top_p, min_p)  # [N] each
        if not every:
            sub = SamplingTensors(temperature[rows], top_k[rows], top_p[rows], min_p[rows])
        ids, p_c, ok = _filtered(x if every else x[rows], sub, min(width, V))  # [M, W] ×2, [M]
        if every:
            out.scatter_(-1, ids, p_c)
        else:
            probs = torch.zeros((int(rows.shape[0]), V), dtype=torch.float64, device=dev)
            out[rows] = probs.scatter_(-1, ids, p_c)  # [M, V]
        bad = rows[~ok]  # [F] rows the candidates cannot decide: the reference decides them
        if bad.numel():
            sub_bad = SamplingTensors(temperature[bad], top_k[bad], top_p[bad], min_p[bad])
            out[bad] = logits_to_probs(x[bad], sub_bad, check=False)
    if every:
        return out.reshape(logits.shape)
    rows = torch.nonzero(plain).squeeze(-1)  # [M]
    if rows.numel():
        w = _weights(x[rows], temperature[rows])  # [M, V] float64, as the reference
        out[rows] = w / w.sum(-1, keepdim=True)
    rows = torch.nonzero(greedy).squeeze(-1)  # [M]
    if rows.numel():
        hot = _argmax_lowest(x[rows].to(torch.float64))  # [M] lowest id on ties
        out[rows] = torch.zeros_like(out[rows]).scatter_(-1, hot[:, None], 1.0)
    return out.reshape(logits.shape)


@dataclasses.dataclass(frozen=True)
class CandidateLaw:
    """A law given on ``W`` candidate tokens per row: what ``logits_to_probs_fast`` scatters into
    its dense ``[.., V]`` output, before the scatter."""

    ids: torch.Tensor  # [..., W] int64 token ids, ascending along the last dim, distinct
    probs: torch.Tensor  # [..., W] float64: the law at ``ids`` (zeros allowed), 0 off them
    vocab_size: int

    def dense(self) -> torch.Tensor:
        """``[..., V]`` float64: the law over the vocabulary (bit-equal to the fast pipeline's)."""
        shape = (*self.ids.shape[:-1], self.vocab_size)
        out = torch.zeros(shape, dtype=torch.float64, device=self.ids.device)
        return out.scatter_(-1, self.ids, self.probs)

    def draw(self, u: torch.Tensor) -> torch.Tensor:
        """``categorical`` on the candidates: token ids ``[...]`` for uniforms ``u`` ``[...]``.

        NOTE the same token as ``categorical(self.dense(), u)``: the candidates are in id order, so
        the running sums are the dense CDF's at the candidate ids (the dense row only adds exact
        zeros between them), the first CDF entry above ``u * total`` is a candidate's, and the
        positive-weight fix-up moves to the same next positive id. Bit-equal where ``cumsum`` sums
        sequentially (CPU; tested); a parallel scan (CUDA) may associate the ``W`` and the ``V``
        sums differently: then a draw can differ only when ``u * total`` lies within float64
        rounding of a CDF step (probability ~1e-16, as ``categorical``'s own rounding events).
        """
        return self.ids.gather(-1, categorical(self.probs, u)[..., None]).squeeze(-1)


def candidate_probs(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    width: int = DEFAULT_WIDTH,
    check: bool = True,
) -> CandidateLaw | None:
    """``logits_to_probs_fast`` on candidates, without the dense output: a ``CandidateLaw`` of
    the shape of ``logits`` with ``V`` replaced by ``width``, or ``None`` when some row's law is
    not decided on its candidates (a greedy or unfiltered row, a fallback row, ``width >= V``) —
    the caller then takes the dense pipeline for the whole call.

    Notes
    -----
    ``candidate_probs(x, p).dense()`` is bit-equal to ``logits_to_probs_fast(x, p)`` whenever it is
    not ``None`` (the same ``_filtered`` call, the same scatter; tests/test_sampling_fast.py).
    """
    if logits.dim() not in (2, 3):
        raise InputError(f"logits must be [B, V] or [B, S, V], got shape {tuple(logits.shape)!r}")
    B, V = int(logits.shape[0]), int(logits.shape[-1])
    S = int(logits.shape[1]) if logits.dim() == 3 else 1
    if width >= V:
        return None
    if check:
        params.validate(batch_size=B, where="candidate_probs params")
        _check_finite_fast(logits.reshape(B * S, V), S, logits.dim() == 3)
    rep = _per_row(S, logits.device)
    p = SamplingTensors(
        rep(params.temperature), rep(params.top_k), rep(params.top_p), rep(params.min_p)
    )  # [N] each
    k_on = (p.top_k > 0) & (p.top_k < V)  # [N]
    filtered = (p.temperature > 0) & (k_on | (p.top_p < 1) | (p.min_p > 0))  # [N]
    if not bool(filtered.all()):
        return None
    ids, probs, ok = _filtered(logits.reshape(B * S, V), p, width)  # [N, W], [N, W], [N]
    if not bool(ok.all()):
        return None
    shape = (*logits.shape[:-1], width)
    return CandidateLaw(ids.reshape(shape), probs.reshape(shape), V)


def _check_finite_fast(x: torch.Tensor, S: int, has_positions: bool) -> None:
    """``transforms._check_finite`` in one read of ``x`` ``[N, V]`` when every value is finite.

    NOTE the float64 sum of float32 values cannot overflow (``V·N·3.4e38 << 1.8e308``) and a NaN
    or ±inf term makes it NaN or ±inf, so a finite sum proves every value finite; otherwise (or
    for float64 logits whose sum overflowed) the reference check runs and raises with its message
    — the same error for the same inputs.
    """
    if not bool(torch.isfinite(x.sum(dtype=torch.float64))):
        _check_finite(x, S, has_positions)


def _per_row(S: int, dev: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    def rep(t: torch.Tensor) -> torch.Tensor:  # [B] -> [N]
        return t.to(dev).repeat_interleave(S) if S > 1 else t.to(dev)

    return rep


def _weights(
    x: torch.Tensor, temperature: torch.Tensor, mx: torch.Tensor | None = None
) -> torch.Tensor:
    """``[M, V]`` float64 ``exp((x - max x) / T)``: the reference's operations, in its order."""
    # NOTE in place on one float64 copy: the same elementwise operations as the reference's
    # expression (so bit-equal values), one [M, V] float64 buffer instead of four
    w = x.to(torch.float64)  # [M, V] (a copy: x is float32, or cloned below when float64)
    if w.data_ptr() == x.data_ptr():
        w = w.clone()
    # ``mx`` [M, 1] float64: the row max when the caller has it (max of the float64 copy = the
    # float64 conversion of the float32 max: conversion is exact and monotone)
    w.sub_(w.amax(-1, keepdim=True) if mx is None else mx).div_(temperature[:, None])
    return w.exp_()


def _filtered(
    x: torch.Tensor, params: SamplingTensors, W: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows with a filter on their candidates: ``(ids [M, W] int64 ascending, probs [M, W]
    float64 — the law, zero off the kept set —, ok [M] bool)``; ``ok`` False = fall back."""
    M, V = (int(s) for s in x.shape)
    t, k, p, mp = params.temperature, params.top_k, params.top_p, params.min_p  # [M] each
    k_on = (k > 0) & (k < V)  # [M]
    p_on = p < 1  # [M]
    m_on = mp > 0  # [M]
    # 1-2. candidates (float32 selection, no arithmetic), then float64 weights as the reference
    cand = torch.topk(x, W, dim=-1, sorted=False).indices.sort(dim=-1).values  # [M, W] ids asc
    # NOTE converting to float64 is exact and monotone, so the max and the gathered candidates
    # converted afterwards are bit-equal to the reference's (convert all V, then max / gather)
    mx = x.amax(-1, keepdim=True).to(torch.float64)  # [M, 1]
    w_c = torch.exp((x.gather(-1, cand).to(torch.float64) - mx) / t[:, None])  # [M, W] float64
    vals, order = torch.sort(w_c, dim=-1, descending=True, stable=True)  # [M, W] ties by id
    w_min = vals[:, -1:]  # [M, 1]
    full = W == V  # every token is a candidate: always decidable
    # top-k: keep w >= k-th weight; decidable when that weight is above w_min (or all are here)
    kth = vals.gather(-1, (k.clamp(1, W) - 1)[:, None])  # [M, 1]
    ok_k = ~k_on | ((k <= W) & ((kth[:, 0] > w_min[:, 0]) | full))  # [M]
    keep = ~k_on[:, None] | (vals >= kth)  # [M, W]
    # top-p on the post-top-k law; its normaliser is the full-vocabulary sum when top-k is off
    kept_w = vals.masked_fill(~keep, 0.0)  # [M, W]
    z = kept_w.sum(-1)  # [M]
    no_k = p_on & ~k_on  # [M] rows that need the full sum
    if bool(no_k.any()):
        r = torch.nonzero(no_k).squeeze(-1)  # [R]
        if int(r.shape[0]) == M:  # every row: no [M, V] row gather
            z_full = _weights(x, t, mx).sum(-1)  # [M] as the reference's sum
        else:
            z_full = _weights(x[r], t[r], mx[r]).sum(-1)  # [R]
        z = z.index_put((r,), z_full)
    probs = kept_w / z[:, None]  # [M, W]
    csum = torch.cumsum(probs, dim=-1)  # [M, W]
    before = torch.cat([torch.zeros_like(csum[:, :1]), csum[:, :-1]], dim=-1)  # [M, W]
    keep_p = ~p_on[:, None] | (before < p[:, None])  # [M, W]
    first_min = (vals > w_min).sum(-1)  # [M] index of the first w_min token (safe region end)
    closed = before.gather(-1, first_min.clamp(max=W - 1)[:, None])[:, 0] >= p  # [M]
    ok_p = ~p_on | (k_on & ok_k) | closed | full  # [M]
    keep = keep & keep_p
    # min-p on the post-top-p law (scale invariant: compare weights renormalised over the kept set)
    kept_w = vals.masked_fill(~keep, 0.0)  # [M, W]
    if bool(m_on.any()):
        z2 = kept_w.sum(-1, keepdim=True)  # [M, 1]
        pr = kept_w / z2  # [M, W]
        if bool((m_on & ~k_on & ~p_on).any()):
            # NOTE min-p alone normalises over the whole vocabulary, as the reference does
            r = torch.nonzero(m_on & ~k_on & ~p_on).squeeze(-1)  # [R]
            z_full = _weights(x[r], t[r]).sum(-1)  # [R]
            pr[r] = vals[r] / z_full[:, None]
        thr = mp[:, None] * pr[:, :1]  # [M, 1] min_p * max p (the first is the largest)
        keep = keep & (~m_on[:, None] | (pr >= thr))
        # decidable when the threshold is above every non-candidate's probability
        ok_m = ~m_on | k_on | p_on | full | (thr[:, 0] > pr[:, -1])  # [M]
        kept_w = vals.masked_fill(~keep, 0.0)
    else:
        ok_m = torch.ones_like(m_on)
    final = kept_w / kept_w.sum(-1, keepdim=True)  # [M, W] in weight order
    # back to the candidates' id order (``cand`` ascending): order[j] is the slot of final[j]
    probs_by_id = torch.empty_like(final).scatter_(-1, order, final)  # [M, W]
    return cand, probs_by_id, ok_k & ok_p & ok_m


# ----------------------------------------------------------------------------- variants


def _verify_fast(target_logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    return logits_to_probs_fast(target_logits, params)


def _draft_fast(
    draft_logits: torch.Tensor, params: SamplingTensors, onehot: bool, q_mode: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if onehot:
        return mutants._onehot_argmax(draft_logits), None
    if q_mode == "processed":
        q = logits_to_probs_fast(draft_logits, params)
    else:
        q = mutants.draft_q(draft_logits, params, q_mode)  # temperature / raw: no sort anyway
    return q, q


def fast_variant(variant: mutants.SpecVariant) -> mutants.SpecVariant:
    """``variant`` with its pipeline hooks (the truthful target law and draft law) replaced by the
    fast pipeline; a hook a mutant changes (an unprocessed or swapped verifier, a lying q) keeps
    the reference implementation, so a mutant's deviation is exactly the one it was built with."""
    changes: dict[str, Any] = {}
    if variant.verify_fn is mutants._verify_pipeline:
        changes["verify_fn"] = _verify_fast
    if variant.draft_fn is mutants._draft_truthful:
        changes["draft_fn"] = _draft_fast
    return dataclasses.replace(variant, **changes)
