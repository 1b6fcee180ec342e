"""The shortlist pipeline: ``transforms.logits_to_probs``'s law without full-vocabulary sorts
(``logits_to_probs_fast``), as a ``laws.ShortlistLaw`` (``shortlist_probs``, whose host read can
be ``Deferred``), and ``fast_variant`` (a ``SpecVariant`` on it). Knows nothing about models,
engines or uniforms.

The details: docs/architecture.md "The shortlist: how it avoids the sorts".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from spectest.errors import InputError
from spectest.sampling import mutants
from spectest.sampling.kernels import weight_sum
from spectest.sampling.laws import ShortlistLaw
from spectest.sampling.params import SamplingTensors
from spectest.sampling.scaled import ScaledLogits, law_values, parts
from spectest.sampling.transforms import (
    _argmax_lowest,
    _check_finite,
    logits_dims,
    logits_to_probs,
)

DEFAULT_WIDTH = 1024  # tokens per shortlist: covers top-k <= 1024 and nuclei of <= ~1000 tokens


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
    logits : Tensor ``[B, V]`` or ``[B, S, V]`` (float32, float64, or the model's own bfloat16 /
        float16: the same law as their float32 cast; e.g. the K+1 target rows of a speculative
        round, processed in one call).
    params : per-row parameters ``[B]``, broadcast over ``S``.
    width : shortlisted tokens per filtered row (``W``); rows whose kept set cannot be decided
        inside ``W`` of them fall back to the reference (the fallback:
        docs/architecture.md "The shortlist: how it avoids the sorts").
    check : validate params and raise ``NumericsError`` on NaN/±inf logits (one host sync).

    Returns
    -------
    float64, the shape of ``logits``: filtered tokens are exact zeros, rows sum to 1.

    Notes
    -----
    Equal to ``logits_to_probs`` up to the float64 reduction order of two sums
    (tests/test_sampling_fast.py).
    """
    B, S, V = logits_dims(logits)
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise InputError(f"logits_to_probs_fast: width must be an integer >= 1, got {width!r}")
    flags = _valid_flags(params, B, V, check, "logits_to_probs_fast params")
    if check:
        _check_finite_fast(logits.reshape(B * S, V), S, logits.dim() == 3)
    _, unfiltered, n_no_k, n_min_p = flags
    if width >= V:  # every token shortlisted: the exact pipeline is as cheap
        return logits_to_probs(logits, params, check=False)
    x = logits.reshape(B * S, V)  # [N, V] as given (float32, or the model's bfloat16)
    p = params.per_position(S, x.device)  # [N] each
    out = torch.zeros((x.shape[0], V), dtype=torch.float64, device=x.device)  # [N, V]
    if not unfiltered:  # the common call: every row filtered, no row gathers over [N, V]
        _fill_filtered(out, x, p, None, width, (n_no_k * S, n_min_p * S))
        return out.reshape(logits.shape)
    greedy = p.temperature == 0  # [N]
    filtered = ~greedy & _has_filter(p, V)  # [N]
    rows = torch.nonzero(filtered).squeeze(-1)  # [M]
    if rows.numel():
        _fill_filtered(out, x, p, rows, width)
    rows = torch.nonzero(~greedy & ~filtered).squeeze(-1)  # [M] temperature only
    if rows.numel():
        w = _weights(x[rows], p.temperature[rows])  # [M, V] float64, as the reference
        out[rows] = w / w.sum(-1, keepdim=True)
    rows = torch.nonzero(greedy).squeeze(-1)  # [M]
    if rows.numel():
        hot = _argmax_lowest(x[rows].to(torch.float64))  # [M] lowest id on ties
        out[rows] = torch.zeros_like(out[rows]).scatter_(-1, hot[:, None], 1.0)
    return out.reshape(logits.shape)


def _valid_flags(
    params: SamplingTensors, B: int, V: int, check: bool, where: str
) -> tuple[int, int, int, int]:
    """``_host_flags`` of ``params`` for a call of ``B`` rows, after (with ``check``) their
    shapes, and ``ConfigError`` (``where``: the caller's name) for an invalid row: the checks
    ``shortlist_probs`` and ``logits_to_probs_fast`` make before they read the logits, in the
    one host read per parameter object, not a ``validate``, a ``nonzero`` and a count per call."""
    if check:
        params.check_shapes(batch_size=B, where=where)
    flags = _host_flags(params, V, check)
    if flags[0]:
        params.raise_invalid(where=where)
    return flags


