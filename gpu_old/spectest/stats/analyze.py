"""The statistics entry point: samples of two arms → ``Analysis`` (tidy DataFrames + a decision).

Owns: ``AnalysisOptions`` (frozen, validated), ``analyze`` (per cell-position pooled χ²,
multiplicity, TV against its permutation null, MDE; prefix-trie node χ² and chain-rule G²;
white-box tests on both arms; the sequence-level family of ``spectest.stats.sequence``), the
split of the run's α over the active families (``split_alpha``) and ``Analysis`` with its
documented decision rule ``rejected``.

Does not know: files, protocols, teeth arms (``spectest.verdict`` combines several analyses),
torch. It calls the other ``spectest.stats`` modules and adds no statistic of its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from spectest import schema as sc
from spectest.errors import ConfigError
from spectest.stats import (
    distance,
    homogeneity,
    lengths,
    multiplicity,
    power,
    sequence,
    tables,
    trie,
    whitebox,
    whitebox_teacher,
)
from spectest.stats.histograms import encode_samples, format_prefix

MULTIPLICITY = ("bh", "by", "maxT")
WHITEBOX_MODES = ("exact", "teacher")
CELL_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    sc.POSITION,
    "statistic",
    "pvalue",
    "p_adj",
    "reject",
    "dof",
    "n_ref",
    "n_cand",
    "n_bins",
    "pooled_tokens",
    "min_expected",
    "tv",
    "tv_null_mean",
    "tv_null_q95",
    "tv_excess",
    "tv_pvalue",
    "mde_tv",
    "status",
    "pvalue_asymptotic",
    "pvalue_permutation",
]
TRIE_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    "kind",
    "depth",
    "prefix",
    "statistic",
    "pvalue",
    "p_adj",
    "reject",
    "dof",
    "n_ref",
    "n_cand",
    "n_bins",
    "status",
]
SEQUENCE_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    "test",
    "scope",
    "statistic",
    "z",
    "pvalue",
    "p_adj",
    "reject",
    "null_mean",
    "null_sd",
    "n_ref",
    "n_cand",
    "mde",
    "unit",
]
ALL_CELLS = "*"  # prompt_id / config_id of the sequence family's pooled rows
# teacher mode's recommended reference size, × the candidate's (``_reference_size_note``): at 16
# the weighted white-box family's power is within 10 % of the exact-numerics family's against a
# wrong temperature and a wrong q, 0.74–0.91 of it against the ε = 0.05 acceptor (two seed sets;
# results/LOG.md, 2026-11-30 h10)
REFERENCE_MULTIPLIER = 16
FAMILIES = ("cells", "trie", "whitebox", "sequence", "lengths")  # the α split's order
SEQUENCE_DEFAULT = sequence.DEFAULT  # (the option ``sequence`` shadows the module in the class)
# The documented ranges of the options a protocol sets (README "Protocol reference"); the
# protocol parser validates ``tests`` through ``AnalysisOptions`` at load, so these are the one
# copy. α above one half is not a false-alarm rate anyone gates on (and would meet the power
# 0.8 of the MDEs); a pooling threshold above 1000 expected counts per bin leaves nothing
# testable at any seed count spectest runs; B above 20 000 permutations is 800 MB of labels per
# cell at 20 000 sequences, for a p-value resolution no α here needs.
ALPHA_MAX = 0.5
MIN_EXPECTED_MAX = 1000.0
NULL_PERMUTATIONS_MAX = 20_000
TRIE_DEPTH_MAX = 64


class OptionError(ConfigError):
    """An ``AnalysisOptions`` field outside its rule: ``option`` (the field), ``rule`` (what it
    must be, e.g. "expected a number in (0, 0.5]") and ``value``, so a caller that took the
    value from a file can name the file and its own field path instead."""

    def __init__(self, option: str, rule: str, value: Any) -> None:
        self.option, self.rule, self.value = option, rule, value
        super().__init__(f"analysis option {option}: {rule}, got {value!r:.200}")


@dataclass(frozen=True)
class AnalysisOptions:
    """How ``analyze`` tests (validated on construction; bad values raise ``ConfigError``).

    alpha: run-level false-alarm rate, split equally over the active families (see ``Analysis``).
    multiplicity: cell-position family correction — 'bh' (Benjamini–Hochberg, the seeds'
    choice), 'by' (Benjamini–Yekutieli, any dependence) or 'maxT' (Westfall–Young step-down
    over sequence permutations, exact FWER; needs ``null_permutations >= 1``).
    min_expected: pooling threshold (``homogeneity``). null_permutations: B sequence
    permutations for the TV null, max-T, permutation p-values and the chain-rule G².
    trie_depth: deepest prefix length of the trie (0 = no trie family). trie_min_count: sequences
    per arm for a node χ². whitebox: run the white-box family when the wb_* columns are present.
    permutation_pvalues: use permutation p-values (resolution 1/(B + 1)) for the cells instead
    of the asymptotic χ² ones. tv_quantile: upper null quantile reported. power: for the MDEs.
    whitebox_mode: 'exact' — the wb_* columns are the laws the tokens were drawn from (built-in
    engine at generation time, or a teacher with the engine's numerics): one-sample tests per
    arm; 'teacher' — a teacher whose numerics may differ (bf16/fp16 teacher forcing of a foreign
    engine): two-sample tests candidate vs reference and the tolerance control
    (``stats.whitebox_teacher``). whitebox_tolerance: τ of that control (mean per-step TV between
    the teacher's law and the sampled one). whitebox_permutations: whole-sequence relabelings of
    the two-sample tests (their p-values must reach α_whitebox × the smallest share of
    ``whitebox_teacher.TEACHER_WEIGHTS``).
    testable_shares: the shares of cell-positions ``seeds_for_testable`` reports seeds for.
    sequence: run the sequence-level family (``spectest.stats.sequence``; needs
    ``null_permutations >= 1``, else it is off with a note). sequence_statistics: which of
    ``sequence.STATISTICS`` it combines (default ``sequence.DEFAULT``).
    """

    alpha: float = 0.05
    multiplicity: str = "bh"
    min_expected: float = 5.0
    null_permutations: int = 200
    trie_depth: int = 2
    trie_min_count: int = 200
    whitebox: bool = True
    permutation_pvalues: bool = False
    tv_quantile: float = 0.95
    power: float = 0.8
    whitebox_mode: str = "exact"
    whitebox_tolerance: float = 0.05
    whitebox_permutations: int = 1999
    testable_shares: tuple[float, ...] = (0.5, 0.9)
    sequence: bool = True
    sequence_statistics: tuple[str, ...] = SEQUENCE_DEFAULT

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> OptionError:
            return OptionError(name, rule, getattr(self, name))

        def number(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)

        def integer(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if not number(self.alpha) or not (0.0 < self.alpha <= ALPHA_MAX):
            raise bad("alpha", f"expected a number in (0, {ALPHA_MAX:g}]")
        if self.multiplicity not in MULTIPLICITY:
            raise bad("multiplicity", f"expected one of {', '.join(MULTIPLICITY)}")
        if not number(self.min_expected) or not (0.0 < self.min_expected <= MIN_EXPECTED_MAX):
            raise bad("min_expected", f"expected a number in (0, {MIN_EXPECTED_MAX:g}]")
        B = self.null_permutations
        if not integer(B) or not (0 <= B <= NULL_PERMUTATIONS_MAX):
            # the label matrix is n_seq × (1 + B) uint16: 800 MB at 20 000 seqs per cell
            raise bad("null_permutations", f"expected an integer in [0, {NULL_PERMUTATIONS_MAX}]")
        if not integer(self.trie_depth) or not (0 <= self.trie_depth <= TRIE_DEPTH_MAX):
            raise bad("trie_depth", f"expected an integer in [0, {TRIE_DEPTH_MAX}]")
        if not integer(self.trie_min_count) or self.trie_min_count < 1:
            raise bad("trie_min_count", "expected an integer >= 1")
        if self.multiplicity == "maxT" and B < 1:
            raise bad("null_permutations", "expected an integer >= 1 with multiplicity 'maxT'")
        for name in ("whitebox", "permutation_pvalues", "sequence"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "expected true or false")
        if self.permutation_pvalues and B < 1:
            raise bad("null_permutations", "expected an integer >= 1 for permutation_pvalues")
        st = self.sequence_statistics
        if (
            not isinstance(st, tuple)
            or not st
            or len(set(st)) != len(st)
            or any(s not in sequence.STATISTICS for s in st)
        ):
            raise bad("sequence_statistics", f"must be a tuple of {list(sequence.STATISTICS)!r}")
        if not number(self.tv_quantile) or not (0.5 <= self.tv_quantile < 1.0):
            raise bad("tv_quantile", "must be in [0.5, 1)")
        if not number(self.power) or not (self.alpha < self.power < 1.0):
            raise bad("power", "must be in (alpha, 1)")
        if self.whitebox_mode not in WHITEBOX_MODES:
            raise bad("whitebox_mode", f"must be one of {list(WHITEBOX_MODES)!r}")
        tol = self.whitebox_tolerance
        if not number(tol) or not (0.0 <= tol < 1.0):
            raise bad("whitebox_tolerance", "must be a number in [0, 1)")
        wp = self.whitebox_permutations
        if not integer(wp) or not (1 <= wp <= 100_000):
            raise bad("whitebox_permutations", "must be an integer in [1, 100000]")
        if not all(isinstance(x, float) and 0.0 < x <= 1.0 for x in self.testable_shares):
            raise bad("testable_shares", "must be floats in (0, 1]")


@dataclass(frozen=True)
class Analysis:
    """Everything ``analyze`` found, as tidy DataFrames plus run-level numbers.

    Decision rule (``rejected``): the candidate's law differs from the reference's when ANY of
      1. a cell-position is rejected after the ``options.multiplicity`` correction, at
         ``alpha_cells``;
      2. a trie row is rejected (node χ² and per-cell chain-rule G², one family corrected by BH
         — BY when ``multiplicity`` is 'by' or 'maxT'), at ``alpha_trie``;
      3. a white-box test of the candidate arm is rejected after a weighted Bonferroni over
         that arm's white-box tests (``whitebox.WHITEBOX_WEIGHTS``), at ``alpha_whitebox``;
      4. the candidate emitted a token with target probability 0 (``support_violation``);
      5. the sequence family's max-T over its pooled statistics is significant at
         ``alpha_sequence`` (``sequence_pvalue``; rows of ``sequence`` with scope "pooled");
      6. a cell's sequence-length distribution differs (``spectest.stats.lengths``, BH at
         ``alpha_lengths``): sequences that stop early are a different law, not "untestable".
    The run-level α is split equally over the active families (``split_alpha``: cells always;
    trie when ``trie_depth >= 1`` and there are >= 2 positions; white-box when its columns are
    present; sequence when ``options.sequence`` and ``null_permutations >= 1``; lengths when some
    cell's length table is testable — ``lengths`` module docstring), so under H0
    P(rejected) ≤ α by the union bound: each procedure bounds its family's P(any rejection)
    under the global null (FDR = FWER there; the sequence family is an exact permutation test
    whatever the dependence between positions, ``spectest.stats.sequence``). A rejected
    white-box test of the *reference* arm means spectest's own p_t is wrong:
    ``whitebox_control_failed`` (the verdict should then not trust the white-box family).
    Untestable cells are counted, never passed.

    White-box mode 'teacher' (``AnalysisOptions.whitebox_mode``; ``stats.whitebox_teacher``):
    rule 3 uses the candidate's two-sample tests against the reference (weighted Bonferroni over
    them, ``whitebox_teacher.TEACHER_WEIGHTS``),
    rule 4 does not apply (a teacher-forced p = 0 can be numerics: ``support_2s`` is one of the
    two-sample tests), and ``whitebox_control_failed`` means the reference arm's tolerance
    control rejected: its teacher is farther from the sampled law than ``whitebox_tolerance``.

    Testability at real vocabularies (``power.estimate_testability``): ``testable_share`` is the
    share of cell-positions that were testable; ``seeds_for_testable`` maps each share in
    ``options.testable_shares`` (as a string) to the seeds per arm that would make that share
    testable at the observed laws (None: not estimable from this run, see
    ``power.estimate_testability``); ``seeds_for_testable_at_least`` the same from the plug-in
    maximum share, a lower bound (the plug-in max of a small sample is biased upward).

    MDE: each tested cell's ``mde_tv`` is the binned-law TV its pooled χ² detects with
    ``options.power`` at the per-test level a lone bad cell faces — α_cells/m for BH and max-T,
    α_cells/(m·Σ_{i≤m} 1/i) for BY (m tested cells); ``mde_tv`` here is their median.
    The sequence family states each pooled statistic's resolution in its own unit (columns
    ``mde`` and ``unit`` of ``sequence``; ``sequence.resolution``); ``sequence_mde`` is that of
    its first statistic stated in TV (``sequence.TV_STATISTICS``), ``sequence_mde_unit`` says
    which law that TV is of.
    """

    reference: str
    candidate: str
    options: AnalysisOptions
    cells: pd.DataFrame
    trie: pd.DataFrame
    whitebox: pd.DataFrame
    rejected: bool
    n_tested: int
    n_rejected: int
    n_untestable: int
    max_tv_excess: float
    max_tv_excess_at: dict[str, Any]  # prompt_id, config_id, position of the max excess
    mde_tv: float  # median over tested cells of the per-cell MDE in TV
    mde_tv_max: float
    directed_z_mde: float  # candidate arm's directed-z MDE (mean excess mass on A per token)
    alpha_cells: float
    alpha_trie: float
    alpha_whitebox: float
    cells_rejected: bool
    trie_rejected: bool
    whitebox_rejected: bool
    support_violation: bool
    whitebox_control_failed: bool
    multiplicity_procedure: str
    n_permutations: int
    sequence: pd.DataFrame  # SEQUENCE_COLUMNS: pooled rows (decide) then per-cell rows (locate)
    alpha_sequence: float
    sequence_rejected: bool
    sequence_pvalue: float  # the family's max-T permutation p-value (NaN when inactive)
    sequence_mde: float  # resolution in TV of the family's first TV-unit statistic (NaN: none)
    sequence_mde_unit: str  # what that TV is of (sequence.UNITS)
    notes: tuple[str, ...] = field(default_factory=tuple)
    lengths: pd.DataFrame = field(default_factory=lambda: _empty(lengths.LENGTH_COLUMNS))
    alpha_lengths: float = 0.0
    lengths_rejected: bool = False
    whitebox_mode: str = "exact"
    testable_share: float = float("nan")
    seeds_for_testable: dict[str, int | None] = field(default_factory=dict)
    seeds_for_testable_at_least: dict[str, int | None] = field(default_factory=dict)
    seeds_per_arm_observed: float = float("nan")

    def summary(self) -> dict[str, Any]:
        """The run-level numbers as a JSON-ready dict (no DataFrames)."""
        # NOTE: not asdict(self), which would deep-copy the DataFrames
        skip = ("cells", "trie", "whitebox", "lengths", "sequence", "options")
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["options"] = asdict(self.options)
        out["notes"] = list(self.notes)
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
) -> Analysis:
    """Test whether arm ``candidate`` has the law of arm ``reference``, cell by cell.

    Parameters
    ----------
    samples : the long samples table (``spectest.schema``), optional wb_* columns.
    reference, candidate : arm names (other arms in the table are ignored).
    options : ``AnalysisOptions`` (defaults if None).
    rounds : the rounds table, for the white-box acceptance test (optional).
    rng_seed : seeds the permutations and the PIT's uniforms (``numpy.random.SeedSequence``).

    Notes
    -----
    Per cell (prompt, config) the B relabelings move whole sequences between the arms (sizes
    kept); one label matrix is shared by the cells with equal arm sizes (``tables.label_matrix``
    NOTE). The same relabelings serve the TV null, max-T, permutation p-values and the chain
    G². Cost: one sparse product per cell, O(tokens × B); singletons merged (``tables``).
    Verified: type-I rate within 3σ of α per family and run-level P(rejected) ≤ α + 3σ on
    simulated H0 data; power against the ε-biased acceptor as the MDE predicts
    (tests/test_stats_analyze.py, tests/test_stats_calibration.py).
    """
    opts = options if options is not None else AnalysisOptions()
    if not isinstance(opts, AnalysisOptions):
        raise ConfigError(f"options must be an AnalysisOptions, got {type(opts).__name__!r}")
    if reference == candidate:
        raise ConfigError(f"reference and candidate arms must differ, got {reference!r} twice")
    enc = encode_samples(samples, (reference, candidate))
    ss = np.random.SeedSequence(int(rng_seed))
    perm_seq, pit_seq = ss.spawn(2)
    perm_rng, pit_rng = np.random.default_rng(perm_seq), np.random.default_rng(pit_seq)
    B = opts.null_permutations
    merge = opts.min_expected > 0.5
    do_trie = opts.trie_depth >= 1 and enc.n_positions >= 2
    has_pit = sc.WB_P in samples.columns and sc.WB_CDF_LO in samples.columns
    # the white-box family is active when the candidate's p_t were computed (not all NaN)
    do_wb = bool(
        opts.whitebox
        and has_pit
        and samples.loc[samples[sc.ARM] == candidate, sc.WB_P].notna().any()
    )
    len_df = lengths.length_tests(enc, opts.min_expected)
    do_len = lengths.is_active(len_df)
    do_seq = opts.sequence and B >= 1
    alphas = split_alpha(
        opts.alpha,
        {"cells": True, "trie": do_trie, "whitebox": do_wb, "sequence": do_seq, "lengths": do_len},
    )
    a_cells, a_trie, a_wb, a_seq, a_len = (alphas[f] for f in FAMILIES)
    if do_len:
        len_df = lengths.adjust(len_df, a_len, opts.power)

    labels_cache: dict[tuple[int, int], np.ndarray] = {}
    cell_parts: list[dict[str, np.ndarray]] = []
    maxt_obs: list[np.ndarray] = []
    maxt_null: list[np.ndarray] = []
    trie_rows: list[dict[str, np.ndarray]] = []
    seq_cells: list[np.ndarray] = []  # [J, 1+B] per cell
    seq_sizes: list[np.ndarray] = []  # [2] per cell
    for c in range(enc.n_cells):
        lo, hi = int(enc.cell_start[c]), int(enc.cell_start[c + 1])
        sizes = enc.arm_sizes(c)
        key = (int(sizes[0]), int(sizes[1]))
        if key not in labels_cache:
            labels_cache[key] = tables.label_matrix(key[0], key[1], B, perm_rng)
        labels = labels_cache[key]  # [n_c, 1+B]
        tok = enc.tokens[lo:hi]  # [n_c, T]
        seq, pos = np.nonzero(tok >= 0)  # row-major: sorted by sequence
        table = tables.build_table(pos, tok[seq, pos], seq, n_seq=hi - lo, merge_singletons=merge)
        ref = tables.ref_counts(table, labels[:, :1])  # [K, 1] observed
        n_ref, n_cand = tables.stratum_arm_sizes(table, ref)  # [S, 1]
        bins = homogeneity.pool_table(table, n_ref[:, 0], n_cand[:, 0], opts.min_expected)
        chi = homogeneity.chi2_statistics(table, bins, ref, n_ref, n_cand)[:, 0]
        dof = np.where(bins.testable, bins.n_bins - 1, 0)
        with np.errstate(invalid="ignore"):
            p_asym = np.where(bins.testable, stats.chi2.sf(chi, np.maximum(dof, 1)), np.nan)
        tv = distance.tv_statistics(table, ref, n_ref, n_cand)[:, 0]
        S = table.n_strata
        nan = np.full(S, np.nan)
        tv_mean, tv_q, tv_p, p_perm = nan, nan, nan, nan
        if B:
            chi_all, tv_all = _null_columns(table, bins, labels)  # [S, 1+B] each
            tv_mean, tv_q, tv_p = distance.summarize_null(
                tv_all[:, 0], tv_all[:, 1:], opts.tv_quantile
            )
            p_perm = distance.summarize_null(chi_all[:, 0], chi_all[:, 1:])[2]
            p_perm = np.where(bins.testable, p_perm, np.nan)
            if opts.multiplicity == "maxT":
                d = np.maximum(dof, 1)[:, None].astype(np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    s_all = -stats.chi2.logsf(chi_all.astype(np.float64), d)  # [S, 1+B]
                s_all[~bins.testable] = np.nan
                maxt_obs.append(s_all[:, 0])
                maxt_null.append(s_all[:, 1:])
        cell_parts.append(
            dict(
                cell=np.full(S, c),
                position=table.strata,
                chi=chi,
                p_asym=p_asym,
                p_perm=p_perm,
                dof=dof,
                n_ref=n_ref[:, 0],
                n_cand=n_cand[:, 0],
                n_bins=bins.n_bins,
                pooled=bins.pooled_tokens,
                min_exp=bins.min_expected,
                testable=bins.testable,
                tv=tv,
                tv_mean=tv_mean,
                tv_q=tv_q,
                tv_p=tv_p,
            )
        )
        if do_trie:
            trie_rows.append(_trie_cell(enc, c, tok, labels, opts, merge))
        if do_seq and sizes.min() > 0:
            seq_cells.append(sequence.cell_statistics(tok, labels, min_expected=opts.min_expected))
            seq_sizes.append(np.array([c, *sizes]))

    cells = _cells_frame(enc, cell_parts, opts)
    testable = cells["status"].to_numpy() == homogeneity.OK
    m = int(testable.sum())
    if opts.multiplicity == "maxT" and maxt_obs:
        res = multiplicity.maxt_adjust(
            np.concatenate(maxt_obs), np.concatenate(maxt_null, axis=0).T, a_cells
        )
    else:
        res = multiplicity.adjust(
            cells["pvalue"].to_numpy(),
            opts.multiplicity if opts.multiplicity != "maxT" else "bh",
            a_cells,
        )
    cells["p_adj"] = res.pvalue_adjusted
    cells["reject"] = res.reject & testable
    # per-test α a lone bad cell faces: BH / max-T ≈ α/m; BY α/(m·H_m)
    harmonic = float(np.sum(1.0 / np.arange(1, m + 1))) if m else 1.0
    alpha_each = a_cells / max(m, 1) / (harmonic if opts.multiplicity == "by" else 1.0)
    cells["mde_tv"] = np.where(
        testable,
        power.mde_tv(cells["n_ref"], cells["n_cand"], cells["dof"], alpha_each, opts.power),
        np.nan,
    )

    trie_df = _trie_frame(enc, trie_rows, opts, a_trie) if do_trie else _empty(TRIE_COLUMNS)
    if not do_wb:
        wb = _empty([*whitebox.WHITEBOX_COLUMNS, "p_adj", "reject"])
    elif opts.whitebox_mode == "teacher":
        wb = _teacher_whitebox_frame(samples, reference, candidate, pit_rng, a_wb, opts)
    else:
        wb = _whitebox_frame(samples, reference, candidate, rounds, pit_rng, a_wb)
    testability = _testability(enc, opts)

    seq_df, seq_p, seq_mde, seq_unit = (
        _sequence_frame(enc, seq_cells, seq_sizes, opts, a_seq)
        if do_seq
        else (_empty(SEQUENCE_COLUMNS), float("nan"), float("nan"), "")
    )

    excess = cells["tv_excess"].to_numpy(dtype=np.float64)
    where: dict[str, Any] = {}
    max_excess = float("nan")
    if np.isfinite(excess).any():
        i = int(np.nanargmax(excess))
        max_excess = float(excess[i])
        where = {k: cells.iloc[i][k] for k in (sc.PROMPT_ID, sc.CONFIG_ID)}
        where[sc.POSITION] = int(cells.iloc[i][sc.POSITION])
    mde = cells.loc[testable, "mde_tv"].to_numpy(dtype=np.float64)
    cand_wb = wb[wb["arm"] == candidate] if len(wb) else wb
    ref_wb = wb[wb["arm"] == reference] if len(wb) else wb
    support = bool(
        len(cand_wb) and ((cand_wb["test"] == "support") & (cand_wb["statistic"] > 0)).any()
    )
    dz_mde = float("nan")
    dz_name = "directed_z_2s" if opts.whitebox_mode == "teacher" else "directed_z"
    if len(cand_wb) and (cand_wb["test"] == dz_name).any():
        dz_mde = float(cand_wb.loc[cand_wb["test"] == dz_name, "mde"].iloc[0])
    cells_rej = bool(cells["reject"].any())
    trie_rej = bool(len(trie_df) and trie_df["reject"].astype(bool).any())
    wb_rej = bool(len(cand_wb) and cand_wb["reject"].astype(bool).any())
    len_rej = bool(len(len_df) and len_df["reject"].astype(bool).any())
    seq_rej = bool(len(seq_df) and seq_df["reject"].astype(bool).any())
    notes = []
    if opts.sequence and not do_seq:
        notes.append("sequence family off: it needs null_permutations >= 1")
    if m == 0:
        notes.append("no testable cell-position: nothing was shown equal")
    if opts.permutation_pvalues and m and 1.0 / (B + 1) > a_cells / m:
        notes.append(f"permutation p-values cannot reach alpha/m = {a_cells / m:.2g} with B = {B}")
    if opts.whitebox_mode == "teacher" and len(cand_wb):
        note = _permutation_floor_note(cand_wb, a_wb, opts.whitebox_permutations)
        if note:
            notes.append(note)
    if opts.whitebox_mode == "teacher" and np.isfinite(dz_mde):
        note = _reference_size_note(samples, reference, candidate, dz_mde)
        if note:
            notes.append(note)
    return Analysis(
        reference=reference,
        candidate=candidate,
        options=opts,
        cells=cells,
        trie=trie_df,
        whitebox=wb,
        rejected=cells_rej or trie_rej or wb_rej or support or len_rej or seq_rej,
        n_tested=m,
        n_rejected=int(cells["reject"].sum()),
        n_untestable=int((~testable).sum()),
        max_tv_excess=max_excess,
        max_tv_excess_at=where,
        mde_tv=float(np.median(mde)) if mde.size else float("nan"),
        mde_tv_max=float(np.max(mde)) if mde.size else float("nan"),
        directed_z_mde=dz_mde,
        alpha_cells=a_cells,
        alpha_trie=a_trie,
        alpha_whitebox=a_wb,
        cells_rejected=cells_rej,
        trie_rejected=trie_rej,
        whitebox_rejected=wb_rej,
        support_violation=support,
        whitebox_control_failed=bool(len(ref_wb) and ref_wb["reject"].astype(bool).any()),
        multiplicity_procedure=res.procedure,
        n_permutations=B,
        sequence=seq_df,
        alpha_sequence=a_seq,
        sequence_rejected=seq_rej,
        sequence_pvalue=seq_p,
        sequence_mde=seq_mde,
        sequence_mde_unit=seq_unit,
        notes=tuple(notes),
        lengths=len_df,
        alpha_lengths=a_len,
        lengths_rejected=len_rej,
        whitebox_mode=opts.whitebox_mode,
        testable_share=float(m / len(cells)) if len(cells) else float("nan"),
        seeds_for_testable={f"{k:g}": v for k, v in testability.seeds_for_share.items()},
        seeds_for_testable_at_least={f"{k:g}": v for k, v in testability.seeds_at_least.items()},
        seeds_per_arm_observed=testability.seeds_per_arm,
    )


# NOTE: relabelings are processed in blocks of columns so that memory stays O(K·block) for any
# B (a block of the [K, block] count matrix plus a few float32 copies); B ≤ 255 is one block.
_BLOCK = 256


def _null_columns(
    table: tables.StrataTable, bins: homogeneity.PooledBins, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pooled χ² and TV of every stratum under every labeling (column 0 = observed), float32.

    Column 0 is recomputed here with the same arithmetic as the relabelings, so that a
    relabeling equal to the observed one ties exactly (``distance.summarize_null`` NOTE).
    """
    chi, tv = [], []
    for lo in range(0, labels.shape[1], _BLOCK):
        ref = tables.ref_counts(table, labels[:, lo : lo + _BLOCK])  # [K, block]
        n_ref, n_cand = tables.stratum_arm_sizes(table, ref)
        chi.append(homogeneity.chi2_statistics(table, bins, ref, n_ref, n_cand, np.float32))
        tv.append(distance.tv_statistics(table, ref, n_ref, n_cand, np.float32))
    return np.concatenate(chi, axis=1), np.concatenate(tv, axis=1)


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def _cells_frame(
    enc: Any, parts: list[dict[str, np.ndarray]], opts: AnalysisOptions
) -> pd.DataFrame:
    if not parts:
        return _empty(CELL_COLUMNS)
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    cell = cat["cell"].astype(np.int64)
    testable = cat["testable"]
    pvalue = cat["p_perm"] if opts.permutation_pvalues else cat["p_asym"]
    df = pd.DataFrame(
        {
            sc.PROMPT_ID: enc.cells[sc.PROMPT_ID].to_numpy()[cell],
            sc.CONFIG_ID: enc.cells[sc.CONFIG_ID].to_numpy()[cell],
            sc.POSITION: cat["position"].astype(np.int32),
            "statistic": np.where(testable, cat["chi"], np.nan),
            "pvalue": pvalue,
            "p_adj": np.nan,
            "reject": False,
            "dof": cat["dof"].astype(np.int64),
            "n_ref": cat["n_ref"].astype(np.int64),
            "n_cand": cat["n_cand"].astype(np.int64),
            "n_bins": cat["n_bins"].astype(np.int64),
            "pooled_tokens": cat["pooled"].astype(np.int64),
            "min_expected": cat["min_exp"],
            "tv": cat["tv"],
            "tv_null_mean": cat["tv_mean"].astype(np.float64),
            "tv_null_q95": cat["tv_q"].astype(np.float64),
            "tv_excess": cat["tv"] - cat["tv_mean"],
            "tv_pvalue": cat["tv_p"],
            "mde_tv": np.nan,
            "status": np.where(testable, homogeneity.OK, homogeneity.UNTESTABLE),
            "pvalue_asymptotic": cat["p_asym"],
            "pvalue_permutation": cat["p_perm"],
        }
    )
    return df[CELL_COLUMNS]


