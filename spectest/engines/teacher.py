"""Teacher forcing: the white-box columns of ``schema.py`` along emitted sequences.

Owns the columns from dense or shortlist laws (``law_columns``), the role columns, the forcing
of the local target and draft (``teacher_force``) and their slow references. Knows nothing about
statistics or about how the sequences were produced. Which p_t, q_t and CDF order:
docs/internals-engines.md "spectest/engines/teacher.py"; the role laws: docs/roles.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.errors import InputError
from spectest.models.base import LanguageModel
from spectest.sampling.laws import Law, ShortlistLaw
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

if TYPE_CHECKING:
    from spectest.engines.base import DrafterSpec

# p and q are float64 [rows, T, V]: 2^23 elements = 64 MiB per tensor.
MAX_CHUNK_ELEMENTS = 1 << 23


def order_key(p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """The sort key of the CDF order (descending): p/q, or p without a draft. ``[N, V]`` float64.

    q = 0 gives +inf when p > 0 (first) and 0 when p = 0 (no mass: its place changes nothing).
    """
    if q is None:
        return p
    ratio = p / q  # [N, V]; p>0,q=0 → +inf; p=0,q=0 → nan
    return torch.where(torch.isnan(ratio), torch.zeros_like(ratio), ratio)


def whitebox_columns(
    p: torch.Tensor, q: torch.Tensor | None, tokens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """White-box columns (``[N]`` tensors keyed by ``schema.WHITEBOX_COLUMNS``) of ``N`` tokens
    ``[N]`` int64 under the float64 target law p ``[N, V]`` and the drafter's q ``[N, V]``
    (None: no draft; ``wb_p_a`` 0, ``wb_in_a`` False, ``wb_overlap`` NaN, order by p).

    Notes
    -----
    ``wb_cdf_lo`` = ``sum_v p_v · [v before x]`` with ``v before x ⇔ key_v > key_x or (key_v =
    key_x and v < x)``: an O(N·V) masked sum in float64, no sort.
    """
    assert p.dim() == 2 and p.dtype == torch.float64, (p.dtype, tuple(p.shape))
    N, V = p.shape
    assert tokens.shape == (N,) and tokens.dtype == torch.int64, (tokens.dtype, tuple(tokens.shape))
    if q is not None:
        assert q.shape == p.shape and q.dtype == torch.float64, (q.dtype, tuple(q.shape))
    _check_tokens(tokens, V, "whitebox_columns")
    x = tokens[:, None]  # [N, 1]
    ids = torch.arange(V, device=p.device)[None, :]  # [1, V]
    q_x = None if q is None else q.gather(1, x)
    return _columns(ids, p, q, p.gather(1, x), q_x, x)


def _columns(
    ids: torch.Tensor,
    pp: torch.Tensor,
    q_p: torch.Tensor | None,
    p_x: torch.Tensor,
    q_x: torch.Tensor | None,
    x: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The columns from p and q at ids ``[N or 1, W]`` (``pp``, ``q_p`` ``[N, W]``) and at the
    tokens ``x`` ``[N, 1]`` (``p_x``, ``q_x``): the body shared by the dense and shortlist forms."""
    key = order_key(pp, q_p)  # [N, W]
    key_x = order_key(p_x, q_x)  # [N, 1]
    before = (key > key_x) | ((key == key_x) & (ids < x))  # [N, W]
    zero = torch.zeros((), dtype=torch.float64, device=pp.device)
    out = {
        schema.WB_P: p_x[:, 0],  # [N]
        schema.WB_CDF_LO: torch.where(before, pp, zero).sum(1),  # [N]
    }
    if q_p is None or q_x is None:
        out.update(_no_draft_columns(int(x.shape[0]), pp.device))
    else:  # A_t = {v : q_t(v) > p_t(v)}
        out[schema.WB_P_A] = torch.where(q_p > pp, pp, zero).sum(1)  # [N]
        out[schema.WB_IN_A] = (q_x > p_x)[:, 0]  # [N]
        out[schema.WB_OVERLAP] = torch.minimum(pp, q_p).sum(1)  # [N]
    return out


