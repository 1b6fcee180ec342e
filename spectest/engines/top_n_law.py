"""The processed law rebuilt from a top-n list of the raw or tempered law a server reports.

Owns ``processed_from_list`` (the law, or a ``Violation`` where the list does not fix it; a
``Straddle`` where only the normaliser's bracket leaves the nucleus's cut open), ``z_bracket``
and ``law_settings``. Used by ``engines.plain_laws`` and ``engines.server_raw_law``. Raw versus
tempered lists and the bracket: docs/numerics.md "Top-n lists".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from spectest.engines.replies import Violation
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

KINDS = ("raw", "tempered")  # the reported laws a processed law is rebuilt from
OFF_LIST = -1e30  # the logit of an id outside a top-n list (probability exactly 0 after softmax)
EDGE = 1e-12  # a nucleus whose bar reaches 1 − EDGE of the list's mass may leave the list


class Straddle(Violation):
    """The bracket on Z leaves the nucleus's cut open: the list does not fix the law. Decided by
    the list alone (a function of the prefix, not of the token drawn there), so a test that
    leaves such a token or prefix out keeps its level on the rest
    (docs/numerics.md "A straddled token is left out")."""


def law_settings(params: SamplingParams, kind: str) -> SamplingParams:
    """The settings spectest's pipeline applies to a reported law of ``kind``: the request's
    for ``raw``; for ``tempered`` the same with temperature 1 (already applied; greedy stays
    greedy: the argmax is the same at any temperature)."""
    if kind == "tempered" and params.temperature > 0:
        return replace(params, temperature=1.0)
    return params


def unfiltered(params: SamplingParams) -> bool:
    """No top-k, top-p or min-p, and not greedy: a tempered report is then the processed law."""
    return params.temperature > 0 and not params.top_k and params.top_p == 1 and not params.min_p


def z_bracket(probs: torch.Tensor, vocab: int, a: float) -> tuple[float, float]:
    """Bounds on Z = Σ_v p_v^a over all ``vocab`` ids from the top-n list ``probs`` (float64):
    Σ_list p^a plus the least and the most the outside mass o = 1 − Σ_list p can add, spread
    over the V − n other ids each ≤ p_min (the list's smallest). For a > 1 (convex) the least is
    an equal spread, (V − n)·(o / (V − n))^a, and the most o·p_min^(a − 1) (as many ids at p_min
    as fit); for a < 1 the two swap; a = 1 gives Z = 1 exactly.

    Notes
    -----
    Assumes the list is the top n of a law over ``vocab`` ids (every other id ≤ p_min) and that
    ``vocab`` counts every id the server can give p > 0 (a padded vocabulary's ids at −inf add
    nothing). A list whose outside mass cannot fit under p_min is refused by the caller.
    """
    w = probs**a
    sw = float(w.sum())
    if a == 1:
        return 1.0, 1.0
    o, m = max(0.0, 1.0 - float(probs.sum())), vocab - len(probs)
    if o == 0 or m <= 0:
        return sw, sw
    pmin = float(probs.min())
    spread = m * min(o / m, pmin) ** a
    packed = o * pmin ** (a - 1)
    return sw + min(spread, packed), sw + max(spread, packed)


def processed_from_list(
    ids: Sequence[int],
    probs: Sequence[float],
    vocab: int,
    params: SamplingParams,
    where: str,
    kind: str = "raw",
) -> torch.Tensor:
    """The processed law ``[vocab]`` from a top-n list of a ``kind`` law (``ids`` with their
    probabilities, the n most probable), exact when the filtered support closes inside the
    list: greedy; top-k ≤ n (the k largest renormalised: no normaliser needed); min-p alone that
    cuts a listed token (ratios to the largest); top-p alone when the nucleus closes inside the
    list at every normaliser ``z_bracket`` allows (one cut at both ends; a tempered or a
    temperature-1 raw list: Z = 1, the bar top_p / Σ_list p). Else ``Violation``, one line
    saying why: the law outside the list would decide it."""
    eff = law_settings(params, kind)
    T, k, top_p, min_p = eff.temperature, eff.top_k, eff.top_p, eff.min_p
    p = torch.tensor(list(probs), dtype=torch.float64)
    mass, n = float(p.sum()), len(p)
    rel = (p / p.max()) ** (1 / T) if T > 0 and n else p
    what = f"top-{n} {kind} list"
    row = torch.full((vocab,), OFF_LIST, dtype=torch.float64)  # exp underflows to 0: finite
    row[torch.as_tensor(list(ids), dtype=torch.int64)] = torch.log(p)
    if T == 0 or 0 < k <= n or (min_p > 0 and k == 0 and top_p == 1 and float(rel.min()) < min_p):
        return _pipeline(row, eff)
    if k == 0 and min_p == 0 and top_p < 1 and n:
        return _nucleus(row, p, vocab, eff, where, what)
    raise Violation(
        where,
        f"a processed law that closes inside the {what} (greedy; top_k <= {n}; top_p reached "
        "inside it; min_p cutting a listed token)",
        f"temperature {params.temperature:g} top_k {k} top_p {top_p:g} min_p {min_p:g}, "
        f"list mass {mass:.6f}",
    )


def _nucleus(
    row: torch.Tensor, p: torch.Tensor, vocab: int, eff: SamplingParams, where: str, what: str
) -> torch.Tensor:
    """Top-p alone on a list: the pipeline on the list (softmax over it: w / Σ_list w, w =
    p^(1/T)) at the bar top_p·Z / Σ_list w, at both ends of Z's bracket; the same support at
    both is the nucleus at the true Z (the kept count is monotone in Z)."""
    a = 1 / eff.temperature
    n, o = len(p), max(0.0, 1.0 - float(p.sum()))
    if o > (vocab - n) * float(p.min()) * (1 + 1e-6) + 1e-12:
        raise Violation(
            where,
            f"a {what} of a law over {vocab} ids (the mass outside it fits under its smallest)",
            f"outside mass {o:.6g} over {vocab - n} ids each <= {float(p.min()):.6g}",
        )
    zlo, zhi = z_bracket(p, vocab, a)
    sw = float((p**a).sum())
    hi = eff.top_p * zhi / sw
    if hi >= 1 - EDGE:
        raise Violation(
            where,
            f"a top-p nucleus that closes inside the {what} (top_p {eff.top_p:g} at temperature "
            f"{eff.temperature:g}: the bar top_p·Z / Σ_list p^(1/T) below 1)",
            f"bar {hi:.6f} (Z <= {zhi:.6g}): the nucleus may leave the list",
        )
    got = _pipeline(row, replace(eff, top_p=hi))
    if zlo == zhi:
        return got
    low = _pipeline(row, replace(eff, top_p=eff.top_p * zlo / sw))
    if not torch.equal(low > 0, got > 0):
        raise Straddle(
            where,
            f"a top-p nucleus that the {what} fixes (top_p {eff.top_p:g} at temperature "
            f"{eff.temperature:g}: one cut for every Z = Σ_v p_v^(1/T) the list allows)",
            f"Z in [{zlo:.6g}, {zhi:.6g}] (outside mass {o:.3g}): "
            f"{int((low > 0).sum())} to {int((got > 0).sum())} tokens kept",
        )
    return got


def _pipeline(row: torch.Tensor, at: SamplingParams) -> torch.Tensor:
    return logits_to_probs(row[None, :], SamplingTensors.from_params([at]))[0]


__all__ = ["KINDS", "Straddle", "law_settings", "processed_from_list", "unfiltered", "z_bracket"]