def _trie_cell(
    enc: Any, c: int, tok: np.ndarray, labels: np.ndarray, opts: AnalysisOptions, merge: bool
) -> dict[str, np.ndarray]:
    """The chain-rule G² row then the node χ² rows of one cell, as column arrays.

    NOTE: plain arrays, one DataFrame for all cells at the end: building two small frames per
    cell cost ~20 ms each (string columns), which dominated runs with hundreds of cells.
    """
    tt = trie.build_trie_table(tok, opts.trie_depth, merge_singletons=merge)
    chain = trie.chain_rule_g2(tt, labels, block=_BLOCK)
    ref = tables.ref_counts(tt.table, labels[:, :1])  # [K, 1] observed
    nodes = trie.node_chi2(tt, ref, min_count=opts.trie_min_count, min_expected=opts.min_expected)
    depth = tt.node_depth[nodes.node]
    prefixes = [
        format_prefix(enc.token_id(tok[r, :d]))
        for r, d in zip(tt.node_rep[nodes.node], depth, strict=True)
    ]
    sizes = enc.arm_sizes(c)
    chain_ok = homogeneity.OK if np.isfinite(chain.pvalue) else homogeneity.UNTESTABLE
    m = len(nodes.node)
    return {
        "cell": np.full(m + 1, c),
        "kind": np.array(["chain"] + ["node"] * m, dtype=object),
        "depth": np.r_[min(opts.trie_depth, tok.shape[1] - 1), depth].astype(np.int64),
        "prefix": np.array(["", *prefixes], dtype=object),
        "statistic": np.r_[chain.statistic, nodes.statistic],
        "pvalue": np.r_[chain.pvalue, nodes.pvalue],
        "dof": np.r_[chain.dof, nodes.dof].astype(np.int64),
        "n_ref": np.r_[sizes[0], nodes.n_ref].astype(np.int64),
        "n_cand": np.r_[sizes[1], nodes.n_cand].astype(np.int64),
        "n_bins": np.r_[chain.n_nodes, nodes.n_bins].astype(np.int64),
        "status": np.r_[
            [chain_ok], np.where(nodes.testable, homogeneity.OK, homogeneity.UNTESTABLE)
        ].astype(object),
    }


