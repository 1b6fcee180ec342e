"""One arm compared with the reference, as the verdict sees it: ``Comparison`` (rejected or not,
failing cells most significant first, per-config numbers) with one ``FamilyScope`` per test family
(what it tested, its share of α, its MDE), and ``summarize_comparison``, which reads them from a
``spectest.stats.analyze.Analysis``; ``eps_cannot_bite`` says from an ε arm's rounds when that
tooth cannot differ from the exact sampler in the run at all.

Owns: which analysis fields make up a comparison, what counts as "tested" per family (a trie
chain on a handful of sequences does not), the human-readable failing lines. Does not know how
tests are computed (it reads the documented fields of ``Analysis``) nor how a decision is made
(``spectest.verdict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

FAMILY_LABELS = {
    "cells": "token χ² per cell-position",
    "trie": "prefix trie",
    "whitebox": "white-box",
    "lengths": "sequence lengths",
    "sequence": "sequence-level (pooled over cells)",
}


@dataclass(frozen=True)
class FamilyScope:
    """What one test family of one comparison actually tested, and at what resolution.

    ``alpha`` is the family's share of the run's α (0 when the family was not active); ``mde``
    the smallest effect one of its tests detects with the run's power at the per-test level a
    lone bad cell faces, in ``mde_unit`` (None where the family has no closed-form MDE).
    """

    name: str  # cells | trie | whitebox | sequence | lengths
    n_tested: int
    n_untestable: int
    alpha: float
    mde: float | None
    mde_unit: str
    rejected: bool

    @property
    def ran(self) -> bool:
        return self.n_tested > 0

    @property
    def label(self) -> str:
        return FAMILY_LABELS.get(self.name, self.name)


@dataclass(frozen=True)
class ConfigStats:
    """One sampling config of one comparison: what the summary table prints."""

    config_id: str
    cells_tested: int
    cells_untestable: int
    rejections: int  # after the multiplicity correction
    max_tv_excess: float | None  # max over cells/positions of plug-in TV minus its null mean
    max_tv_where: str | None  # "prompt_id@position" of that maximum
    mde_tv: float | None  # smallest TV detected with 80 % power (median over cells)


@dataclass(frozen=True)
class Comparison:
    """One arm compared with the reference."""

    arm: str
    role: str  # candidate | null | eps | mutant
    expect: str  # subject | pass | fail
    rejected: bool
    cells_tested: int
    rejections: int
    min_qvalue: float | None
    mde_tv: float | None
    failing: tuple[str, ...]  # human-readable failing cells / families, most significant first
    by_config: tuple[ConfigStats, ...] = field(default=())
    control_failed: bool = False  # a white-box test of the *reference* arm rejected
    cells_untestable: int = 0
    families: tuple[FamilyScope, ...] = field(default=())
    alpha: float | None = None
    power: float | None = None
    mde_tv_max: float | None = None
    cannot_bite: str | None = None  # why this tooth's law equals the exact one here (ε arms)
    # an ε arm's or mutant's size: its largest per-cell-position TV from plain sampling
    # (``spectest.tooth_size``; None: unknown), exact or an upper bound, and where it is
    size_tv: float | None = None
    size_exact: bool = False
    size_where: str | None = None

    @property
    def is_tooth(self) -> bool:
        return self.role in ("null", "eps", "mutant")

    @property
    def tested_anything(self) -> bool:
        """At least one family ran on enough data (without families: a cell was tested)."""
        if self.families:
            return any(f.ran for f in self.families)
        return self.cells_tested > 0


def _f(x: Any) -> float | None:
    """A finite float, or None (NaN / missing) — JSON-safe."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _families(analysis: Any) -> tuple[FamilyScope, ...]:
    """One ``FamilyScope`` per family ``analyze`` made active (cells always)."""
    trie, wb = analysis.trie, analysis.whitebox
    fams = [
        FamilyScope(
            "cells",
            int(analysis.n_tested),
            int(analysis.n_untestable),
            float(analysis.alpha_cells),
            _f(analysis.mde_tv),
            "TV per cell-position",
            bool(analysis.cells_rejected),
        )
    ]
    if analysis.alpha_trie > 0 and len(trie):
        # NOTE: a chain-rule G² is a permutation test, valid on any number of sequences, but on
        # a handful it cannot reach its level: it counts as tested when both arms have the
        # node rule's ``trie_min_count`` sequences in the cell (it still rejects if it can)
        least = np.minimum(trie["n_ref"].to_numpy(), trie["n_cand"].to_numpy())
        enough = (trie["kind"] != "chain").to_numpy() | (least >= analysis.options.trie_min_count)
        ok = (trie["status"] == "ok") & enough
        fams.append(
            FamilyScope(
                "trie",
                int(ok.sum()),
                int((~ok).sum()),
                float(analysis.alpha_trie),
                None,
                "",
                bool(analysis.trie_rejected),
            )
        )
    if analysis.alpha_whitebox > 0 and len(wb):
        cw = wb[wb["arm"] == analysis.candidate]
        ok = cw["pvalue"].astype(float).notna() | (cw["test"] == "support")
        fams.append(
            FamilyScope(
                "whitebox",
                int(ok.sum()),
                int((~ok).sum()),
                float(analysis.alpha_whitebox),
                _f(analysis.directed_z_mde),
                "excess mass on {q > p} per token (directed z)",
                bool(analysis.whitebox_rejected or analysis.support_violation),
            )
        )
    seq = getattr(analysis, "sequence", None)
    a_seq = float(getattr(analysis, "alpha_sequence", 0.0) or 0.0)
    if seq is not None and a_seq > 0 and len(seq):
        pooled = seq[seq["scope"] == "pooled"]
        finite = pooled["pvalue"].astype(float).notna()
        n_ok = int(finite.sum()) if _can_reach(seq, analysis.n_permutations, a_seq) else 0
        fams.append(
            FamilyScope(
                "sequence",
                n_ok,
                len(pooled) - n_ok,
                a_seq,
                _f(getattr(analysis, "sequence_mde", None)),
                str(getattr(analysis, "sequence_mde_unit", "") or ""),
                bool(getattr(analysis, "sequence_rejected", False)),
            )
        )
    ln = getattr(analysis, "lengths", None)
    if ln is not None and len(ln):
        ok = ln["status"] == "ok"
        mde = ln.loc[ok, "mde_tv"].astype(float).dropna()
        fams.append(
            FamilyScope(
                "lengths",
                int(ok.sum()),
                int((~ok).sum()),
                float(getattr(analysis, "alpha_lengths", 0.0)),
                _f(mde.median()) if len(mde) else None,
                "TV of the length law per cell",
                bool(getattr(analysis, "lengths_rejected", False)),
            )
        )
    return tuple(fams)


