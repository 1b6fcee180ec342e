"""The size of a tooth: how far its law is from plain sampling, per cell-position, in TV.

Owns: the per-cell-position total variation between the law of an ε arm or mutant and the plain
law, computed from the run's own models (``tooth_sizes`` → one row per tooth × prompt × config ×
position, the table a run stores as ``tooth_sizes.parquet``), and the size of a tooth read from
that table (``size_of``: the largest TV over its cell-positions, or unknown); the table for a
protocol's teeth is ``generation.protocol_tooth_sizes`` (it knows protocols and prompts).
A killed tooth of size s is evidence that the run's tests see a bug of per-cell TV s;
``spectest.verdict`` turns the weakest such tooth into the run's power claim. Knows nothing
about statistics, verdicts or files.

The details (moved from this docstring):
docs/statistics.md "Tooth sizes: the method".
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from spectest.errors import NumericsError

if TYPE_CHECKING:
    import torch

__all__ = [
    "CELLS_PER_CONTEXT",
    "DEFAULT_BUDGET",
    "SIZE_COLUMNS",
    "ToothSize",
    "size_of",
    "tooth_sizes",
]

DEFAULT_BUDGET = 2048  # contexts (model forward rows) per tooth and cell: teeth.size_budget
CELLS_PER_CONTEXT = 25  # quadrature cells per round law: budget x this (2048 → 51 200)
DRAFT_CHUNK = 16  # draft sequences per quadrature call
MAX_ROWS = 16_384  # quadrature cells evaluated at once (memory: rows x (K + 1) x V' float64)
DROP = 1e-15  # |weight| below which a difference is dropped (its mass goes to the slack)
FORWARD_ROWS = 256  # rows per batched forward (and per expansion step of the completion)
DEVICE_FORWARD_ROWS = 1024  # rows per batched forward on an accelerator (the batched path)
AVOID_CUDNN_SDPA = False  # True: the batched path's CUDA forwards skip cuDNN attention
CACHE_BYTES = 256 << 20  # logits kept per prompt and model (float32): 256 MiB
SIZE_COLUMNS = (
    "arm", "variant", "prompt_id", "config_id", "position", "tv", "slack", "status",
)  # fmt: skip


@dataclass(frozen=True)
class ToothSize:
    """One tooth's size: the largest per-cell-position TV (an upper bound when not ``exact``),
    where it is, and whether it is known."""

    arm: str
    tv: float | None  # None: unknown (some cell could not be computed, or no rows)
    exact: bool
    where: str | None  # "prompt/config@position" of the maximum

    def label(self) -> str:
        if self.tv is None:
            return "size unknown"
        return f"size {self.tv:.3g}" if self.exact else f"size ≤ {self.tv:.3g}"


def size_of(table: pd.DataFrame | None, arm: str) -> ToothSize:
    """The size of ``arm`` from a ``tooth_sizes`` table (unknown without rows, or when a cell is
    unknown: a maximum over cells is not bounded by a part of them)."""
    if table is None or not len(table):
        return ToothSize(arm, None, False, None)
    rows = table[table["arm"] == arm]
    if not len(rows) or (rows["status"] == "unknown").any():
        return ToothSize(arm, None, False, None)
    tv = rows["tv"].astype(float)
    r = rows.loc[tv.idxmax()]
    # every bound is ≤ the maximum, so the maximum is exact when an exact row attains it
    exact = bool(((rows["status"] == "exact") & (tv == tv.max())).any())
    where = f"{r['prompt_id']}/{r['config_id']}@{int(r['position'])}"
    return ToothSize(arm, float(r["tv"]), exact, where)


class _Logits:
    """Next-token logits of one model after ``prompt + ctx``, for many contexts ``ctx``: batched
    forwards over the prompt's shared KV cache (``prefill_shared``), kept by context up to
    ``CACHE_BYTES`` (the oldest dropped first: a large vocabulary keeps fewer). Kept on the
    model's device (``many(..., on_device=True)`` for the completion) with a host copy made once
    per batch for the round laws (on CPU the two are the same tensor)."""

    def __init__(
        self,
        model: Any,
        prompt: Sequence[int],
        *,
        keep_prompt: bool = True,
        rows: int = FORWARD_ROWS,
        attention: Any = None,
    ) -> None:
        import torch

        self.model = model
        self.keep_prompt = keep_prompt  # False: every batch prefills the prompt (the reference)
        self.forward_rows = rows  # contexts per batched forward
        self.attention = attention or contextlib.nullcontext  # a context around each forward
        self.prompt = torch.tensor(list(prompt), dtype=torch.int64, device=model.device)
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}  # on the model's device
        self.host: dict[tuple[int, ...], torch.Tensor] = {}  # CPU copies of some of them
        self.max_entries = max(16, CACHE_BYTES // (4 * int(model.vocab_size)))
        self.rows = 0  # forward rows computed (for the timings)
        self._one: tuple[Any, torch.Tensor] | None = None  # one-row prompt cache, its logits

    def get(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self.many([ctx])[0]

    def fill(self, ctxs: Sequence[tuple[int, ...]]) -> None:
        """Compute (and keep, as room allows) the contexts not kept yet, with host copies."""
        self._store(self._compute([c for c in ctxs if c not in self.cache]))
        self._host([c for c in dict.fromkeys(ctxs) if c in self.cache])

    def many(self, ctxs: Sequence[tuple[int, ...]], *, on_device: bool = False) -> torch.Tensor:
        """Logits ``[N, V]`` float32 after each context: on the CPU, or the model's device."""
        import torch

        if not on_device and all(c in self.host for c in ctxs):  # all kept (host ⊆ cache)
            return torch.stack([self.host[c] for c in ctxs])
        new = self._compute([c for c in ctxs if c not in self.cache])
        out = torch.stack([new[c] if c in new else self.cache[c] for c in ctxs])
        self._store(new)
        return out if on_device else out.cpu()

    def _shared_prefill(self) -> bool:
        """True when the model prefills a shared prompt as ``LanguageModel.prefill_shared`` does
        (one row, then ``repeat_rows``): its one-row prompt cache is then kept and copied."""
        from spectest.models.base import LanguageModel

        return self.keep_prompt and type(self.model).prefill_shared is LanguageModel.prefill_shared

    def _prompt_logits(self) -> torch.Tensor:
        """The prompt's logits [L, V] from one one-row forward, kept with its cache."""
        import torch

        if not self._shared_prefill():
            return self.model.prefill_shared(self.prompt, 1)[1]
        if self._one is None:
            with torch.inference_mode(), self.attention():
                cache = self.model.new_cache(1)
                self._one = (cache, self.model.forward(cache, self.prompt[None, :])[0])
        return self._one[1]

    def _prefilled(self, n: int) -> Any:
        """An ``n``-row cache holding the prompt: ``prefill_shared(prompt, n)``'s, the prompt's
        forward done once per model and prompt (a copy of the kept one-row cache, repeated)."""
        if not self._shared_prefill():
            return self.model.prefill_shared(self.prompt, n)[0]
        self._prompt_logits()
        assert self._one is not None
        cache = copy.deepcopy(self._one[0])
        cache.repeat_rows(n)
        return cache

    def _host(self, ctxs: Sequence[tuple[int, ...]]) -> None:
        todo = [c for c in ctxs if c not in self.host]
        if todo:  # one transfer for the batch
            import torch

            rows = torch.stack([self.cache[c] for c in todo]).cpu()
            self.host.update(zip(todo, rows.unbind(0), strict=True))

    def _store(self, new: dict[tuple[int, ...], torch.Tensor]) -> None:
        self.cache.update(new)
        while len(self.cache) > self.max_entries:
            self.host.pop(old := next(iter(self.cache)), None)
            del self.cache[old]

    def _compute(self, ctxs: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], torch.Tensor]:
        import torch

        todo = sorted(set(ctxs))
        out: dict[tuple[int, ...], torch.Tensor] = {}
        if () in todo:
            out[()] = self._prompt_logits()[-1].float().clone()
            self.rows += 1
            todo.remove(())
        by_len: dict[int, list[tuple[int, ...]]] = {}
        for c in todo:
            by_len.setdefault(len(c), []).append(c)
        with torch.inference_mode(), self.attention():
            for _, group in sorted(by_len.items()):
                for a in range(0, len(group), self.forward_rows):
                    part = group[a : a + self.forward_rows]
                    cache = self._prefilled(len(part))
                    ids = torch.tensor(part, dtype=torch.int64, device=self.model.device)
                    logits = self.model.forward(cache, ids)[:, -1].float().contiguous()  # [B, V]
                    self.rows += len(part)
                    out.update(zip(part, logits.unbind(0), strict=True))
        return out