def _trie_frame(
    enc: Any, rows: list[dict[str, np.ndarray]], opts: AnalysisOptions, alpha: float
) -> pd.DataFrame:
    if not rows:
        return _empty(TRIE_COLUMNS)
    cat = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    cell = cat.pop("cell").astype(np.int64)
    df = pd.DataFrame(
        {
            sc.PROMPT_ID: enc.cells[sc.PROMPT_ID].to_numpy()[cell],
            sc.CONFIG_ID: enc.cells[sc.CONFIG_ID].to_numpy()[cell],
            **cat,
        }
    )
    method = "bh" if opts.multiplicity == "bh" else "by"
    res = multiplicity.adjust(df["pvalue"].to_numpy(dtype=np.float64), method, alpha)
    df["p_adj"] = res.pvalue_adjusted
    df["reject"] = res.reject
    return df[TRIE_COLUMNS]


def _teacher_whitebox_frame(
    samples: pd.DataFrame,
    reference: str,
    candidate: str,
    rng: np.random.Generator,
    alpha: float,
    opts: AnalysisOptions,
) -> pd.DataFrame:
    """Teacher mode: the reference's tolerance control and the candidate's two-sample tests,
    weighted Bonferroni within each arm's rows (``whitebox_teacher.TEACHER_WEIGHTS``)."""
    wb = whitebox_teacher.teacher_whitebox_tests(
        samples, reference, candidate, rng,
        B=opts.whitebox_permutations, tolerance=opts.whitebox_tolerance,
    )  # fmt: skip
    if not len(wb):
        return _empty([*whitebox.WHITEBOX_COLUMNS, "p_adj", "reject"])
    p_adj = _weighted_within_arms(wb, whitebox_teacher.TEACHER_WEIGHTS)
    wb["p_adj"] = p_adj
    wb["reject"] = p_adj <= alpha
    return wb