def _no_draft_columns(N: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The q columns when there is no draft: ``wb_p_a`` 0, ``wb_in_a`` False, ``wb_overlap`` NaN."""
    f64 = torch.float64
    return {
        schema.WB_P_A: torch.zeros(N, dtype=f64, device=device),
        schema.WB_IN_A: torch.zeros(N, dtype=torch.bool, device=device),
        schema.WB_OVERLAP: torch.full((N,), float("nan"), dtype=f64, device=device),
    }


def law_columns(p: Law, q: Law | None, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The white-box columns of ``N`` tokens under laws ``[N, *]``: ``whitebox_columns_shortlist``
    for a shortlist p (O(N·W)), else ``whitebox_columns`` on the dense laws (a shortlist q is
    densified). The two give the same values up to float64 summation order (tested)."""
    if isinstance(p, ShortlistLaw):
        return whitebox_columns_shortlist(p, q, tokens)
    return whitebox_columns(p.dense(), None if q is None else q.dense(), tokens)


def whitebox_columns_shortlist(
    p: ShortlistLaw, q: Law | None, tokens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``whitebox_columns`` for a shortlist p ``[N, W]`` and any q ``Law`` ``[N, *]`` (or None)
    in O(N·W): the same values up to float64 summation order; tokens in ``[0, V)``, on p's
    shortlist or not.

    Notes
    -----
    Every sum is weighted by p_v or min(p_v, q_v), so ids off p's shortlist add exact zeros.
    x's own p(x), q(x) are looked up (0 off the shortlist): x off supp(p) has key 0 as densely.
    """
    ids, pp = p.ids, p.probs  # [N, W], [N, W]
    assert ids.dim() == 2 and pp.dtype == torch.float64, (pp.dtype, tuple(ids.shape))
    N = int(ids.shape[0])
    assert tokens.shape == (N,) and tokens.dtype == torch.int64, (tokens.dtype, tuple(tokens.shape))
    _check_tokens(tokens, p.vocab_size, "whitebox_columns_shortlist")
    x = tokens[:, None]  # [N, 1]
    q_p = None if q is None else q.prob_of(ids)  # [N, W] q at p's shortlist
    q_x = None if q is None else q.prob_of(x)  # [N, 1]
    return _columns(ids, pp, q_p, p.prob_of(x), q_x, x)


ROLE_CODES = {name: i for i, name in enumerate(schema.ROLES)}


def _role_weights(p: Law, q: Law | None, role: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, w)`` ``[N, W]``: p's support and each row's unnormalised role law on it
    (``role_columns`` Notes)."""
    if isinstance(p, ShortlistLaw):
        ids, pp = p.ids, p.probs  # [N, W]
    else:
        pp = p.dense()  # [N, V]
        ids = torch.arange(int(pp.shape[-1]), device=pp.device)[None, :].expand_as(pp)
    if q is None:
        return ids, pp
    qq = q.prob_of(ids)  # [N, W] q at p's support
    residual = (pp - qq).clamp(min=0.0)
    residual = torch.where(~(residual.sum(-1, keepdim=True) > 0), pp, residual)
    w = torch.where((role == ROLE_CODES["accepted"])[:, None], torch.minimum(pp, qq), pp)
    return ids, torch.where((role == ROLE_CODES["recovered"])[:, None], residual, w)


def role_columns(
    p: Law, q: Law | None, tokens: torch.Tensor, role: torch.Tensor, ratio: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The role columns (``wb_role_p``, ``wb_role_cdf_lo``, ``wb_role_beyond``,
    ``wb_role_tail``, each ``[N]``) of tokens ``[N]`` with role codes ``[N]`` (``schema.ROLES``)
    and ``ratio`` r ``[N]`` (``wb_role_ratio``) under laws p, q ``[N, *]``: docs/roles.md.

    Notes
    -----
    Role laws vanish off p's support, so a shortlist p is summed on its shortlist only; q = None
    leaves every role at p; a token of zero role mass gets ``wb_role_p`` 0; ``beyond`` is False
    and ``tail`` NaN for accepted drafts, plain tokens and r = 1 (nothing lies above 1).
    """
    ids, w = _role_weights(p, q, role)  # [N, W] each
    x = tokens[:, None]  # [N, 1]
    zero = torch.zeros((), dtype=torch.float64, device=w.device)
    total = w.sum(-1)  # [N]
    safe = torch.where(total > 0, total, torch.ones_like(total))[:, None]  # [N, 1]
    m_all = w / safe  # [N, W] normalised role law
    lo_all = (m_all.cumsum(-1) - m_all).clamp(min=0.0)  # [N, W] mass strictly below each id
    at = ids == x  # [N, W]
    mass = torch.where(at, m_all, zero).sum(-1)
    lo = torch.where(ids < x, m_all, zero).sum(-1)
    r = ratio[:, None]  # [N, 1]
    bonus = (role == ROLE_CODES["bonus"])[:, None]
    recovered = (role == ROLE_CODES["recovered"])[:, None]
    final = (bonus | recovered) & (r < 1.0)  # [N, 1]; r = 1 (or NaN): nothing lies beyond it
    beyond_all = torch.where(bonus, lo_all >= r, (lo_all + m_all) <= r) & final  # [N, W]
    tail = torch.where(beyond_all, m_all, zero).sum(-1)
    tail = torch.where(final[:, 0], tail.clamp(max=1.0), torch.full_like(tail, float("nan")))
    beyond = (beyond_all & at & (m_all > 0)).any(-1)  # a token of zero role mass: False
    return {
        schema.WB_ROLE_P: mass.clamp(max=1.0),
        schema.WB_ROLE_CDF_LO: lo.clamp(max=1.0),
        schema.WB_ROLE_BEYOND: beyond,
        schema.WB_ROLE_TAIL: tail,
    }


def role_reference(
    p: Sequence[float], q: Sequence[float] | None, x: int, role: str, ratio: float
) -> dict[str, float | bool]:
    """Slow reference of ``role_columns`` for ONE token: build the role's law, walk the ids."""
    V = len(p)
    if q is None or role in ("plain", "bonus"):
        w = list(p)
    elif role == "accepted":
        w = [min(p[v], q[v]) for v in range(V)]
    else:
        w = [max(0.0, p[v] - q[v]) for v in range(V)]
        if not sum(w) > 0:
            w = list(p)
    total = sum(w)
    m = [v / total for v in w] if total > 0 else [0.0] * V
    lo = [sum(m[:v]) for v in range(V)]
    final = role in ("bonus", "recovered") and ratio < 1.0  # False for NaN
    if role == "bonus":
        beyond = [lo[v] >= ratio for v in range(V)]
    else:
        beyond = [lo[v] + m[v] <= ratio for v in range(V)]
    return {
        schema.WB_ROLE_P: m[x],
        schema.WB_ROLE_CDF_LO: lo[x],
        schema.WB_ROLE_BEYOND: bool(final and beyond[x] and m[x] > 0),
        schema.WB_ROLE_TAIL: sum(m[v] for v in range(V) if beyond[v]) if final else float("nan"),
    }


def _check_tokens(tokens: torch.Tensor, V: int, where: str) -> None:
    bad = (tokens < 0) | (tokens >= V)
    if bool(bad.any()):
        raise InputError(f"{where}: token ids must be in [0, {V}), got {int(tokens[bad][0])!r}")


def whitebox_reference(
    p: Sequence[float], q: Sequence[float] | None, x: int
) -> dict[str, float | bool]:
    """Slow reference for ONE step: sort the tokens, walk the order, sum in Python."""
    V = len(p)

    def key(v: int) -> float:
        if q is None:
            return p[v]
        if q[v] == 0:
            return float("inf") if p[v] > 0 else 0.0
        return p[v] / q[v]

    order = sorted(range(V), key=lambda v: (-key(v), v))
    lo = 0.0
    for v in order:
        if v == x:
            break
        lo += p[v]
    return {
        schema.WB_P: p[x],
        schema.WB_CDF_LO: lo,
        schema.WB_P_A: 0.0 if q is None else sum(p[v] for v in range(V) if q[v] > p[v]),
        schema.WB_IN_A: False if q is None else q[x] > p[x],
        schema.WB_OVERLAP: float("nan") if q is None else sum(min(p[v], q[v]) for v in range(V)),
    }


def _emitted_logits(model: LanguageModel, prompt: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
    """Logits [b, T, V] predicting each emitted token of ``toks`` [b, T] after ``prompt`` [L].

    The prompt is run once and shared by the b rows (``prefill_shared``); its last logits predict
    token 0, and one forward over tokens 0..T-2 predicts tokens 1..T-1.
    """
    b, T = int(toks.shape[0]), int(toks.shape[1])
    cache, prompt_logits = model.prefill_shared(prompt, b)  # [L, V]
    first = prompt_logits[-1].expand(b, 1, -1)  # [b, 1, V]
    rest = model.forward(cache, toks[:, : T - 1])  # [b, T-1, V]
    return torch.cat([first, rest], dim=1)  # [b, T, V]


def forced_tokens(
    tokens: torch.Tensor | np.ndarray,
    params: Sequence[SamplingParams],
    prompt: Sequence[int],
    V: int,
    where: str = "teacher_force",
) -> torch.Tensor:
    """``tokens`` as an int64 ``[B, T]`` tensor, checked against ``params``, ``prompt`` and V;
    ``where`` names the caller in messages."""
    tokens = torch.as_tensor(tokens)
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise InputError(
            f"{where}: tokens must be int64 [B, T], got {tokens.dtype} {tuple(tokens.shape)}"
        )
    if len(params) != tokens.shape[0]:
        raise InputError(f"{where}: {tokens.shape[0]} token rows but {len(params)} params")
    _check_tokens(tokens, V, where)
    if len(prompt) == 0:
        raise InputError(f"{where}: prompt must hold at least one token id, got []")
    return tokens


def columns_frame(parts: Sequence[dict[str, torch.Tensor]]) -> pd.DataFrame:
    """Chunks of ``whitebox_columns`` (in row order) → one frame of ``schema.WHITEBOX_COLUMNS``."""
    cols = schema.WHITEBOX_COLUMNS
    return pd.DataFrame({c: np.concatenate([p[c].cpu().numpy() for p in parts]) for c in cols})


def teacher_force(
    target: LanguageModel,
    prompt: Sequence[int],
    params: Sequence[SamplingParams],
    tokens: torch.Tensor | np.ndarray,
    *,
    draft: LanguageModel | None = None,
    drafter: DrafterSpec | None = None,
) -> pd.DataFrame:
    """White-box columns (``B * T`` rows, row-major) of emitted tokens ``[B, T]`` int64 after
    ``prompt``, one ``SamplingParams`` per row, under the local ``target`` and, with a ``draft``,
    its ``drafter``'s q (without one the q columns take their "q unknown" values)."""
    from spectest.sampling.mutants import get_variant

    if draft is not None and drafter is None:
        raise InputError("teacher_force: a draft needs its drafter (DrafterSpec) to define q")
    tokens = forced_tokens(tokens, params, prompt, target.vocab_size)
    (B, T), V, dev = tokens.shape, target.vocab_size, target.device
    exact = get_variant("exact")
    chunk = max(1, MAX_CHUNK_ELEMENTS // max(1, T * V))
    parts = []
    prompt_t = torch.tensor(list(prompt), dtype=torch.int64, device=dev)  # [L]
    for lo in range(0, B, chunk):
        toks = tokens[lo : lo + chunk].to(dev)  # [b, T]
        b = int(toks.shape[0])
        pt = SamplingTensors.from_params(params[lo : lo + chunk], device=dev)
        p = logits_to_probs(_emitted_logits(target, prompt_t, toks), pt)  # [b, T, V] f64
        q = None
        if draft is not None and drafter is not None:
            d_logits = _emitted_logits(draft, prompt_t, toks).reshape(b * T, V)  # [b*T, V]
            rep = pt.index(torch.arange(b, device=dev).repeat_interleave(T))  # params per (row, t)
            sample_law, _ = exact.draft_law(
                d_logits, rep, onehot=drafter.onehot, q_mode=drafter.q_mode
            )
            q = sample_law  # [b*T, V] f64: the law the drafter proposes from
        parts.append(whitebox_columns(p.reshape(b * T, V), q, toks.reshape(b * T)))
    return columns_frame(parts)