def _can_reach(seq: Any, n_permutations: int, alpha: float) -> bool:
    """Whether the sequence family's permutation p-value can reach its level at all: its smallest
    attainable value is 1/(B + 1), or 1/Π_c C(n_c, n_ref,c) when the cells have fewer distinct
    relabelings than that. At 2 + 2 sequences in one cell (6 relabelings) it cannot: such a
    family ran formally but tested nothing."""
    cells = seq[seq["scope"] == "cell"].drop_duplicates(["prompt_id", "config_id"])
    log_labelings = sum(
        math.lgamma(a + b + 1) - math.lgamma(a + 1) - math.lgamma(b + 1)
        for a, b in zip(cells["n_ref"].astype(int), cells["n_cand"].astype(int), strict=True)
    )
    smallest = max(1.0 / (n_permutations + 1), math.exp(-min(log_labelings, 700.0)))
    return smallest <= alpha


def summarize_comparison(
    analysis: Any,
    *,
    arm: str,
    role: str,
    expect: str,
    cannot_bite: str | None = None,
    size: Any = None,
) -> Comparison:
    """Read one ``spectest.stats.analyze.Analysis`` into a ``Comparison``.

    Uses only the documented fields: ``rejected``, ``n_tested``, ``n_rejected``, ``mde_tv``,
    ``support_violation``, ``whitebox_control_failed`` and the tidy tables ``cells`` (status,
    reject, p_adj, tv_excess, mde_tv per prompt × config × position), ``trie`` (reject, p_adj
    per node) and ``whitebox`` (arm, test, reject, p_adj). ``rejections`` counts every rejected
    test of every family (cells, trie rows, the candidate's white-box tests, length tables).
    ``lengths`` / ``alpha_lengths`` / ``lengths_rejected`` (``spectest.stats.lengths``) are read
    when present. ``size``: the tooth's ``spectest.tooth_size.ToothSize`` (ε arms and mutants).
    """
    cells = analysis.cells
    trie = analysis.trie
    wb = analysis.whitebox
    cand_name = analysis.candidate
    failing: list[tuple[float, str]] = []
    if len(cells):
        rej = cells[cells["reject"].astype(bool)]
        for r in rej.itertuples(index=False):
            failing.append(
                (
                    float(r.p_adj),
                    f"{r.prompt_id}/{r.config_id}@{int(r.position)} p_adj={float(r.p_adj):.3g} "
                    f"TV={float(r.tv):.3f} (null mean {float(r.tv_null_mean):.3f})",
                )
            )
    trie_rej = trie[trie["reject"].astype(bool)] if len(trie) else trie
    for r in trie_rej.itertuples(index=False) if len(trie_rej) else ():
        failing.append(
            (
                float(r.p_adj),
                f"trie {r.prompt_id}/{r.config_id} {r.kind} depth {r.depth} prefix [{r.prefix}] "
                f"p_adj={float(r.p_adj):.3g}",
            )
        )
    wb_rej = wb[(wb["arm"] == cand_name) & wb["reject"].astype(bool)] if len(wb) else wb
    for r in wb_rej.itertuples(index=False) if len(wb_rej) else ():
        if r.test == "support":
            what = f"{int(r.statistic)} emitted token(s) with target probability 0"
        else:
            what = f"p_adj={float(r.p_adj):.3g} ({r.detail})"
        failing.append((float(r.p_adj), f"white-box {r.test}: {what}"))
    ln = getattr(analysis, "lengths", None)
    len_rej = ln[ln["reject"].astype(bool)] if ln is not None and len(ln) else None
    for r in len_rej.itertuples(index=False) if len_rej is not None else ():
        failing.append(
            (
                float(r.p_adj),
                f"sequence lengths {r.prompt_id}/{r.config_id} p_adj={float(r.p_adj):.3g}: "
                f"mean length {float(r.mean_len_ref):.2f} (reference) vs "
                f"{float(r.mean_len_cand):.2f} (candidate); short sequences "
                f"{int(r.short_ref)}/{int(r.n_ref)} vs {int(r.short_cand)}/{int(r.n_cand)}",
            )
        )
    seq = getattr(analysis, "sequence", None)
    seq_rej = (
        seq[(seq["scope"] == "pooled") & seq["reject"].astype(bool)]
        if seq is not None and len(seq)
        else None
    )
    for r in seq_rej.itertuples(index=False) if seq_rej is not None else ():
        failing.append(
            (
                float(r.p_adj),
                f"sequence-level {r.test} (pooled over cells) p_adj={float(r.p_adj):.3g} "
                f"z={float(r.z):.2f}",
            )
        )
    failing.sort(key=lambda t: t[0])
    by_config = []
    if len(cells):
        for cid, g in cells.groupby("config_id", sort=False):
            ok = g["status"] == "ok"
            exc = g["tv_excess"].astype(float)
            where = None
            max_exc = None
            if exc.notna().any():
                i = exc.idxmax()
                max_exc = _f(exc.loc[i])
                where = f"{g.loc[i, 'prompt_id']}@{int(g.loc[i, 'position'])}"
            n_trie = int(trie_rej["config_id"].eq(cid).sum()) if len(trie_rej) else 0
            if len_rej is not None:
                n_trie += int(len_rej["config_id"].eq(cid).sum())
            mde = g.loc[ok, "mde_tv"].astype(float).dropna()
            by_config.append(
                ConfigStats(
                    config_id=str(cid),
                    cells_tested=int(ok.sum()),
                    cells_untestable=int((~ok).sum()),
                    rejections=int(g["reject"].astype(bool).sum()) + n_trie,
                    max_tv_excess=max_exc,
                    max_tv_where=where,
                    mde_tv=_f(mde.median()) if len(mde) else None,
                )
            )
    p_adj = cells["p_adj"].astype(float) if len(cells) else None
    return Comparison(
        arm=arm,
        role=role,
        expect=expect,
        rejected=bool(analysis.rejected),
        cells_tested=int(analysis.n_tested),
        rejections=int(analysis.n_rejected)
        + len(trie_rej)
        + len(wb_rej)
        + (len(len_rej) if len_rej is not None else 0)
        + (len(seq_rej) if seq_rej is not None else 0),
        min_qvalue=_f(p_adj.min()) if p_adj is not None and p_adj.notna().any() else None,
        mde_tv=_f(analysis.mde_tv),
        failing=tuple(f for _, f in failing),
        by_config=tuple(by_config),
        control_failed=bool(analysis.whitebox_control_failed),
        cells_untestable=int(analysis.n_untestable),
        families=_families(analysis),
        alpha=float(analysis.options.alpha),
        power=float(analysis.options.power),
        mde_tv_max=_f(analysis.mde_tv_max),
        cannot_bite=cannot_bite,
        size_tv=None if size is None else size.tv,
        size_exact=False if size is None else bool(size.exact),
        size_where=None if size is None else size.where,
    )