def _weighted_within_arms(wb: pd.DataFrame, weights: dict[str, float]) -> np.ndarray:
    """Weighted Bonferroni (``whitebox.weighted_bonferroni``) within each arm's rows of ``wb``:
    p_adj per row, in row order; the weights renormalised over the tests each arm ran."""
    p_adj = np.ones(len(wb), dtype=np.float64)
    arms = wb["arm"].to_numpy()
    for arm in pd.unique(arms):
        idx = np.flatnonzero(arms == arm)
        rows = wb.iloc[idx]
        p_adj[idx], _ = whitebox.weighted_bonferroni(
            rows["test"].tolist(), rows["pvalue"].to_numpy(dtype=np.float64), weights
        )
    return p_adj


def _permutation_floor_note(cand_wb: pd.DataFrame, alpha: float, B: int) -> str:
    """Teacher mode: the two-sample tests' permutation p-values cannot go below 1/(B + 1), so a
    test whose α share α_whitebox × w is smaller can never reject; name them and the B that
    would let them ("" when every test can reach its share)."""
    tests = cand_wb["test"].tolist()
    _, w = whitebox.weighted_bonferroni(
        tests, np.ones(len(tests)), whitebox_teacher.TEACHER_WEIGHTS
    )
    short = [t for t, wi in zip(tests, w, strict=True) if 1.0 / (B + 1) > alpha * wi]
    if not short:
        return ""
    need = int(np.ceil(1.0 / (alpha * float(np.min(w))))) + 1
    return (
        f"teacher mode: with whitebox_permutations = {B} the two-sample p-values cannot reach "
        f"their α share for {', '.join(short)} (α_whitebox {alpha:.3g}); "
        f"whitebox_permutations >= {need} would"
    )


