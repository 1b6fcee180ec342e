"""The statistics entry point: samples of two arms → ``Analysis`` (one ``FamilyResult`` per test
family, plus the run-level decision ``Analysis.rejected``).

Owns the family registry (``FAMILIES``, in the α split's order), ``split_alpha`` and ``analyze``.
Adds no statistic of its own; knows no files, protocols, teeth or torch. docs/families.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from spectest.errors import ConfigError
from spectest.stats.families import (
    Family,
    FamilyInputs,
    FamilyResult,
    notes_of,
    relabelings,
)
from spectest.stats.family_cells import CELL_COLUMNS, CellFamily, CellsResult
from spectest.stats.family_sequence import SEQUENCE_COLUMNS, SequenceFamily
from spectest.stats.family_whitebox import WhiteboxFamily, WhiteboxResult
from spectest.stats.histograms import encode_samples
from spectest.stats.lengths import LengthsFamily
from spectest.stats.options import MULTIPLICITY, AnalysisOptions
from spectest.stats.reported_p import ReportedFamily
from spectest.stats.rounds import RoundsFamily
from spectest.stats.trie import TRIE_COLUMNS, TrieFamily

__all__ = [
    "CELL_COLUMNS",
    "FAMILIES",
    "MULTIPLICITY",
    "SEQUENCE_COLUMNS",
    "TRIE_COLUMNS",
    "Analysis",
    "AnalysisOptions",
    "analyze",
    "split_alpha",
]

# The registry: every test family an analysis runs, in the α split's order (which is also the
# order in which comparisons, verdicts and reports list them). A new family is one class
# (``spectest.stats.families.Family``) and one entry here.
FAMILIES: tuple[Family, ...] = (
    CellFamily(),
    TrieFamily(),
    WhiteboxFamily(),
    SequenceFamily(),
    LengthsFamily(),
    RoundsFamily(),
    ReportedFamily(),
)


@dataclass(frozen=True)
class Analysis:
    """Everything ``analyze`` found: one ``FamilyResult`` per registered family (``families``,
    in registry order; a family that was not active has α 0 and tested nothing) and the
    run-level numbers. ``rejected`` when any family rejects at its share of α: the decision
    rule, the α split and the MDE are in docs/families.md ("How one analysis decides")."""

    reference: str
    candidate: str
    options: AnalysisOptions
    families: Mapping[str, FamilyResult]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def rejected(self) -> bool:
        return any(f.rejected for f in self.families.values())

    def table(self, name: str) -> pd.DataFrame:
        """Family ``name``'s tidy table."""
        return self.families[name].table

    @property
    def cell_family(self) -> CellsResult:
        """The token χ² per cell-position family, whose resolution is the verdict's MDE."""
        r = self.families["cells"]
        assert isinstance(r, CellsResult), type(r)
        return r

    @property
    def n_tested(self) -> int:
        """Cell-positions tested."""
        return self.cell_family.n_tested

    @property
    def n_untestable(self) -> int:
        return self.cell_family.n_untestable

    @property
    def mde_tv(self) -> float:
        """Median over tested cell-positions of the per-cell MDE in TV (NaN: none tested)."""
        return self.cell_family.resolution

    @property
    def mde_tv_max(self) -> float:
        return self.cell_family.mde_tv_max

    @property
    def whitebox(self) -> pd.DataFrame:
        """(Read by tests/test_engine_hf.py.) The white-box family's table."""
        return self.table("whitebox")

    @property
    def max_tv_excess(self) -> float:
        """(Read by tests/test_engine_hf.py.) The largest plug-in TV minus its null mean."""
        return self.cell_family.max_tv_excess

    @property
    def support_violation(self) -> bool:
        """The candidate emitted a token with target probability 0 (exact white-box mode)."""
        wb = self.families.get("whitebox")
        return isinstance(wb, WhiteboxResult) and wb.support_violation

    @property
    def control_failed(self) -> bool:
        """A family's control on the reference arm rejected (today: the white-box tests of the
        plain arm against spectest's own p_t)."""
        return any(f.control_failed for f in self.families.values())

    @property
    def whitebox_control_failed(self) -> bool:
        """(Read by tests/test_engine_hf.py and the calibration tests.) The white-box control."""
        wb = self.families.get("whitebox")
        return wb is not None and wb.control_failed

    def summary(self) -> dict[str, Any]:
        """The run-level numbers as a JSON-ready dict (no DataFrames): summary.json's
        ``details`` — each family's ``alpha_<name>``, ``<name>_rejected`` and own numbers."""
        out: dict[str, Any] = {
            "reference": self.reference,
            "candidate": self.candidate,
            "rejected": self.rejected,
        }
        for f in self.families.values():
            out.update(f.summary())
        out["n_permutations"] = self.options.null_permutations
        out["whitebox_mode"] = self.options.whitebox_mode
        out["notes"] = list(self.notes)
        out["options"] = asdict(self.options)
        return out