def eps_cannot_bite(eps: float, rounds: pd.DataFrame | None) -> str | None:
    """Why an ε arm (accept with min(1, (1 + ε) p/q)) cannot differ from the exact sampler in
    this run, read from its own rounds; ``None`` when it can (or no rounds were recorded).

    Notes
    -----
    Couple the ε acceptor and the exact one through the same uniforms. At a drafted token with
    ratio r = p(x)/q(x) the exact sampler accepts iff u ≤ min(1, r) and the ε one iff
    u ≤ min(1, (1 + ε) r); for ε > 0 the second set contains the first, so the coupled
    sequences differ only where the ε arm accepts a token the exact sampler rejects. If the ε
    arm accepted no drafted token in any of the S sequences of a cell, then P(an ε sequence of
    that cell accepts anything) ≤ 1 − 0.05^(1/S) ≈ 3/S (95 %, exact binomial bound), hence its
    sequence law is within that TV of the exact sampler's: the tooth has nothing to bite —
    typically a one-hot drafter whose every proposal the target gives p = 0 ((1 + ε)·0 = 0),
    e.g. a random-init draft at a real vocabulary. Not killing it then says nothing about the
    tests' power. For ε ≤ 0 (the ε acceptor accepts less) or any accepted token no such claim
    is made.
    """
    if eps <= 0.0 or rounds is None or not len(rounds):
        return None
    if int(rounds["accepted"].sum()) > 0:
        return None
    drafted = int(rounds["drafted"].sum())
    per_cell = rounds.groupby(["prompt_id", "config_id"], sort=False)["seed"].nunique()
    n_seq, s_min = int(per_cell.sum()), int(per_cell.min())
    bound = 1.0 - 0.05 ** (1.0 / s_min)  # exact one-sided 95 % bound for 0 of s_min
    return (
        f"its arm accepted 0 of {drafted} drafted tokens in {n_seq} sequences: the target gives "
        f"the drafted tokens p ≈ 0, where (1 + ε)·p changes nothing, so in this run the "
        f"ε-biased acceptor's sequence law is within TV {bound:.2g} of the exact sampler's in "
        f"every cell (95 % each): the tooth cannot show the tests' power"
    )