def _reference_size_note(
    samples: pd.DataFrame, reference: str, candidate: str, dz_mde: float
) -> str:
    """Teacher mode's sizing advice: the two-sample directed z's MDE scales as √(1 + n_c/n_r)
    (``power.directed_z_2s_mde``); say what a reference of ``REFERENCE_MULTIPLIER`` × the
    candidate would give when this run's reference is smaller than that ("" otherwise)."""
    n_r = int((samples[sc.ARM] == reference).sum())
    n_c = int((samples[sc.ARM] == candidate).sum())
    if n_r == 0 or n_c == 0 or n_r >= REFERENCE_MULTIPLIER * n_c:
        return ""
    one = dz_mde / np.sqrt(1.0 + n_c / n_r)  # the one-sample MDE at the candidate's size
    at_m = one * np.sqrt(1.0 + 1.0 / REFERENCE_MULTIPLIER)
    return (
        f"teacher mode: the two-sample directed z's MDE is {dz_mde:.3g} with a reference "
        f"{n_r / n_c:.2g} x the candidate; seeds.reference_per_arm = {REFERENCE_MULTIPLIER} x "
        f"per_arm would make it {at_m:.3g} (one-sample: {one:.3g}) and bring the white-box "
        "family's power near that of exact numerics (simulated: 0.74-0.98 of it)"
    )


