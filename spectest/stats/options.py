"""The statistics' options: ``AnalysisOptions`` (frozen, validated on construction) and the
documented ranges of the values a protocol sets.

Owns: every option ``spectest.stats.analyze.analyze`` and its test families read, their defaults
and their validation (``OptionError`` names the field, the rule and the value). Does not know:
files, protocols (the protocol parser validates ``tests`` through this class at load), any
statistic. Re-exported by ``spectest.stats.analyze``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from spectest.errors import ConfigError
from spectest.stats import sequence

MULTIPLICITY = ("bh", "by", "maxT")
WHITEBOX_MODES = ("exact", "teacher")
SEQUENCE_DEFAULT = sequence.DEFAULT  # (the option ``sequence`` shadows the module in the class)
# The documented ranges of the options a protocol sets (docs/protocols.md "Protocol reference"); the
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
