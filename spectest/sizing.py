"""Sizing a protocol's run as it will be made (``RunSize``, ``size_protocol``): the cell family's
α, the cell-positions sharing it, the per-cell MDE or the seeds a target TV needs.

The why and the details: docs/internals.md "spectest/sizing.py".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from spectest.protocol import Protocol


@dataclass(frozen=True)
class RunSize:
    """What a protocol's cell family will test at: ``families`` (name → active), ``alpha_cells``
    (its share of ``alpha``), ``tests`` (cell-positions: prompts × configs × positions),
    ``alpha_each`` (the level a lone bad cell faces), ``df`` (bins − 1 assumed per cell).

    Notes
    -----
    Assumes every cell-position is testable and has ``df`` degrees of freedom; a real run's
    ``dof`` per cell is the data's (bins pooled to the minimum expected count, in
    tests.parquet), and its MDE is the median of the per-cell MDEs, so at the run's median
    ``dof`` the two agree (tests/test_sizing.py). The white-box family is counted active when
    ``tests.whitebox`` is on (the engines then supply p_t); the lengths family, which is active
    only when some cell's length table is testable (sequences that stop early), is not.
    """

    alpha: float
    families: dict[str, bool]
    alpha_cells: float
    tests: int
    alpha_each: float
    df: int
    power: float
    seeds_per_arm: int
    reference_ratio: float = 1.0  # reference seeds / candidate seeds (``reference_per_arm``)

    def mde_tv(self, seeds: int | None = None) -> float:
        """The per-cell MDE (TV) at ``seeds`` per arm (None: the protocol's)."""
        from spectest.stats.power import mde_tv

        n = self.seeds_per_arm if seeds is None else seeds
        return float(mde_tv(n * self.reference_ratio, n, self.df, self.alpha_each, self.power))

    def seeds_for(self, tv: float) -> int:
        """The fewest seeds per arm whose MDE is ≤ ``tv`` (the reference scaled alike)."""
        lo, hi = 1, 2
        while self.mde_tv(hi) > tv:
            lo, hi = hi, hi * 2
        while lo < hi:  # MDE decreases in the seeds
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self.mde_tv(mid) > tv else (lo, mid)
        return lo

    def lines(self) -> list[str]:
        act = [k for k, v in self.families.items() if v]
        return [
            f"α {self.alpha:g} split over {len(act)} active families ({', '.join(act)}): "
            f"cells get {self.alpha_cells:.4g}",
            f"{self.tests} cell-positions share it: the per-test level is {self.alpha_each:.3g} "
            f"(df {self.df} assumed per cell)",
        ]


def size_protocol(protocol: Protocol, *, df: int = 10, power: float | None = None) -> RunSize:
    """The size of ``protocol``'s run (``RunSize`` Notes for what is assumed)."""
    from spectest.stats.battery import split_alpha

    opts = protocol.tests
    pw = float(opts.power if power is None else power)
    families = {
        "cells": True,
        "trie": opts.trie_depth >= 1 and protocol.positions >= 2,
        "whitebox": bool(opts.whitebox),
        "sequence": bool(opts.sequence) and opts.null_permutations >= 1,
        "lengths": False,
    }
    a_cells = split_alpha(float(opts.alpha), families)["cells"]
    m = len(protocol.prompts.items) * len(protocol.configs) * int(protocol.positions)
    harmonic = float(np.sum(1.0 / np.arange(1, m + 1))) if m else 1.0
    a_each = a_cells / max(m, 1) / (harmonic if opts.multiplicity == "by" else 1.0)
    return RunSize(
        alpha=float(opts.alpha),
        families=families,
        alpha_cells=a_cells,
        tests=m,
        alpha_each=a_each,
        df=df,
        power=pw,
        seeds_per_arm=int(protocol.seeds.per_arm),
        reference_ratio=float(protocol.seeds.reference) / float(protocol.seeds.per_arm),
    )
