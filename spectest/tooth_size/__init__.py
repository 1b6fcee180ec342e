"""The size of a tooth: the per-cell-position TV between an ε arm's or mutant's law and the
plain law (``tooth_sizes``), and a tooth's size (``size_of``). Knows nothing about statistics,
verdicts or files. The method: docs/statistics.md "Tooth sizes: the method"; the details:
docs/internals.md "spectest/tooth_size/__init__.py".
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from spectest.errors import NumericsError
from spectest.tooth_size.completion import (
    complete,
    position_tvs,
    round_marginals,
)
from spectest.tooth_size.logits import FORWARD_ROWS, ContextLogits

__all__ = [
    "CELLS_PER_CONTEXT",
    "DEFAULT_BUDGET",
    "FORWARD_ROWS",
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
DEVICE_FORWARD_ROWS = 1024  # rows per batched forward on an accelerator (the batched path)
AVOID_CUDNN_SDPA = False  # True: the batched path's CUDA forwards skip cuDNN attention
# prompts at once on an accelerator (threads): the phase is host-bound (Python, launches, the
# round laws in host torch), so one prompt's host work overlaps another's GPU and torch work
PROMPT_THREADS = 4
SIZE_COLUMNS = (
    "arm",
    "variant",
    "prompt_id",
    "config_id",
    "position",
    "tv",
    "slack",
    "status",
)


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


@dataclass(frozen=True)
class _Cell:
    """One cell's round-law inputs: the models' logits at the prompt, the sampling settings, the
    run's ``DrafterSpec`` and the budget (contexts per tooth)."""

    target: ContextLogits
    draft: ContextLogits
    params: Any
    drafter: Any
    budget: int

    def round(self, spec: str) -> tuple[dict[Any, float], float]:
        """The exact law of one round of ``spec`` at the prompt and the probability mass of the
        draft sequences left out of it: a one-hot drafter has one sequence (none left out); a
        sampled drafter's are taken most probable first, at most one per ``2K + 1`` contexts of
        the budget and as many as fit in ``budget × CELLS_PER_CONTEXT`` quadrature cells (the
        law is then a sub-measure). Raises ``GridTooLarge`` when not even the first draft fits,
        ``NumericsError`` when the law cannot be computed."""
        from spectest.sampling import exact_law
        from spectest.sampling.mutants import get_variant

        variant = get_variant(spec)
        d = self.drafter
        max_drafts = max(1, self.budget // (2 * d.k + 1))  # each costs 2K + 1 contexts at most
        drafts, missing = exact_law.draft_tree(
            variant,
            self.draft.many,
            self.params,
            d.k,
            onehot=d.onehot,
            q_mode=d.q_mode,
            max_drafts=None if d.onehot else max_drafts,
        )
        ranked = sorted(drafts, key=lambda x: -x[1])
        law, left_out = self._in_chunks(variant, spec, ranked, self.budget * CELLS_PER_CONTEXT)
        return law, missing + left_out

    def _in_chunks(
        self, variant: Any, spec: str, drafts: list[Any], max_cells: int
    ) -> tuple[dict[Any, float], float]:
        """``round``'s law over ``drafts`` (most probable first), ``DRAFT_CHUNK`` drafts a call,
        halved down to one when a chunk's grid is too large; the mass of the drafts that did not
        fit in ``max_cells`` is returned beside it (``GridTooLarge`` when not even the first one
        fits)."""
        from spectest.sampling import exact_law

        K, target = self.drafter.k, self.target
        law: dict[tuple[int, ...], float] = {}
        left, a, chunk_n = max_cells, 0, DRAFT_CHUNK
        while a < len(drafts):
            chunk = drafts[a : a + chunk_n]
            target.fill([d[0][:j] for d in chunk for j in range(K + 1)])
            stats: dict[str, int] = {}
            try:
                part = exact_law.round_law(
                    variant,
                    target.get,
                    self.draft.get,
                    self.params,
                    K,
                    onehot=self.drafter.onehot,
                    q_mode=self.drafter.q_mode,
                    extra_accept_breaks=exact_law.known_accept_breaks(spec),
                    drafts=chunk,
                    max_cells=left,
                    compact=True,
                    stats=stats,
                    max_rows=MAX_ROWS,
                )
            except exact_law.GridTooLarge:
                if len(chunk) > 1:  # fewer drafts at a time, down to one
                    chunk_n = max(1, len(chunk) // 2)
                    continue
                if a == 0:
                    raise
                return law, sum(d[1] for d in drafts[a:])
            left -= stats["cells"]
            a += len(chunk)
            for seq, w in part.items():
                law[seq] = law.get(seq, 0.0) + w
        return law, 0.0


def cell_tvs(
    cell: _Cell,
    spec: str,
    exact_round: tuple[dict[tuple[int, ...], float], float],
    n: int,
    *,
    reference: bool = False,
    batched: bool = False,
) -> list[tuple[float, float]]:
    """``(tv, slack)`` for positions 0..n-1 of one cell: the TV of the marginal at each position
    between the tooth ``spec``'s law (first round, completed by plain sampling) and the plain
    law, an upper bound with ``slack`` added (docs/statistics.md "Tooth sizes: the method").
    ``exact_round``: the exact sampler's ``_Cell.round`` at this cell (the same for every tooth).
    Raises ``NumericsError`` when a round law cannot be computed. ``reference`` and ``batched``:
    ``completion.complete``'s ``reference`` and ``prefetch``."""
    (r_t, m_t), (r_e, m_e) = cell.round(spec), exact_round
    diff = {s: r_t.get(s, 0.0) - r_e.get(s, 0.0) for s in set(r_t) | set(r_e)}
    base = 0.5 * (m_t + m_e)  # draft sequences left out: at most their mass, per position
    base += 0.5 * sum(abs(w) for w in diff.values() if abs(w) < DROP)
    delta = {s: w for s, w in diff.items() if abs(w) >= DROP}
    round_tv = 0.5 * sum(abs(w) for w in delta.values()) + base  # bounds every position
    target = cell.target
    marg = np.zeros((n, int(target.get(()).shape[-1])))  # the signed marginal at each position
    slack = np.full(n, base)
    todo = round_marginals(delta, marg)
    complete(
        todo, marg, slack, target, cell.params, cell.budget, reference=reference, prefetch=batched
    )
    return position_tvs(marg, slack, round_tv)


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
    threads: int | None = None,
) -> pd.DataFrame:
    """One row per tooth × prompt × config × position 0..min(K, positions - 1): the tooth's TV
    from plain sampling there (``SIZE_COLUMNS``; ``status`` exact / bound / unknown).

    ``teeth``: ``(arm name, variant spec)`` of the ε arms and mutants; ``configs``: ``(config_id,
    SamplingParams)``; ``drafter``: the run's ``DrafterSpec``; ``budget``: contexts per tooth and
    cell. The models are the run's (the teeth's engine is ``builtin``). ``reference``: the slow
    reference (every batch prefills the prompt; the host completion), equal bit for bit on CPU.
    ``batched`` (default: on an accelerator, not with ``reference``): forwards of
    ``DEVICE_FORWARD_ROWS`` contexts, a completion length fetched at once. ``threads`` (default:
    ``PROMPT_THREADS`` on an accelerator, not with ``reference``; else 1): prompts at once, one
    thread each, the table in prompt order. Why: docs/tooth_size_speed.md.
    """
    n = min(drafter.k + 1, positions)
    if batched is None:
        batched = not reference and _accelerated(target)
    kw: dict[str, Any] = {"keep_prompt": not reference}
    if batched:
        kw.update(rows=DEVICE_FORWARD_ROWS, attention=_attention(target))
    size = partial(cell_tvs, n=n, reference=reference, batched=batched)

    def one_prompt(pid: str, ids: Sequence[int]) -> list[dict[str, Any]]:
        t_logits, d_logits = ContextLogits(target, ids, **kw), ContextLogits(draft, ids, **kw)
        cells = [(cid, _Cell(t_logits, d_logits, prm, drafter, budget)) for cid, prm in configs]
        return _prompt_rows(pid, cells, teeth, n, size)

    if threads is None:
        threads = PROMPT_THREADS if _accelerated(target) and not reference else 1
    per_prompt = _map(one_prompt, list(prompts.items()), threads)
    rows = [r for part in per_prompt for r in part]  # prompt order, whatever the threads
    return pd.DataFrame(rows, columns=list(SIZE_COLUMNS))


def _prompt_rows(
    pid: str, cells: list[tuple[str, _Cell]], teeth: Sequence[tuple[str, str]], n: int, size: Any
) -> list[dict[str, Any]]:
    """One prompt's ``SIZE_COLUMNS`` rows: every config's cell, every tooth (``size``:
    ``cell_tvs`` bound to the run), the exact sampler's round computed once per cell."""
    rows: list[dict[str, Any]] = []
    for cid, cell in cells:
        exact: tuple[dict[tuple[int, ...], float], float] | None = None
        for arm, spec in teeth:
            tvs = [(float("nan"), float("nan"))] * n
            if cell.budget > 0:
                try:
                    exact = exact or cell.round("exact")
                    tvs = size(cell, spec, exact)
                except NumericsError:
                    pass  # unknown: no round law within the budget's cells, or numerics
            rows += _size_rows(arm, spec, pid, cid, tvs)
    return rows


def _map(fn: Any, items: list[tuple[str, Sequence[int]]], threads: int) -> list[Any]:
    """``fn(*item)`` for every item, in order: in turn, or on ``threads`` threads at once (each
    prompt's work is independent; results are gathered in the items' order)."""
    if threads <= 1 or len(items) <= 1:
        return [fn(*item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(lambda item: fn(*item), items))


def _size_rows(
    arm: str, spec: str, pid: str, cid: str, tvs: list[tuple[float, float]]
) -> list[dict[str, Any]]:
    """The ``SIZE_COLUMNS`` rows of one tooth at one cell, a row per position (``status``:
    unknown for NaN, exact when its slack is 0, else a bound)."""
    keys = {"arm": arm, "variant": spec, "prompt_id": pid, "config_id": cid}
    return [
        {**keys, "position": i, "tv": tv, "slack": sl, "status": _status(tv, sl)}
        for i, (tv, sl) in enumerate(tvs)
    ]


def _status(tv: float, slack: float) -> str:
    return "unknown" if tv != tv else ("exact" if slack <= 1e-12 else "bound")


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