def split_alpha(alpha: float, active: dict[str, bool]) -> dict[str, float]:
    """The run's α split equally over the active families (0 for an inactive one): the union
    bound over families keeps P(any family rejects | H0) ≤ α (``Analysis``)."""
    n = sum(bool(v) for v in active.values())
    return {k: (alpha / max(n, 1) if v else 0.0) for k, v in active.items()}


def _registry(families: Sequence[Family] | None) -> tuple[Family, ...]:
    """The families to run (None: ``FAMILIES``, read at call time); ``ConfigError`` unless
    their names are distinct and one is "cells"."""
    fams = FAMILIES if families is None else tuple(families)
    names = [f.name for f in fams]
    if "cells" not in names or len(set(names)) != len(names):
        raise ConfigError(f"families: need one 'cells' family and distinct names, got {names!r}")
    return fams


def analyze(
    samples: pd.DataFrame,
    *,
    reference: str,
    candidate: str,
    options: AnalysisOptions | None = None,
    rounds: pd.DataFrame | None = None,
    rng_seed: int = 0,
    families: Sequence[Family] | None = None,
    executor: Executor | None = None,
    all_rounds: pd.DataFrame | None = None,
) -> Analysis:
    """Test whether arm ``candidate`` has the law of arm ``reference``, cell by cell.

    Parameters
    ----------
    samples : the long samples table (``spectest.schema``), optional wb_* columns.
    reference, candidate : arm names (other arms in the table are ignored).
    options : ``AnalysisOptions`` (defaults if None).
    rounds : the rounds table, for the white-box acceptance test (optional).
    rng_seed : seeds the permutations and the PIT's uniforms (``numpy.random.SeedSequence``).
    families : the test families to run (None: the registry ``FAMILIES``, read at call time);
        the cell-position family ("cells"), whose MDE is the verdict's, must be one of them.
    executor : spreads the sequence family's per-cell permutation statistics over processes
        (``FamilyInputs.map_cells``); None: this process. The relabelings are drawn here, once,
        from ``rng_seed``, so the result is identical either way.
    all_rounds : every arm's rounds, readouts included (None: ``rounds``): the reported-p
        family's round slots read an engine's own telemetry that no other family tests.

    Notes
    -----
    The B relabelings move whole sequences between the arms within a cell, sizes kept, and are
    shared by every family that permutes (``FamilyInputs``). Type-I rate within 3σ of α per
    family and run-level P(rejected) ≤ α + 3σ on simulated H0 data
    (tests/test_stats_analyze.py, tests/test_stats_calibration.py).
    """
    opts = options if options is not None else AnalysisOptions()
    if not isinstance(opts, AnalysisOptions):
        raise ConfigError(f"options must be an AnalysisOptions, got {type(opts).__name__!r}")
    if reference == candidate:
        raise ConfigError(f"reference and candidate arms must differ, got {reference!r} twice")
    fams = _registry(families)
    enc = encode_samples(samples, (reference, candidate))
    perm_seq, pit_seq = np.random.SeedSequence(int(rng_seed)).spawn(2)
    inputs = FamilyInputs(
        samples=samples,
        enc=enc,
        options=opts,
        reference=reference,
        candidate=candidate,
        rounds=rounds,
        labels=relabelings(enc, opts.null_permutations, np.random.default_rng(perm_seq)),
        pit_rng=np.random.default_rng(pit_seq),
        executor=executor,
        all_rounds=rounds if all_rounds is None else all_rounds,
    )
    alphas = split_alpha(opts.alpha, {f.name: f.active(inputs) for f in fams})
    results = {f.name: f.run(inputs, alphas[f.name]) for f in fams}
    return Analysis(reference, candidate, opts, results, notes_of(results))
