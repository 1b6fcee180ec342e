"""The statistics entry point: samples of two arms → ``Analysis`` (one ``FamilyResult`` per test
family, plus the run-level decision).

Owns: the registry of test families (``FAMILIES``: the six built-in ones, in the α split's
order), the split of the run's α over the active families (``split_alpha``), ``analyze`` (encode
the two arms, draw the shared relabelings, ask each family whether it is active, split α, run
each) and ``Analysis`` with its documented decision rule ``rejected``. The options are
``spectest.stats.options``' (re-exported here); what a family is, ``spectest.stats.families``.

Does not know: files, protocols, teeth arms (``spectest.verdict`` combines several analyses),
torch, any particular statistic: the families own theirs, and this module adds none.
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
from spectest.stats.family_lengths import LengthsFamily
from spectest.stats.family_reported import ReportedFamily
from spectest.stats.family_rounds import RoundsFamily
from spectest.stats.family_sequence import ALL_CELLS, SEQUENCE_COLUMNS, SequenceFamily
from spectest.stats.family_trie import TRIE_COLUMNS, TrieFamily
from spectest.stats.family_whitebox import REFERENCE_MULTIPLIER, WhiteboxFamily, WhiteboxResult
from spectest.stats.histograms import encode_samples
from spectest.stats.options import (
    ALPHA_MAX,
    MIN_EXPECTED_MAX,
    MULTIPLICITY,
    NULL_PERMUTATIONS_MAX,
    SEQUENCE_DEFAULT,
    TRIE_DEPTH_MAX,
    WHITEBOX_MODES,
    AnalysisOptions,
    OptionError,
)

__all__ = [
    "ALL_CELLS",
    "ALPHA_MAX",
    "CELL_COLUMNS",
    "FAMILIES",
    "MIN_EXPECTED_MAX",
    "MULTIPLICITY",
    "NULL_PERMUTATIONS_MAX",
    "REFERENCE_MULTIPLIER",
    "SEQUENCE_COLUMNS",
    "SEQUENCE_DEFAULT",
    "TRIE_COLUMNS",
    "TRIE_DEPTH_MAX",
    "WHITEBOX_MODES",
    "Analysis",
    "AnalysisOptions",
    "OptionError",
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
    run-level numbers.

    Decision rule (``rejected``): the candidate's law differs from the reference's when ANY
    family rejects at its share of α:
      1. cells — a cell-position is rejected after the ``options.multiplicity`` correction;
      2. trie — a trie row is rejected (node χ² and per-cell chain-rule G², one family corrected
         by BH — BY when ``multiplicity`` is 'by' or 'maxT');
      3. whitebox — a white-box test of the candidate arm is rejected after a weighted
         Bonferroni over that arm's white-box tests (``whitebox.WHITEBOX_WEIGHTS``), or
      4. the candidate emitted a token with target probability 0 (``support_violation``, a
         rejection of that family outside its α split);
      5. sequence — the sequence family's max-T over its pooled statistics is significant
         (rows of its table with scope "pooled");
      6. lengths — a cell's sequence-length distribution differs (``spectest.stats.lengths``,
         BH): sequences that stop early are a different law, not "untestable";
      7. rounds — where both arms report rounds, a (cell, stratum) law conditional on the
         reported round structure differs (``spectest.stats.rounds``, step-down max-T; it only
         adds rejections: ``FamilyResult.claims``);
      8. reported — where the candidate engine reports its tokens' probabilities, support and
         PIT conditional on the reported law, and the approximate cross-check with the teacher
         (``spectest.stats.family_reported``).
    The run-level α is split equally over the active families (``split_alpha``: cells always;
    trie when ``trie_depth >= 1`` and there are >= 2 positions; white-box when its columns are
    present; sequence when ``options.sequence`` and ``null_permutations >= 1``; lengths when some
    cell's length table is testable — ``lengths`` module docstring; rounds when both arms report
    rounds and a stratum is testable), so under H0
    P(rejected) ≤ α by the union bound: each procedure bounds its family's P(any rejection)
    under the global null (FDR = FWER there; the sequence family is an exact permutation test
    whatever the dependence between positions, ``spectest.stats.sequence``). A rejected
    white-box test of the *reference* arm means spectest's own p_t is wrong:
    ``control_failed`` (the verdict should then not trust the white-box family).
    Untestable cells are counted, never passed.

    White-box mode 'teacher' (``AnalysisOptions.whitebox_mode``; ``stats.whitebox_two_sample``):
    rule 3 uses the candidate's two-sample tests against the reference (weighted Bonferroni over
    them, ``whitebox_two_sample.TEACHER_WEIGHTS``), rule 4 does not apply (a teacher-forced p = 0
    can be numerics: ``support_2s`` is one of the two-sample tests), and ``control_failed``
    means the reference arm's tolerance control rejected: its teacher is farther from the
    sampled law than ``whitebox_tolerance``.

    MDE (``mde_tv``, the verdict's power claim): each tested cell's ``mde_tv`` is the binned-law
    TV its pooled χ² detects with ``options.power`` at the per-test level a lone bad cell faces
    — α_cells/m for BH and max-T, α_cells/(m·Σ_{i≤m} 1/i) for BY (m tested cells); ``mde_tv``
    is their median, ``mde_tv_max`` the worst. Each other family states its own resolution in
    its own unit (``FamilyResult.resolution``). Testability at real vocabularies (how many seeds
    would make a share of cell-positions testable): ``cell_family.testability``.
    """

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
    Per cell (prompt, config) the B relabelings move whole sequences between the arms (sizes
    kept); one label matrix is shared by the cells with equal arm sizes (``tables.label_matrix``
    NOTE). The same relabelings serve the TV null, max-T, permutation p-values, the chain G²
    and the sequence family. Cost: one sparse product per cell, O(tokens × B); singletons
    merged (``tables``). Verified: type-I rate within 3σ of α per family and run-level
    P(rejected) ≤ α + 3σ on simulated H0 data; power against the ε-biased acceptor as the MDE
    predicts (tests/test_stats_analyze.py, tests/test_stats_calibration.py).
    """
    opts = options if options is not None else AnalysisOptions()
    if not isinstance(opts, AnalysisOptions):
        raise ConfigError(f"options must be an AnalysisOptions, got {type(opts).__name__!r}")
    if reference == candidate:
        raise ConfigError(f"reference and candidate arms must differ, got {reference!r} twice")
    fams = FAMILIES if families is None else tuple(families)
    names = [f.name for f in fams]
    if "cells" not in names or len(set(names)) != len(names):
        raise ConfigError(f"families: need one 'cells' family and distinct names, got {names!r}")
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
