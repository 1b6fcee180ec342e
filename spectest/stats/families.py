"""What a test family is: the ``Family`` protocol, its inputs (``FamilyInputs``) and its result
(``FamilyResult``, failing rows as ``Failure`` lines). A new family is one class (its own
``family_<name>.py``, or beside small statistics) and one line in ``battery.FAMILIES``. Knows
no particular family, files or torch. How the families' results decide: docs/families.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd

from spectest import schema as sc
from spectest.stats import tables
from spectest.stats.histograms import EncodedSamples
from spectest.stats.options import AnalysisOptions

# NOTE: relabelings are processed in blocks of columns so that memory stays O(K·block) for any
# B (a block of the [K, block] count matrix plus a few float32 copies); B ≤ 255 is one block.
# Read at call time, so a test can shrink it in one place.
BLOCK = 256


@dataclass(frozen=True)
class Failure:
    """One rejected test as the failing list prints it: ``line``, sorted by ``key`` (the
    adjusted p-value: most significant first), and the sampling config it belongs to (None for
    a run-level test: white-box, the sequence family's pooled statistics), which the per-config
    rejection counts read."""

    key: float
    line: str
    config_id: Any = None  # the cell's config_id value as the samples hold it


_R = TypeVar("_R", bound="FamilyResult")


@dataclass(frozen=True)
class FamilyResult:
    """What one test family found in one comparison.

    ``alpha`` is its share of the run's α (0: not active, it tested nothing); ``table`` its tidy
    rows (empty when it did not run); ``n_tested`` / ``n_untestable`` its tests that ran on
    enough data and those that did not (what "enough" means is the family's: a trie chain on a
    handful of sequences does not count); ``resolution`` the smallest effect one of its tests
    detects with the run's power at the per-test level a lone bad cell faces, in
    ``resolution_unit`` (NaN where it has no closed form); ``failing`` its rejected tests.
    ``black_box``: it reads the emitted tokens only (a kill by white-box tests alone that rest on
    a support violation shows no power against TV-sized bugs, ``verdict.power_claim``).
    ``control_failed``: its control on the reference arm rejected (the run is inconclusive).
    ``resolution_note``: how a resolution estimated from the data moves with it (its range).
    ``verdict_line``: a line of its own that every verdict output prints ("" none). ``notes``:
    what a reader of the run should know (an option that switched it off, a floor it cannot
    pass). ``claims``: its tests rest on what an engine reports about itself (its rounds):
    it can add a rejection, and never counts as "a family ran" for a pass
    (``comparison.Comparison.tested_anything``). ``unresolved``: one line saying why its claim
    stays undecided without a rejection (the reported-p family's tokens left out beyond
    ``tests.left_out_max``; the verdict's rung 3e): the run is inconclusive. ``exact_rejected``:
    a test exact at any numerics rejected (conditional on the engine's own law: white-box,
    reported-p support and PIT), so it decides claim (a) beside a floor arm too.
    """

    name: str
    label: str
    alpha: float
    table: pd.DataFrame
    rejected: bool
    n_tested: int
    n_untestable: int
    resolution: float = float("nan")
    resolution_unit: str = ""
    failing: tuple[Failure, ...] = ()
    black_box: bool = True
    control_failed: bool = False
    verdict_line: str = ""
    notes: tuple[str, ...] = ()
    resolution_note: str = ""  # "": a closed form of the design (the per-cell MDE)
    claims: bool = False
    unresolved: str = ""
    exact_rejected: bool = False

    @property
    def active(self) -> bool:
        return self.alpha > 0

    @property
    def reported(self) -> bool:
        """It has rows to show (the comparison lists it, tested or not)."""
        return len(self.table) > 0

    def summary(self) -> dict[str, Any]:
        """Its run-level numbers for ``Analysis.summary`` (summary.json's ``details``)."""
        return {f"alpha_{self.name}": self.alpha, f"{self.name}_rejected": self.rejected}

    @classmethod
    def of(
        cls: type[_R],
        family: Family,
        alpha: float,
        table: pd.DataFrame,
        tested: np.ndarray,
        failing: tuple[Failure, ...] = (),
        **fields: Any,
    ) -> _R:
        """The result of ``family`` at level ``alpha``: ``tested`` marks the tests that ran on
        enough data (the others are untestable); it rejected when some test is failing."""
        t = np.asarray(tested, dtype=bool)
        return cls(
            name=family.name,
            label=family.label,
            alpha=alpha,
            table=table,
            rejected=bool(failing),
            n_tested=int(t.sum()),
            n_untestable=int((~t).sum()),
            failing=failing,
            **fields,
        )


@dataclass(frozen=True)
class FamilyInputs:
    """What every family reads: the two arms' samples and their encoding, the options, and the
    randomness, passed in.

    ``labels[c]`` is cell ``c``'s [n_c, 1 + B] matrix of sequence relabelings (column 0 the
    observed labels; ``relabelings``): the families that permute share them, so the TV null,
    max-T, the chain G² and the sequence family see the same permutations. ``pit_rng`` draws the
    white-box PIT's uniforms. ``executor`` (None: this process) spreads per-cell work that is
    a pure function of its inputs over processes (``map_cells``): the labels are drawn here,
    once, so the results do not depend on it.
    """

    samples: pd.DataFrame
    enc: EncodedSamples
    options: AnalysisOptions
    reference: str
    candidate: str
    rounds: pd.DataFrame | None
    labels: tuple[np.ndarray, ...]
    pit_rng: np.random.Generator
    executor: Executor | None = None
    all_rounds: pd.DataFrame | None = None  # every arm's rounds, readouts too (None: none)
    # what a family derived from these inputs once, for its ``active`` and ``run`` (``memoized``)
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def memoized(self, key: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, computed once per inputs under ``key``: a pure function of these inputs
        (no randomness), so computing it again would give the same value."""
        if key not in self.memo:
            self.memo[key] = fn()
        return self.memo[key]

    def map_cells(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``[fn(*a) for a in args]``, in order, on ``executor`` when set: the same function
        of the same inputs per item, so the same values as the serial loop, bit for bit."""
        if self.executor is None or len(args) < 2:
            return [fn(*a) for a in args]
        return list(self.executor.map(fn, *zip(*args, strict=True)))

    @property
    def merge(self) -> bool:
        """Singletons merged into one bin (``tables``): whenever they could not be tested alone."""
        return self.options.min_expected > 0.5

    def cell_tokens(self, c: int) -> np.ndarray:
        """Cell ``c``'s token matrix [n_c, T], reference sequences first."""
        lo, hi = int(self.enc.cell_start[c]), int(self.enc.cell_start[c + 1])
        return self.enc.tokens[lo:hi]

    def cell_ids(self, cells: np.ndarray) -> dict[str, np.ndarray]:
        """prompt_id and config_id columns of the cell codes ``cells``."""
        ids = self.enc.cells
        return {k: ids[k].to_numpy()[cells] for k in (sc.PROMPT_ID, sc.CONFIG_ID)}


class Family(Protocol):
    """A test family: ``name`` keys ``Analysis.families`` and summary.json's ``alpha_<name>`` /
    ``<name>_rejected``; ``label`` is how the verdict names it."""

    name: str
    label: str

    def active(self, inputs: FamilyInputs) -> bool:
        """Whether it takes a share of α. Must not depend on the arm labels of the sequences (a
        function of the pooled sequences only), so the union bound holds conditionally."""
        ...

    def run(self, inputs: FamilyInputs, alpha: float) -> FamilyResult:
        """Test at level ``alpha`` (0: not active — report what it has, test nothing)."""
        ...


def relabelings(enc: EncodedSamples, B: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Every cell's [n_c, 1 + B] relabelings; one matrix shared by the cells with equal arm
    sizes (``tables.label_matrix`` NOTE), drawn in cell order."""
    cache: dict[tuple[int, int], np.ndarray] = {}
    out = []
    for c in range(enc.n_cells):
        sizes = enc.arm_sizes(c)
        key = (int(sizes[0]), int(sizes[1]))
        if key not in cache:
            cache[key] = tables.label_matrix(key[0], key[1], B, rng)
        out.append(cache[key])
    return tuple(out)


def failures(
    df: pd.DataFrame, line: Callable[[Any], str], *, run_level: bool = False
) -> tuple[Failure, ...]:
    """A ``Failure`` per rejected row of ``df``: its ``p_adj``, ``line(row)`` and its config_id
    (None when ``run_level``)."""
    rej = df[df["reject"].astype(bool)] if len(df) else df
    return tuple(
        Failure(float(r.p_adj), line(r), None if run_level else r.config_id)
        for r in rej.itertuples(index=False)
    )


def empty_frame(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def notes_of(results: Mapping[str, FamilyResult]) -> tuple[str, ...]:
    """The families' notes: those of families that did not run first (why they are off), then
    the others', in registry order."""
    off = [n for r in results.values() if not r.active for n in r.notes]
    on = [n for r in results.values() if r.active for n in r.notes]
    return (*off, *on)
