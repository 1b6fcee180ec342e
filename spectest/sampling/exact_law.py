"""The exact law of one speculative round, computed FROM THE IMPLEMENTATION by quadrature over its
uniforms (small vocabularies), the plain-sampling law it must equal, and total variation between
such laws. Knows nothing about models (logits come from callables), statistics or engines. Why and
details: docs/internals.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from spectest.errors import NumericsError
from spectest.sampling.draw import argmax_tokens, categorical
from spectest.sampling.mutants import SpecVariant, stack_q
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

SequenceLaw = dict[tuple[int, ...], float]  # {emitted token ids: probability}
LogitsFn = Callable[[tuple[int, ...]], torch.Tensor]  # context in the round → logits [V]
EDGE = 1e-7  # probes sit this fraction of a cell side (at least ULPS) inside its ends
ULPS = 1e-15
MERGE = 1e-12  # breakpoints closer than this are one
ExtraBreaks = Callable[[int, torch.Tensor, torch.Tensor | None, int, torch.Tensor], Iterable[float]]


class GridTooLarge(NumericsError):
    """``round_law``'s quadrature grid would exceed its ``max_cells``: nothing was evaluated."""


@dataclass(frozen=True)
class MarkovChain:
    """Context-dependent toy models: row ``c`` of ``[V, V]`` logits is the next-token logits after
    token ``c``; ``start`` is the token before the round. Per-position laws differ with context."""

    target_logits: torch.Tensor  # [V, V]
    draft_logits: torch.Tensor  # [V, V]
    start: int

    def target(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self.target_logits[ctx[-1] if ctx else self.start]  # [V]

    def draft(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self.draft_logits[ctx[-1] if ctx else self.start]  # [V]


def _pieces(breaks: Iterable[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Midpoints and lengths ``[n]`` of the cells of (0, 1) cut at ``breaks``; breakpoints closer
    than ``MERGE`` are one (an ulp apart: each merge moves at most ``MERGE`` of mass)."""
    kept = [0.0]
    for b in sorted(float(b) for b in breaks if 0.0 < float(b) < 1.0):
        if b - kept[-1] > MERGE:
            kept.append(b)
    if 1.0 - kept[-1] <= MERGE and len(kept) > 1:
        kept.pop()
    kept.append(1.0)
    lo = torch.tensor(kept[:-1], dtype=torch.float64)
    hi = torch.tensor(kept[1:], dtype=torch.float64)
    return (lo + hi) / 2, hi - lo


def _cdf_points(w: torch.Tensor) -> list[float]:
    """Breakpoints of ``categorical(w, u)`` in u: the normalised running sums."""
    c = torch.cumsum(w, -1)
    return (c / c[-1]).tolist() if float(c[-1]) > 0 else []


def _conditional(fn: LogitsFn, ctx: tuple[int, ...], params: SamplingParams) -> torch.Tensor:
    return logits_to_probs(fn(ctx)[None], SamplingTensors.from_params([params]))[0]  # [V]


def plain_law(target: LogitsFn, params: SamplingParams, length: int) -> SequenceLaw:
    """The law of ``length`` tokens of plain sampling (the pipeline of ``transforms``)."""
    return complete_law({(): 1.0}, target, params, length)


def complete_law(
    law: SequenceLaw, target: LogitsFn, params: SamplingParams, length: int
) -> SequenceLaw:
    """Extend every sequence of ``law`` to ``length`` tokens by plain sampling (truncate longer).

    A round is exact iff its completed law equals ``plain_law`` (later rounds start from the
    emitted context, so only the law of the first ``length`` tokens matters, for every length).
    """
    out: SequenceLaw = {}
    cache: dict[tuple[int, ...], list[float]] = {}

    def extend(seq: tuple[int, ...], w: float) -> None:
        if len(seq) >= length:
            key = seq[:length]
            out[key] = out.get(key, 0.0) + w
            return
        if seq not in cache:
            cache[seq] = _conditional(target, seq, params).tolist()
        for v, pv in enumerate(cache[seq]):
            if pv > 0:
                extend((*seq, v), w * pv)

    for seq, w in law.items():
        extend(seq, w)
    return out


def total_variation(a: SequenceLaw, b: SequenceLaw) -> float:
    """TV = 1/2 sum |a - b| over the union of supports."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def marginal(law: SequenceLaw, position: int) -> dict[int, float]:
    """The law of the token at ``position`` (sequences shorter than that are skipped)."""
    out: dict[int, float] = {}
    for seq, w in law.items():
        if len(seq) > position:
            out[seq[position]] = out.get(seq[position], 0.0) + w
    return out


Draft = tuple[tuple[int, ...], float, list[torch.Tensor | None]]  # tokens, probability, q's
BatchLogitsFn = Callable[[list[tuple[int, ...]]], torch.Tensor]  # N contexts → logits [N, V]


def draft_tree(
    variant: SpecVariant,
    draft: BatchLogitsFn,
    params: SamplingParams,
    K: int,
    *,
    onehot: bool,
    q_mode: str = "processed",
    check: bool = True,
    max_drafts: int | None = None,
) -> tuple[list[Draft], float]:
    """The draft sequences of ``variant``'s drafter with their probability (the measure of the
    draft uniforms ``categorical`` maps to them) and the q reported at each position, one
    ``draft`` call per level; and the mass left out (``max_drafts``: only that many most probable
    prefixes are kept per level, ties by token order; 0 without)."""
    level: list[Draft] = [((), 1.0, [])]
    missing = 0.0
    for _ in range(K):
        logits = draft([seq for seq, _, _ in level])  # [N, V]
        sample_probs, q = variant.draft_law(
            logits,
            SamplingTensors.from_params([params] * len(level)),
            onehot=onehot,
            q_mode=q_mode,
        )
        nxt: list[Draft] = []
        for i, (seq, w, qs) in enumerate(level):
            row = sample_probs[i : i + 1]  # [1, V]
            q_row = None if q is None else q[i : i + 1]  # [1, V] or None (one-hot: δ(x))
            if onehot:
                nxt.append(((*seq, int(argmax_tokens(row)[0])), w, [*qs, q_row]))
                continue
            mids, lens = _pieces(_cdf_points(row[0]))
            toks = categorical(row.expand(len(mids), -1).contiguous(), mids)  # [n]

            def draw(u: torch.Tensor, row: torch.Tensor = row) -> torch.Tensor:
                return categorical(row.expand(len(u), -1).contiguous(), u)

            if check and not _constant_on_cells(draw, mids, lens, toks):
                raise NumericsError(f"exact_law: a draft breakpoint is missing after {seq}")
            agg: dict[int, float] = {}
            for t, ln in zip(toks.tolist(), lens.tolist(), strict=True):
                agg[t] = agg.get(t, 0.0) + ln
            nxt += [((*seq, t), w * wt, [*qs, q_row]) for t, wt in sorted(agg.items())]
        if max_drafts is not None and len(nxt) > max_drafts:
            order = sorted(range(len(nxt)), key=lambda i: -nxt[i][1])
            keep = sorted(order[:max_drafts])
            missing += sum(nxt[i][1] for i in order[max_drafts:])
            nxt = [nxt[i] for i in keep]
        level = nxt
    return level, missing


def _constant_on_cells(
    fn: Callable[[torch.Tensor], torch.Tensor],
    mids: torch.Tensor,
    sides: torch.Tensor,
    expected: torch.Tensor,
) -> bool:
    """True iff ``fn`` gives ``expected`` at probes of every cell: ``EDGE`` of the side inside both
    ends of each coordinate (others at the midpoint) and one random interior point."""
    if mids.dim() == 1:
        mids, sides, flat = mids[:, None], sides[:, None], True
    else:
        flat = False
    probes = []
    for c in range(int(mids.shape[1])):
        for sign in (-1.0, 1.0):
            u = mids.clone()
            inset = torch.clamp(EDGE * sides[:, c], min=ULPS)
            u[:, c] = mids[:, c] + sign * (sides[:, c] / 2 - inset)
            probes.append(u)
    g = torch.Generator().manual_seed(0)
    probes.append(
        mids + (torch.rand(mids.shape, generator=g, dtype=torch.float64) - 0.5) * 0.9 * sides
    )
    for u in probes:
        if not torch.equal(fn(u[:, 0] if flat else u), expected):
            return False
    return True


def round_law(
    variant: SpecVariant,
    target: LogitsFn,
    draft: LogitsFn,
    params: SamplingParams,
    K: int,
    *,
    onehot: bool,
    q_mode: str = "processed",
    extra_accept_breaks: ExtraBreaks | None = None,
    check: bool = True,
    max_rows: int = 200_000,
    drafts: list[Draft] | None = None,
    max_cells: int | None = None,
    compact: bool = False,
    stats: dict[str, int] | None = None,
) -> SequenceLaw:
    """The exact law of the tokens one round of ``variant`` emits (sequences of 1..K+1 tokens).

    ``target(ctx)``/``draft(ctx)`` give logits ``[V]`` after the round's drafted tokens ``ctx``.
    ``extra_accept_breaks(j, p_j, q_j | None, x_j, p_{j+1})``: a mutant's other thresholds of
    acceptance uniform ``j`` (``known_accept_breaks``). ``drafts`` (``draft_tree``'s): use those
    instead of all (the law is then the sub-measure over them). ``max_cells``: raise
    ``GridTooLarge`` before a larger grid. ``compact``: evaluate on the tokens that can matter
    only (p > 0 somewhere, q > 0, or drafted; the same law for the catalogue's variants,
    tests/test_tooth_size.py). ``stats`` receives ``cells``, the grid's size.
    """
    if drafts is None:
        drafts, _ = draft_tree(
            variant,
            lambda ctxs: torch.stack([draft(c) for c in ctxs]),  # [N, V]
            params,
            K,
            onehot=onehot,
            q_mode=q_mode,
            check=check,
        )
    seqs, w_draft, tp, dp = _round_laws(variant, target, params, drafts, K)
    vocab = None
    if compact:
        vocab, tp, dp, seqs = _compact(tp, dp, seqs)
    mids, sides, own = _grid(variant, tp, dp, seqs, extra_accept_breaks, max_cells, stats)
    weights = sides.prod(-1) * w_draft[own]  # [N] cell volume x draft probability
    emitted = _emit(variant, tp, dp, seqs, mids, sides, own, check, max_rows)  # [N, K+1]
    if vocab is not None:  # back to token ids
        emitted = torch.where(emitted >= 0, vocab[emitted.clamp(min=0)], emitted)
    uniq, inv = torch.unique(emitted, dim=0, return_inverse=True)  # [U, K+1], [N]
    mass = torch.zeros(int(uniq.shape[0]), dtype=torch.float64).index_add_(0, inv, weights)  # [U]
    law: SequenceLaw = {}
    for row, w in zip(uniq.tolist(), mass.tolist(), strict=True):
        key = tuple(t for t in row if t >= 0)
        law[key] = law.get(key, 0.0) + w
    return law


def _round_laws(
    variant: SpecVariant, target: LogitsFn, params: SamplingParams, drafts: list[Draft], K: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(seqs [S, K], w_draft [S], tp [S, K+1, V], dp [S, K, V] | None)``: the draft sequences,
    their probabilities, the variant's target law along each and the q's it was told."""
    S = len(drafts)
    seqs = torch.tensor([d[0] for d in drafts], dtype=torch.int64).reshape(S, K)  # [S, K]
    w_draft = torch.tensor([d[1] for d in drafts], dtype=torch.float64)  # [S]
    logits = torch.stack(
        [torch.stack([target(d[0][:j]).to(torch.float64) for j in range(K + 1)]) for d in drafts]
    )  # [S, K+1, V]
    tp = variant.verify_probs(logits, SamplingTensors.from_params([params] * S))  # [S, K+1, V]
    q_pos = [
        None if drafts[0][2][j] is None else torch.cat([d[2][j] for d in drafts])  # type: ignore[misc]
        for j in range(K)
    ]  # K x [S, V] or None (one-hot)
    return seqs, w_draft, tp, stack_q(q_pos)  # dp [S, K, V] or None


def _compact(
    tp: torch.Tensor, dp: torch.Tensor | None, seqs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The laws on the tokens that can matter (p > 0 somewhere, q > 0, or drafted), in
    vocabulary order: ``(vocab [V'], tp, dp, seqs)`` remapped to ``[0, V')``."""
    keep = (tp > 0).reshape(-1, tp.shape[-1]).any(0)  # [V]
    if dp is not None:
        keep |= (dp > 0).reshape(-1, dp.shape[-1]).any(0)
    keep[seqs.reshape(-1)] = True
    vocab = keep.nonzero()[:, 0]  # [V'] ascending: the order of the vocabulary is kept
    remap = torch.full((int(tp.shape[-1]),), -1, dtype=torch.int64)
    remap[vocab] = torch.arange(len(vocab))
    tp, seqs = tp[..., vocab].contiguous(), remap[seqs]
    dp = None if dp is None else dp[..., vocab].contiguous()
    return vocab, tp, dp, seqs


def _grid(
    variant: SpecVariant,
    tp: torch.Tensor,
    dp: torch.Tensor | None,
    seqs: torch.Tensor,
    extra_accept_breaks: ExtraBreaks | None,
    max_cells: int | None,
    stats: dict[str, int] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The quadrature cells of every draft sequence: ``(mids [N, K+1], sides [N, K+1],
    owner [N])`` — the cell midpoints in (K acceptance, 1 final) uniforms, their side lengths and
    the draft sequence each belongs to (docs/internals.md: the breakpoints)."""
    S, K = (int(n) for n in seqs.shape)
    V = int(tp.shape[-1])
    all_mids, all_sides, owner = [], [], []
    n_cells = 0
    for s_i in range(S):
        seq = seqs[s_i].tolist()
        accept_grids, final_breaks = [], []
        for j in range(K + 1):
            p_j = tp[s_i, j]  # [V]
            final_breaks += _cdf_points(p_j)
            if j == K:
                continue
            q_j = None if dp is None else dp[s_i, j]  # [V]
            delta = torch.zeros(V, dtype=torch.float64).index_fill_(0, seqs[s_i, j : j + 1], 1.0)
            q_full = delta if q_j is None else q_j
            final_breaks += _cdf_points((p_j - q_full).clamp(min=0))  # residual
            final_breaks += _cdf_points(p_j * (1 - delta))  # p without x (one-hot residual)
            qx = float(q_full[seq[j]])
            brk = [float(p_j[seq[j]]) / qx] if qx > 0 else []
            if extra_accept_breaks is not None:
                brk += list(extra_accept_breaks(j, p_j, q_j, seq[j], tp[s_i, j + 1]))
            accept_grids.append(_pieces(brk))
        grids = [*accept_grids, _pieces(final_breaks)]
        n_cells += math.prod(len(m) for m, _ in grids)
        if max_cells is not None and n_cells > max_cells:
            raise GridTooLarge(
                f"exact_law: the quadrature grid of {variant.name!r} exceeds {max_cells} cells"
            )
        mids = torch.cartesian_prod(*[m for m, _ in grids]).reshape(-1, K + 1)  # [n, K+1]
        all_mids.append(mids)
        all_sides.append(torch.cartesian_prod(*[ln for _, ln in grids]).reshape(-1, K + 1))
        owner.append(torch.full((int(mids.shape[0]),), s_i, dtype=torch.int64))
    if stats is not None:
        stats["cells"] = n_cells
    return torch.cat(all_mids), torch.cat(all_sides), torch.cat(owner)  # [N, ...]


def _emit(
    variant: SpecVariant,
    tp: torch.Tensor,
    dp: torch.Tensor | None,
    seqs: torch.Tensor,
    mids: torch.Tensor,
    sides: torch.Tensor,
    own: torch.Tensor,
    check: bool,
    max_rows: int,
) -> torch.Tensor:
    """The variant's emitted tokens ``[N, K+1]`` at every cell's midpoint, ``max_rows`` cells at
    a time; with ``check``, ``NumericsError`` unless every cell is constant (probed)."""
    outs = []
    for a in range(0, int(mids.shape[0]), max_rows):
        idx, m = own[a : a + max_rows], mids[a : a + max_rows]
        # the rows' laws, gathered once for the midpoints and every probe
        tp_r, dp_r, x_r = tp[idx], None if dp is None else dp[idx], seqs[idx]

        def run(
            u: torch.Tensor,
            tp_r: torch.Tensor = tp_r,
            dp_r: torch.Tensor | None = dp_r,
            x_r: torch.Tensor = x_r,
        ) -> torch.Tensor:
            K = int(u.shape[1]) - 1
            return variant.sample(
                tp_r, dp_r, x_r, u[:, :K].contiguous(), u[:, K].contiguous()
            ).emitted

        emitted = run(m)  # [n, K+1]
        if check and not _constant_on_cells(run, m, sides[a : a + max_rows], emitted):
            raise NumericsError(
                f"exact_law: variant {variant.name!r} is not constant on a cell: a breakpoint is "
                f"missing (pass extra_accept_breaks)"
            )
        outs.append(emitted)
    return torch.cat(outs)  # [N, K+1]


def known_accept_breaks(variant_name: str) -> ExtraBreaks | None:
    """The acceptance thresholds of the catalogue's mutants beyond ``p/q`` (for ``round_law``):
    ``(1 + ε) p/q``, the bfloat16 ratio, the residual CDF (``reuse_accept_uniform``) or the next
    slot's CDF (``bonus_reuse_accept_uniform``); None for the others."""
    name, _, arg = variant_name.partition(":")

    def q_at(q: torch.Tensor | None, x: int) -> float:
        return 1.0 if q is None else float(q[x])

    if name == "eps_biased":
        eps = float(arg) if arg else 0.1
        return lambda j, p, q, x, p_next: (
            [(1 + eps) * float(p[x]) / q_at(q, x)] if q_at(q, x) > 0 else []
        )
    if name == "bf16_ratio":

        def bf16(v: float) -> float:
            return float(torch.tensor(v, dtype=torch.float64).to(torch.bfloat16).double())

        return lambda j, p, q, x, p_next: (
            [bf16(float(p[x])) / bf16(q_at(q, x))] if q_at(q, x) > 0 else []
        )
    if name == "reuse_accept_uniform":

        def residual_cdf(
            j: int, p: torch.Tensor, q: torch.Tensor | None, x: int, p_next: torch.Tensor
        ) -> list[float]:
            qf = q if q is not None else torch.zeros_like(p).index_fill_(0, torch.tensor([x]), 1.0)
            return _cdf_points((p - qf).clamp(min=0))

        return residual_cdf
    if name == "bonus_reuse_accept_uniform":
        return lambda j, p, q, x, p_next: _cdf_points(p_next)
    return None