def _round(
    spec: str,
    target: _Logits,
    draft: _Logits,
    params: Any,
    drafter: Any,
    max_drafts: int,
    max_cells: int,
) -> tuple[dict[tuple[int, ...], float], float]:
    """The exact law of one round of ``spec`` at the prompt and the probability mass of the draft
    sequences left out of it: a one-hot drafter has one sequence (none left out); a sampled
    drafter's are taken most probable first, at most ``max_drafts`` and as many as fit in
    ``max_cells`` quadrature cells (the law is then a sub-measure). Raises ``GridTooLarge`` when
    not even the first draft fits, ``NumericsError`` when the law cannot be computed."""
    from spectest.sampling import exact_law
    from spectest.sampling.mutants import get_variant

    variant = get_variant(spec)
    K, onehot = drafter.k, drafter.onehot
    drafts, missing = exact_law.draft_tree(
        variant, draft.many, params, K, onehot=onehot, q_mode=drafter.q_mode,
        max_drafts=None if onehot else max_drafts,
    )  # fmt: skip
    drafts = sorted(drafts, key=lambda d: -d[1])
    law: dict[tuple[int, ...], float] = {}
    left, a, chunk_n = max_cells, 0, DRAFT_CHUNK
    while a < len(drafts):
        chunk = drafts[a : a + chunk_n]
        target.fill([d[0][:j] for d in chunk for j in range(K + 1)])
        stats: dict[str, int] = {}
        try:
            part = exact_law.round_law(
                variant, target.get, draft.get, params, K, onehot=onehot, q_mode=drafter.q_mode,
                extra_accept_breaks=exact_law.known_accept_breaks(spec), drafts=chunk,
                max_cells=left, compact=True, stats=stats, max_rows=MAX_ROWS,
            )  # fmt: skip
        except exact_law.GridTooLarge:
            if len(chunk) > 1:  # fewer drafts at a time, down to one
                chunk_n = max(1, len(chunk) // 2)
                continue
            if a == 0:
                raise
            missing += sum(d[1] for d in drafts[a:])
            break
        left -= stats["cells"]
        a += len(chunk)
        for seq, w in part.items():
            law[seq] = law.get(seq, 0.0) + w
    return law, missing


def cell_tvs(
    spec: str,
    target: _Logits,
    draft: _Logits,
    params: Any,
    drafter: Any,
    positions: int,
    *,
    budget: int = DEFAULT_BUDGET,
    exact_round: tuple[dict[tuple[int, ...], float], float] | None = None,
    reference: bool = False,
    batched: bool = False,
) -> list[tuple[float, float]]:
    """``(tv, slack)`` for positions 0..n-1 (n = min(K + 1, positions)) of one cell: the TV of
    the marginal at each position between the tooth ``spec``'s law (first round, completed by
    plain sampling) and the plain law, an upper bound with ``slack`` added (docs/statistics.md
    "Tooth sizes: the method").
    ``exact_round``: the exact sampler's ``_round`` at this cell, when already computed (it is
    the same for every tooth). Raises ``NumericsError`` when a round law cannot be computed.
    ``reference``: complete the round by ``_complete_reference`` (the slow reference: numpy on
    the host) instead of ``_complete`` (on the model's device); ``batched``: ``_complete``
    fetches all the contexts of a length at once (forwards of ``target.forward_rows``)."""
    n = min(drafter.k + 1, positions)
    max_drafts = max(1, budget // (2 * drafter.k + 1))  # each costs 2K + 1 contexts at most
    cells = budget * CELLS_PER_CONTEXT
    r_t, m_t = _round(spec, target, draft, params, drafter, max_drafts, cells)
    r_e, m_e = exact_round or _round("exact", target, draft, params, drafter, max_drafts, cells)
    diff = {s: r_t.get(s, 0.0) - r_e.get(s, 0.0) for s in set(r_t) | set(r_e)}
    base = 0.5 * (m_t + m_e)  # draft sequences left out: at most their mass, per position
    base += 0.5 * sum(abs(w) for w in diff.values() if abs(w) < DROP)
    delta = {s: w for s, w in diff.items() if abs(w) >= DROP}
    round_tv = 0.5 * sum(abs(w) for w in delta.values()) + base  # bounds every position
    V = int(target.get(()).shape[-1])
    marg = np.zeros((n, V))  # the signed marginal at each position
    slack = np.full(n, base)
    todo = _round_marginals(delta, marg)
    if reference:
        _complete_reference(todo, marg, slack, target, params, budget)
    else:
        _complete(todo, marg, slack, target, params, budget, prefetch=batched)
    return _position_tvs(marg, slack, round_tv)


def _complete_reference(
    todo: dict[int, tuple[np.ndarray, np.ndarray]],
    marg: np.ndarray,
    slack: np.ndarray,
    target: _Logits,
    params: Any,
    budget: int,
) -> None:
    """Complete the round-law differences ``todo`` by plain sampling, most weight first within
    ``budget`` contexts, into the marginals ``marg`` [n, V] and ``slack`` [n] (in place): the
    slow reference of ``_complete`` (numpy, every chunk's law copied to the host)."""
    import torch

    from spectest.sampling.params import SamplingTensors
    from spectest.sampling.transforms import logits_to_probs

    n = marg.shape[0]
    prm = SamplingTensors.from_params([params])
    spent = 0
    for length in range(1, n):
        if length not in todo:
            continue
        seqs, w = _merge(*todo.pop(length))
        order = np.lexsort((*seqs.T[::-1], -np.abs(w)))  # most weight first, ties by tokens
        seqs, w = seqs[order], w[order]
        k = min(len(w), max(0, budget - spent))
        slack[length:] += 0.5 * float(np.abs(w[k:]).sum())  # left out: at most |w|/2 each
        if k == 0:
            continue
        spent += k
        kids: list[tuple[np.ndarray, np.ndarray]] = []
        for a in range(0, k, FORWARD_ROWS):  # in chunks: [rows, V] float64 for a large V
            s_a, w_a = seqs[a : min(k, a + FORWARD_ROWS)], w[a : min(k, a + FORWARD_ROWS)]
            logits = target.many([tuple(r) for r in s_a.tolist()])  # [rows, V]
            rows_p = prm.index(torch.zeros(len(w_a), dtype=torch.int64))
            probs = logits_to_probs(logits, rows_p).numpy()  # [rows, V] the plain law
            marg[length] += w_a @ probs
            if length + 1 < n:
                rows, toks = np.nonzero(probs > 0.0)
                child = np.concatenate([s_a[rows], toks[:, None]], axis=1)  # [M, length + 1]
                kids.append((child, w_a[rows] * probs[rows, toks]))
        if kids:
            if length + 1 in todo:
                kids.insert(0, todo[length + 1])
            todo[length + 1] = (
                np.concatenate([c for c, _ in kids]),
                np.concatenate([cw for _, cw in kids]),
            )


def _complete(
    todo: dict[int, tuple[np.ndarray, np.ndarray]],
    marg: np.ndarray,
    slack: np.ndarray,
    target: _Logits,
    params: Any,
    budget: int,
    *,
    prefetch: bool = False,
) -> None:
    """``_complete_reference`` with the dense work on the model's device: the plain law of each
    chunk of contexts ``[rows, V]`` (float64), the marginals and the children's nonzeros stay
    there; per length one transfer of the children (tokens and weights, not ``[rows, V]``) and
    one of the marginals at the end. The bookkeeping over sequences (merge, order, budget,
    slack) is the reference's, in numpy on the host. ``prefetch``: the logits of all the
    contexts of a length come from one ``target.many`` call (``target.forward_rows`` rows per
    forward) instead of one call per chunk.

    Notes
    -----
    Equal to the reference bit for bit on CPU (the same float64 operations in the same order:
    the weighted sum of rows is numpy's there). On another device the plain law and the weighted
    sum of rows are that device's float64 (the law the sampler under test draws from there);
    ``tools/gpu/tooth_size_bench.sh`` reports the largest difference in TV from the reference.
    """
    import torch

    from spectest.sampling.params import SamplingTensors
    from spectest.sampling.transforms import logits_to_probs

    n = marg.shape[0]
    dev = torch.device(target.model.device)
    prm = SamplingTensors.from_params([params], device=dev)
    m = torch.from_numpy(marg).to(dev)  # [n, V] on the device (on CPU: marg itself)
    spent = 0
    for length in range(1, n):
        if length not in todo:
            continue
        seqs, w = _merge_fast(*todo.pop(length))  # in token order
        order = np.argsort(-np.abs(w), kind="stable")  # most weight first, ties by tokens
        seqs, w = seqs[order], w[order]
        k = min(len(w), max(0, budget - spent))
        slack[length:] += 0.5 * float(np.abs(w[k:]).sum())  # left out: at most |w|/2 each
        if k == 0:
            continue
        spent += k
        kids: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        ctxs = [tuple(r) for r in seqs[:k].tolist()] if prefetch else []
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
            m[length] += _weighted_rows(w_a, w_t, probs)
            if length + 1 < n:
                rows, toks = (probs > 0.0).nonzero(as_tuple=True)  # row-major, as numpy's
                kids.append((rows + a, toks, w_t[rows] * probs[rows, toks]))
        if kids:
            rows_k, toks_k, w_k = (torch.cat(x).cpu().numpy() for x in zip(*kids, strict=True))
            child = np.concatenate([seqs[rows_k], toks_k[:, None]], axis=1)  # [M, length + 1]
            parts = [(child, w_k)]
            if length + 1 in todo:
                parts.insert(0, todo[length + 1])
            todo[length + 1] = (
                np.concatenate([c for c, _ in parts]),
                np.concatenate([cw for _, cw in parts]),
            )
    marg[:] = m.cpu().numpy()


def _weighted_rows(w: np.ndarray, w_t: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``w @ probs`` ``[V]``: numpy's on CPU (the reference's bits), the device's elsewhere."""
    import torch

    if probs.device.type == "cpu":
        return torch.from_numpy(w @ probs.numpy())
    return w_t @ probs


def _round_marginals(
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


def _position_tvs(
    marg: np.ndarray, slack: np.ndarray, round_tv: float
) -> list[tuple[float, float]]:
    """``(tv, slack)`` per position from the signed marginals [n, V] and their slack [n]."""
    out = []
    for i in range(marg.shape[0]):
        known = 0.5 * float(np.abs(marg[i]).sum())
        # the round laws' own TV bounds every position's (completion only shrinks TV)
        tv = min(known + float(slack[i]), round_tv, 1.0)
        out.append((tv, max(0.0, tv - known) if slack[i] > 0.0 else 0.0))
    return out


def _merge(seqs: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per distinct sequence, its weights summed (exact zeros dropped)."""
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


def tooth_sizes(
    target: Any,
    draft: Any,
    prompts: Mapping[str, Sequence[int]],
    configs: Sequence[tuple[str, Any]],
    teeth: Sequence[tuple[str, str]],
    drafter: Any,
    positions: int,
    *,
    budget: int = DEFAULT_BUDGET,
    reference: bool = False,
    batched: bool | None = None,
) -> pd.DataFrame:
    """One row per tooth × prompt × config × position 0..min(K, positions - 1): the tooth's TV
    from plain sampling there (``SIZE_COLUMNS``; ``status`` exact / bound / unknown).

    ``teeth``: ``(arm name, variant spec)`` of the ε arms and mutants; ``configs``: ``(config_id,
    SamplingParams)``; ``drafter``: the run's ``DrafterSpec``; ``budget``: contexts per tooth and
    cell (docs/statistics.md "Tooth sizes: the method"). The models are the run's (the teeth's
    engine is ``builtin``). ``reference``: the slow reference (every batch prefills the prompt;
    ``cell_tvs``' host completion), equal bit for bit on CPU (tests/test_tooth_size_fast.py).
    ``batched`` (default: on an accelerator, not with ``reference``): forwards of
    ``DEVICE_FORWARD_ROWS`` contexts, all the contexts of a completion length fetched at once
    (and with ``AVOID_CUDNN_SDPA``, CUDA attention without cuDNN: ``_attention``); off,
    forwards of ``FORWARD_ROWS`` (the CPU path, whose bits tests/test_tooth_size_fast.py pins).

    Notes
    -----
    The batched path changes which contexts share a forward. On CPU in float32 that moves a
    TV by a last bit (3e-16 measured), hence not the CPU default. On the H200 in bf16 at
    Qwen3-0.6B shape its table was identical to the unbatched one (results/LOG.md, h55);
    ``AVOID_CUDNN_SDPA`` was faster still but moved TVs by up to 0.105 there (another
    attention kernel's bf16 rounding, amplified by the pair's logit scale), so it is off.
    """
    rows: list[dict[str, Any]] = []
    n = min(drafter.k + 1, positions)
    max_drafts = max(1, budget // (2 * drafter.k + 1))
    if batched is None:
        batched = not reference and _accelerated(target)
    kw: dict[str, Any] = {"keep_prompt": not reference}
    if batched:
        kw.update(rows=DEVICE_FORWARD_ROWS, attention=_attention(target))
    for pid, ids in prompts.items():
        t_logits, d_logits = _Logits(target, ids, **kw), _Logits(draft, ids, **kw)
        for cid, params in configs:
            exact: tuple[dict[tuple[int, ...], float], float] | None = None
            for arm, spec in teeth:
                tvs = [(float("nan"), float("nan"))] * n
                if budget > 0:
                    try:
                        if exact is None:
                            exact = _round("exact", t_logits, d_logits, params, drafter,
                                           max_drafts, budget * CELLS_PER_CONTEXT)  # fmt: skip
                        tvs = cell_tvs(spec, t_logits, d_logits, params, drafter, positions,
                                       budget=budget, exact_round=exact,
                                       reference=reference, batched=batched)  # fmt: skip
                    except NumericsError:
                        pass  # unknown: no round law within the budget's cells, or numerics
                for i, (tv, sl) in enumerate(tvs):
                    status = "unknown" if tv != tv else ("exact" if sl <= 1e-12 else "bound")
                    rows.append(
                        {
                            "arm": arm,
                            "variant": spec,
                            "prompt_id": pid,
                            "config_id": cid,
                            "position": i,
                            "tv": tv,
                            "slack": sl,
                            "status": status,
                        }
                    )
    return pd.DataFrame(rows, columns=list(SIZE_COLUMNS))


def _accelerated(model: Any) -> bool:
    import torch

    return torch.device(model.device).type != "cpu"


def _attention(model: Any) -> Any:
    """A context for the batched path's forwards: on CUDA with ``AVOID_CUDNN_SDPA``, SDPA by any
    backend but cuDNN's, which builds an execution plan per new shape (every prompt length and
    context length here is new); otherwise nothing (off by default: ``tooth_sizes``' Notes)."""
    import torch

    if not (AVOID_CUDNN_SDPA and torch.device(model.device).type == "cuda"):
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return lambda: sdpa_kernel(backends)