def _has_filter(p: SamplingTensors, V: int) -> torch.Tensor:
    """``[N]`` bool: the row has top-k, top-p or min-p active."""
    return ((p.top_k > 0) & (p.top_k < V)) | (p.top_p < 1) | (p.min_p > 0)


def _filter_counts(p: SamplingTensors, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Device scalars ``(rows with top-p and no top-k, rows with min-p)``: what ``_filtered``
    branches on (``[N]`` parameters of the rows it gets)."""
    k_on = (p.top_k > 0) & (p.top_k < V)  # [N]
    return ((p.top_p < 1) & ~k_on).sum(), (p.min_p > 0).sum()


def _fill_filtered(
    out: torch.Tensor,
    x: torch.Tensor,
    p: SamplingTensors,
    rows: torch.Tensor | None,
    W: int,
    counts: tuple[int, int] | None = None,
) -> None:
    """Write the law of the filtered ``rows`` of ``x`` into ``out`` ``[N, V]``.

    ``rows`` None: every row (no gathers), with ``_filtered``'s ``counts`` when known; rows the
    shortlist cannot decide are decided by the reference ``logits_to_probs``.
    """
    if rows is None:
        ids, p_c, ok = _filtered(x, p, W, counts)
        out.scatter_(-1, ids, p_c)
        bad = torch.nonzero(~ok).squeeze(-1)  # [F] row ids
    else:
        ids, p_c, ok = _filtered(x[rows], p.index(rows), W, counts)
        probs = torch.zeros(
            (int(rows.shape[0]), out.shape[1]), dtype=torch.float64, device=x.device
        )
        out[rows] = probs.scatter_(-1, ids, p_c)  # [M, V]
        bad = rows[~ok]  # [F]
    if bad.numel():
        out[bad] = logits_to_probs(x[bad], p.index(bad), check=False)


class Undecided(Exception):
    """A ``Deferred`` read found a call undecided or a logit not finite: the caller's work since
    the reads were deferred is void, and is redone with the reads made (never leaves the loop)."""


class Deferred:
    """The host reads of ``shortlist_probs`` calls made later: each call ANDs its rows' flags
    (every logit finite, the row decided on its shortlist) into one device scalar instead of
    reading them, and ``check`` reads that scalar where the caller syncs anyway
    (docs/internals.md "Deferred shortlist reads").

    While the flag holds, every call returned the law the call with its read returns. Once it
    fails, a call returned a law that is void (a row's law off its shortlist), so ``check``
    raises ``Undecided``: the caller redoes its work on calls that read at once, which fall back
    to the dense law or raise where this flag was set.
    """

    def __init__(self) -> None:
        self.ok: torch.Tensor | None = None  # device bool scalar: every row so far; None: no call

    def add(self, ok: torch.Tensor) -> None:
        """A call's rows ``ok`` ``[N]`` bool: finite and decided (a native argmax's: where it is
        the product's, ``draw.argmax_tokens``)."""
        self.ok = ok.all() if self.ok is None else self.ok & ok.all()

    def check(self, *more: torch.Tensor) -> list[bool]:
        """Read the flag with the device bool scalars ``more`` in one host sync: ``Undecided``
        when a row was not ok, else ``more``'s values."""
        flags = [] if self.ok is None else [self.ok]
        if not flags and not more:
            return []
        vals = [bool(v) for v in torch.stack([*flags, *more]).tolist()]
        if flags and not vals[0]:
            raise Undecided
        return vals[len(flags) :]


def shortlist_probs(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    width: int = DEFAULT_WIDTH,
    check: bool = True,
    defer: Deferred | None = None,
) -> ShortlistLaw | None:
    """``logits_to_probs_fast`` on the shortlist, without the dense output: a ``ShortlistLaw`` of
    the shape of ``logits`` with ``V`` replaced by ``width``, or ``None`` when some row's law is
    not decided on its shortlist (a greedy or unfiltered row, a fallback row, ``width >= V``) —
    the caller then takes the dense pipeline for the whole call.

    With ``defer``, a filtered call makes no host read: its finiteness and decidability go to
    ``defer`` and the law is returned as if both held (void until ``defer.check`` passes; a void
    row still draws an id in range, ``draw._next_positive``).

    Notes
    -----
    ``shortlist_probs(x, p).dense()`` is bit-equal to ``logits_to_probs_fast(x, p)`` whenever it is
    not ``None`` (the same ``_filtered`` call, the same scatter; tests/test_sampling_fast.py).
    """
    native, scale = parts(logits)  # shapes asked of ScaledLogits are Python calls (~3-6 µs)
    B, S, V = logits_dims(native)
    if width >= V:
        return None
    x = native.reshape(B * S, V)  # [N, V] as given (float32, or the model's bfloat16)
    x = x if scale is None else ScaledLogits.wrap(x, scale)
    _, unfiltered, n_no_k, n_min_p = _valid_flags(params, B, V, check, "shortlist_probs params")
    # NOTE one read of the logits gives each row's max (the shortlist's, below) and finiteness:
    # aminmax propagates NaN, +inf shows in the max and -inf in the min; on native scaled logits
    # the extremes of the product are the products of the extremes (``sampling/scaled.py``)
    lo, hi = _extremes(x)  # [N] each
    # NOTE hi - lo is finite iff both are (a false alarm, two huge finite extremes whose
    # difference overflows, only sends the call to the full check, which finds them finite);
    # ``|d| < inf`` is ``isfinite(d)`` (NaN compares false) in two ops where it takes four
    finite = (hi - lo).abs() < math.inf  # [N]
    if unfiltered:  # the dense pipeline decides; a non-finite logit still raises here first
        if check and not bool(finite.all()):
            _check_finite(x, S, native.dim() == 3)
        return None
    p = params.per_position(S, native.device)  # [N] each
    ids, probs, ok = _filtered(x, p, width, (n_no_k * S, n_min_p * S), hi)  # [N, W], [N, W], [N]
    shape = (*native.shape[:-1], width)
    if defer is not None:  # read later, where the caller syncs anyway
        defer.add(ok & finite)
        return ShortlistLaw(ids.reshape(shape), probs.reshape(shape), V)
    # NOTE one host sync per call, after the work: the finiteness (which raises first, as
    # ``_check_finite_fast`` would have before) and the decidability (NaN / ±inf logits only
    # make garbage in between, never an error)
    not_finite, undecided = torch.stack([~finite.all() & check, ~ok.all()]).tolist()
    if not_finite:
        _check_finite(x, S, native.dim() == 3)
    if undecided:
        return None
    return ShortlistLaw(ids.reshape(shape), probs.reshape(shape), V)


def _host_flags(params: SamplingTensors, V: int, check: bool) -> tuple[int, int, int, int]:
    """``(invalid, unfiltered, rows with top-p and no top-k, rows with min-p)`` of ``params``'
    ``[B]`` rows: what ``shortlist_probs`` branches on before it reads the logits, in one host
    sync per parameter object (kept in ``params.host``: a chunk's parameters serve its whole
    decode). ``invalid`` is 0 when ``check`` is off."""
    key = (V, check)
    if key not in params.host:
        no = torch.zeros((), dtype=torch.bool, device=params.temperature.device)
        filtered = (params.temperature > 0) & _has_filter(params, V)  # [B]
        flags = [params.invalid().any() if check else no, ~filtered.all()]
        flags += _filter_counts(params, V)
        vals = torch.stack([f.long() for f in flags]).tolist()
        params.host[key] = (vals[0], vals[1], vals[2], vals[3])
    invalid, unfiltered, n_no_k, n_min_p = params.host[key]
    return invalid, unfiltered, n_no_k, n_min_p


def _check_finite_fast(x: torch.Tensor, S: int, has_positions: bool) -> None:
    """``transforms._check_finite`` in one read of ``x`` ``[N, V]`` as given (no cast: a cast
    keeps NaN and ±inf and makes no finite value one), raising its error when one is not finite.
    Native scaled logits: their product overflows only at a row's extremes, so those decide."""
    if isinstance(x, ScaledLogits):
        finite = bool(torch.isfinite(torch.stack(_extremes(x))).all())
    else:
        finite = bool(torch.isfinite(x).all())
    if not finite:
        _check_finite(x, S, has_positions)


def _extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.aminmax(x, dim=-1)`` of the law's values, read on the native tensor for
    ``ScaledLogits`` (the product is increasing: its extremes are the extremes' products)."""
    raw, scale = parts(x)
    lo, hi = torch.aminmax(raw, dim=-1)
    return law_values(lo, scale), law_values(hi, scale)


def _weights(
    x: torch.Tensor, temperature: torch.Tensor, mx: torch.Tensor | None = None
) -> torch.Tensor:
    """``[M, V]`` float64 ``exp((x - max x) / T)``: the reference's operations, in its order, in
    place on one float64 copy (``mx`` ``[M, 1]``: the row max when the caller has it)."""
    w = x.to(torch.float64)  # [M, V] (a copy: x is float32, or cloned below when float64)
    if w.data_ptr() == x.data_ptr():
        w = w.clone()
    w.sub_(w.amax(-1, keepdim=True) if mx is None else mx).div_(temperature[:, None])
    return w.exp_()


def _filtered(
    x: torch.Tensor,
    params: SamplingTensors,
    W: int,
    counts: tuple[int, int] | None = None,
    row_max: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows with a filter, on their shortlist: ``(ids [M, W] int64 ascending, probs [M, W]
    float64 — the law, zero off the kept set —, ok [M] bool)``; ``ok`` False = fall back.
    ``counts``: ``_filter_counts`` of ``params`` when the caller has them (else one sync here);
    ``row_max``: ``[M]`` ``x.amax(-1)`` when the caller has it."""
    raw, s = parts(x)  # native scaled logits: x as computed and its scale (else x, None)
    M, V = (int(n) for n in raw.shape)
    if counts is None:
        n_no_k, n_min_p = (int(c) for c in torch.stack(_filter_counts(params, V)).tolist())
    else:
        n_no_k, n_min_p = counts
    t, k, p, mp = params.temperature, params.top_k, params.top_p, params.min_p  # [M] each
    cand, mx, w_c = _shortlist(raw, s, W, t, row_max)  # [M, W], [M, 1], [M, W]
    vals, order = torch.sort(w_c, dim=-1, descending=True, stable=True)  # [M, W] ties by id
    full = W == V  # every token is shortlisted: always decidable
    if n_no_k == M and not n_min_p:
        # NOTE every row has top-p alone (the sampled configs' common call): the general path's
        # top-k and min-p steps keep every token and decide every row there, so they are left
        # out: the same values, ~40 fewer host ops (docs/internals.md "Deferred shortlist reads")
        keep_p, closed = _nucleus(vals, vals, weight_sum(raw, t, mx, s), p)  # [M, W], [M]
        return cand, _by_id(vals, keep_p, order), closed | full
    w_min = vals[:, -1:]  # [M, 1]
    k_on = (k > 0) & (k < V)  # [M]
    p_on = p < 1  # [M]
    # top-k: keep w >= k-th weight; decidable when that weight is above w_min (or all are here)
    kth = vals.gather(-1, (k.clamp(1, W) - 1)[:, None])  # [M, 1]
    ok_k = ~k_on | ((k <= W) & ((kth[:, 0] > w_min[:, 0]) | full))  # [M]
    keep = ~k_on[:, None] | (vals >= kth)  # [M, W]
    # top-p on the post-top-k law; its normaliser is the full-vocabulary sum when top-k is off
    kept_w = vals.masked_fill(~keep, 0.0)  # [M, W]
    z = kept_w.sum(-1)  # [M]
    no_k = p_on & ~k_on  # [M] rows that need the full sum (``n_no_k`` of them)
    if n_no_k:
        # the full-vocabulary sum in one fused read on CUDA (``sampling.kernels``: the same
        # float64 terms, another addition order), ``_weights(..).sum(-1)``'s operations elsewhere
        if n_no_k == M:  # every row: no [M, V] row gather, no index
            z = weight_sum(raw, t, mx, s)  # [M] as the reference's sum
        else:  # the host knows R: ``nonzero``'s ids without its host sync (one per call)
            r = _true_ids(no_k, n_no_k)  # [R] ascending
            z = z.index_put((r,), weight_sum(raw[r], t[r], mx[r], s))
    keep_p, closed = _nucleus(vals, kept_w, z, p)  # [M, W], [M]
    ok_p = ~p_on | (k_on & ok_k) | closed | full  # [M]
    keep = keep & (~p_on[:, None] | keep_p)
    # min-p on the post-top-p law (scale invariant: compare weights renormalised over the kept set)
    keep, ok_m = _min_p_step(x, t, vals, keep, k_on, p_on, mp, full, n_min_p > 0)
    return cand, _by_id(vals, keep, order), ok_k & ok_p & ok_m


def _true_ids(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` ids where ``mask`` ``[M]`` holds, ascending: ``nonzero_static`` (no host read),
    or ``nonzero`` where the device has no ``nonzero_static`` (CUDA before torch 2.6)."""
    try:
        return torch.nonzero_static(mask, size=n).squeeze(-1)
    except NotImplementedError:
        return torch.nonzero(mask).squeeze(-1)


def _nucleus(
    vals: torch.Tensor, kept_w: torch.Tensor, z: torch.Tensor, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p's step of ``_filtered`` on the weights ``vals`` ``[M, W]`` (descending) kept so far
    (``kept_w``, normaliser ``z`` ``[M]``): ``(keep [M, W] — the token's mass before it is below
    ``p`` —, closed [M] — the nucleus ends before the shortlist's smallest weight)``."""
    probs = kept_w / z[:, None]  # [M, W]
    csum = torch.cumsum(probs, dim=-1)  # [M, W]
    before = torch.cat([torch.zeros_like(csum[:, :1]), csum[:, :-1]], dim=-1)  # [M, W]
    first_min = (vals > vals[:, -1:]).sum(-1)  # [M] index of the first w_min token (safe end)
    closed = before.gather(-1, first_min.clamp(max=vals.shape[1] - 1)[:, None])[:, 0] >= p  # [M]
    return before < p[:, None], closed


def _by_id(vals: torch.Tensor, keep: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``[M, W]`` float64: the weights ``vals`` (descending) kept by ``keep``, normalised, back in
    the shortlist's id order (``order[j]`` is the slot of ``vals[:, j]``)."""
    kept_w = vals.masked_fill(~keep, 0.0)  # [M, W]
    final = kept_w / kept_w.sum(-1, keepdim=True)  # [M, W] in weight order
    return torch.empty_like(final).scatter_(-1, order, final)  # [M, W]


def _shortlist(
    raw: torch.Tensor, s: float | None, W: int, t: torch.Tensor, row_max: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1-2 of ``_filtered``: the shortlist (a selection on the logits as given: comparisons
    only), then float64 weights as the reference — ``(ids [M, W] ascending, row max [M, 1]
    float64, weights [M, W] float64)``; ``s``: the scale of native ``raw`` (``parts``)."""
    cand = torch.topk(raw, W, dim=-1, sorted=False).indices.sort(dim=-1).values  # [M, W] ids asc
    # NOTE converting to float64 is exact and monotone, so the max and the gathered shortlist
    # converted afterwards are bit-equal to the reference's (convert all V, then max / gather);
    # so is scaling native logits after the max / gather (``sampling/scaled.py``)
    if row_max is None:
        row_max = law_values(raw.amax(-1), s)  # [M]
    mx = row_max[:, None].to(torch.float64)  # [M, 1]
    picked = law_values(raw.gather(-1, cand), s).to(torch.float64)  # [M, W]
    return cand, mx, torch.exp((picked - mx) / t[:, None])


def _min_p_step(
    x: torch.Tensor,
    t: torch.Tensor,
    vals: torch.Tensor,
    keep: torch.Tensor,
    k_on: torch.Tensor,
    p_on: torch.Tensor,
    mp: torch.Tensor,
    full: bool,
    any_min_p: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep [M, W], ok [M])`` after min-p on the shortlisted weights ``vals`` (descending);
    ``any_min_p``: some row has min-p on."""
    m_on = mp > 0  # [M]
    if not any_min_p:
        return keep, torch.ones_like(m_on)
    kept_w = vals.masked_fill(~keep, 0.0)  # [M, W]
    pr = kept_w / kept_w.sum(-1, keepdim=True)  # [M, W]
    if bool((m_on & ~k_on & ~p_on).any()):
        # NOTE min-p alone normalises over the whole vocabulary, as the reference does
        r = torch.nonzero(m_on & ~k_on & ~p_on).squeeze(-1)  # [R]
        z_full = _weights(x[r], t[r]).sum(-1)  # [R]
        pr[r] = vals[r] / z_full[:, None]
    thr = mp[:, None] * pr[:, :1]  # [M, 1] min_p * max p (the first is the largest)
    keep = keep & (~m_on[:, None] | (pr >= thr))
    # decidable when the threshold is above every unlisted token's probability
    return keep, ~m_on | k_on | p_on | full | (thr[:, 0] > pr[:, -1])


# ----------------------------------------------------------------------------- variants


def _verify_fast(target_logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    return logits_to_probs_fast(target_logits, params)


_draft_fast = mutants.truthful_draft(logits_to_probs_fast)  # the processed q on the shortlist


def fast_variant(variant: mutants.SpecVariant) -> mutants.SpecVariant:
    """``variant`` with its pipeline hooks (flags ``exact_verify`` / ``truthful_draft``) on the fast
    pipeline; a hook a mutant changes keeps the reference, so its deviation is the one built."""
    changes: dict[str, Any] = {}
    if variant.exact_verify:
        changes["verify_fn"] = _verify_fast
    if variant.truthful_draft:
        changes["draft_fn"] = _draft_fast
    return dataclasses.replace(variant, **changes)