def _testability(enc: Any, opts: AnalysisOptions) -> power.Testability:
    """Per cell-position arm histograms → ``power.estimate_testability`` (pooled-χ² keep rule)."""
    top_ref, top_cand, top, n_ref, n_cand = [], [], [], [], []
    for c in range(enc.n_cells):
        lo, hi = int(enc.cell_start[c]), int(enc.cell_start[c + 1])
        tok = enc.tokens[lo:hi]  # [n_c, T]
        is_ref = enc.seq_arm[lo:hi] == 0  # [n_c] arms are (reference, candidate)
        a, b, mx, na, nb = power.cross_fitted_top_counts(tok[is_ref], tok[~is_ref])
        top_ref.append(a)
        top_cand.append(b)
        top.append(mx)
        n_ref.append(na)
        n_cand.append(nb)
    if not top_ref:
        z = np.zeros(0)
        return power.estimate_testability(z, z, z, z, z, opts.min_expected, ())
    return power.estimate_testability(
        np.concatenate(top_ref),
        np.concatenate(top_cand),
        np.concatenate(top),
        np.concatenate(n_ref),
        np.concatenate(n_cand),
        opts.min_expected,
        opts.testable_shares,
    )


def _sequence_frame(
    enc: Any,
    cells: list[np.ndarray],
    sizes: list[np.ndarray],
    opts: AnalysisOptions,
    alpha: float,
) -> tuple[pd.DataFrame, float, float, str]:
    """The sequence family: pooled rows (one per statistic: z, max-T adjusted p, decision,
    resolution) then per-cell rows (diagnostic p-values); its p-value, TV resolution, unit."""
    if not cells:
        return _empty(SEQUENCE_COLUMNS), float("nan"), float("nan"), ""
    names = opts.sequence_statistics
    rows = [sequence.STATISTICS.index(n) for n in names]
    res = sequence.combine([c[rows] for c in cells], names)
    sz = np.stack(sizes)  # [C, 3]: cell code, n_ref, n_cand
    mde = sequence.resolution(res, sz[:, 1], sz[:, 2], enc.n_positions, alpha, opts.power)
    J, C = len(names), sz.shape[0]
    pooled = pd.DataFrame(
        {
            sc.PROMPT_ID: ALL_CELLS,
            sc.CONFIG_ID: ALL_CELLS,
            "test": np.array(names, dtype=object),
            "scope": "pooled",
            "statistic": res.z,
            "z": res.z,
            "pvalue": res.stat_pvalue,
            "p_adj": res.stat_adjusted,
            "reject": res.stat_adjusted <= alpha,
            "null_mean": 0.0,
            "null_sd": res.z_null_sd,
            "n_ref": int(sz[:, 1].sum()),
            "n_cand": int(sz[:, 2].sum()),
            "mde": mde,
            "unit": [sequence.UNITS[n] for n in res.names],
        }
    )
    cell = np.repeat(sz[:, 0], J)
    sd = res.cell_null_sd.reshape(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        zc = (res.cell_observed.reshape(-1) - res.cell_null_mean.reshape(-1)) / sd
    per_cell = pd.DataFrame(
        {
            sc.PROMPT_ID: enc.cells[sc.PROMPT_ID].to_numpy()[cell],
            sc.CONFIG_ID: enc.cells[sc.CONFIG_ID].to_numpy()[cell],
            "test": np.tile(np.array(names, dtype=object), C),
            "scope": "cell",
            "statistic": res.cell_observed.reshape(-1),
            "z": np.where(sd > 0, zc, 0.0),
            "pvalue": res.cell_pvalue.reshape(-1),
            "p_adj": np.nan,
            "reject": False,
            "null_mean": res.cell_null_mean.reshape(-1),
            "null_sd": sd,
            "n_ref": np.repeat(sz[:, 1], J),
            "n_cand": np.repeat(sz[:, 2], J),
            "mde": np.nan,
            "unit": "",
        }
    )
    df = pd.concat([pooled, per_cell], ignore_index=True)[SEQUENCE_COLUMNS]
    tv = [j for j, n in enumerate(names) if n in sequence.TV_STATISTICS]
    if not tv:
        return df, res.pvalue, float("nan"), ""
    return df, res.pvalue, float(mde[tv[0]]), sequence.UNITS[names[tv[0]]]


def _whitebox_frame(
    samples: pd.DataFrame,
    reference: str,
    candidate: str,
    rounds: pd.DataFrame | None,
    rng: np.random.Generator,
    alpha: float,
) -> pd.DataFrame:
    wb = whitebox.whitebox_tests(samples, [reference, candidate], rng, rounds=rounds)
    if not len(wb):
        return _empty([*whitebox.WHITEBOX_COLUMNS, "p_adj", "reject"])
    p = wb["pvalue"].to_numpy(dtype=np.float64)
    # weighted Bonferroni within each arm's white-box family (whitebox.WHITEBOX_WEIGHTS);
    # support violations are hard failures, outside the split
    is_support = wb["test"].to_numpy() == "support"
    p_adj = p.copy()
    if (~is_support).any():
        p_adj[~is_support] = _weighted_within_arms(wb[~is_support], whitebox.WHITEBOX_WEIGHTS)
    wb["p_adj"] = p_adj
    wb["reject"] = np.where(
        is_support, wb["statistic"].to_numpy(dtype=np.float64) > 0, p_adj <= alpha
    )
    return wb
