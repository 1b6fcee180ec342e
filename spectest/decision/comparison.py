"""One arm compared with its reference, as the verdict sees it (``compare_arm`` → ``Comparison``;
a tooth's judgement is its comparison's), and ``eps_cannot_bite``. The details:
docs/internals.md "spectest/decision/comparison.py".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from spectest import schema

if TYPE_CHECKING:
    from spectest.plan import Arm
    from spectest.stats.battery import Analysis
    from spectest.stats.families import FamilyResult


@dataclass(frozen=True)
class FamilyScope:
    """What one test family of one comparison actually tested, and at what resolution: the
    verdict's view of a ``spectest.stats.families.FamilyResult`` (no tables).

    ``alpha`` is the family's share of the run's α (0 when the family was not active); ``mde``
    the smallest effect one of its tests detects with the run's power at the per-test level a
    lone bad cell faces, in ``mde_unit`` (None where the family has no closed-form MDE);
    ``label`` how the verdict names it (its name when not given); ``verdict_line`` a line of its
    own that every verdict output prints ("" none); ``mde_note`` how a resolution estimated from
    the data moves with it ("" a closed form of the design).
    """

    name: str  # cells | trie | whitebox | sequence | lengths | any registered family
    n_tested: int
    n_untestable: int
    alpha: float
    mde: float | None
    mde_unit: str
    rejected: bool
    label: str = ""
    verdict_line: str = ""
    mde_note: str = ""  # a data-dependent resolution says so (``FamilyResult.resolution_note``)
    claims: bool = False  # rests on an engine's reports (rounds): never "ran" for a pass
    unresolved: str = ""  # why its claim stays undecided (``FamilyResult.unresolved``)
    exact_rejected: bool = False  # ``FamilyResult.exact_rejected`` (not in summary.json)

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)

    @classmethod
    def of(cls, r: FamilyResult) -> FamilyScope:
        return cls(
            r.name,
            r.n_tested,
            r.n_untestable,
            float(r.alpha),
            _f(r.resolution),
            r.resolution_unit,
            bool(r.rejected),
            r.label,
            r.verdict_line,
            r.resolution_note,
            bool(r.claims),
            r.unresolved,
            bool(r.exact_rejected),
        )

    @property
    def ran(self) -> bool:
        return self.n_tested > 0

    def to_dict(self) -> dict[str, Any]:
        skip = ("verdict_line", "claims", "unresolved", "exact_rejected")
        out = {k: v for k, v in vars(self).items() if k not in skip}
        if self.claims:
            out["claims"] = True
        if self.unresolved:
            out["unresolved"] = self.unresolved
        if self.verdict_line:
            out["verdict_line"] = self.verdict_line
        return {**out, "ran": self.ran}


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
    # the rejections above by family label (cell-positions, trie nodes, length tables: the
    # families whose tests belong to a config), so the table says what it counts
    rejections_by_family: tuple[tuple[str, int], ...] = ()


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
    # it emitted a token with target probability 0 and no black-box family (cells, trie,
    # sequence, lengths) rejected it: the support check is certain for a support bug whatever
    # its TV, and the white-box PIT of a zero-probability token is a point mass, so such a kill
    # shows nothing about the tests' power against TV-sized bugs (``claims.power_claim``)
    support_only: bool = False
    # ``rejections`` by family label, every family that reported (run-level ones included:
    # white-box, the sequence family's pooled statistics), so a headline's count reconciles
    rejections_by_family: tuple[tuple[str, int], ...] = ()
    # a null arm that is the reference engine's own plain decode on other seeds (its name;
    # ``plan.Arm.null_engine``), None: spectest's exact sampler on the built-in engine
    null_engine: str | None = None

    @property
    def exact_rejected(self) -> bool:
        """A test exact at any numerics rejected: support, white-box or reported-p."""
        return self.support_only or any(f.exact_rejected for f in self.families)

    @property
    def is_tooth(self) -> bool:
        return self.role in ("null", "eps", "mutant")

    @property
    def tested_anything(self) -> bool:
        """At least one family ran on enough data (without families: a cell was tested); a
        family whose tests rest on an engine's reports (``claims``: the rounds) does not count,
        so a fabricated readout can add a rejection but never make a pass."""
        if self.families:
            return any(f.ran and not f.claims for f in self.families)
        return self.cells_tested > 0

    # A tooth's judgement (the verdict's teeth are their comparisons): a null must pass, ε arms
    # and mutants must be killed (rejected); one that tested nothing did not behave.
    @property
    def ran(self) -> bool:
        """A tooth ran on testable data (a rejection always tested something)."""
        return self.tested_anything or self.rejected

    @property
    def sound(self) -> bool:
        """A null that ran and did not reject; an ε arm or mutant that rejected; an ε arm that
        cannot bite that did not reject (its law is the exact sampler's: a rejection is a false
        alarm)."""
        if self.cannot_bite is not None:
            return not self.rejected
        return (self.ran and not self.rejected) if self.expect == "pass" else self.rejected

    @property
    def killed(self) -> bool:
        """An ε arm or mutant that can bite and was rejected: it shows the tests' power."""
        return self.expect == "fail" and self.cannot_bite is None and self.rejected

    @property
    def rejected_by_support(self) -> bool:
        """A tooth that can bite rejected by the support check alone (a token of target
        probability 0): it claims no power."""
        return self.support_only and self.rejected and self.cannot_bite is None

    @property
    def null_words(self) -> str:
        """What a null compared: ``hf-generate plain vs plain, disjoint seeds`` (a plain null),
        else ``spectest's exact sampler vs the reference``."""
        if self.null_engine is not None:
            return f"{self.null_engine} plain vs plain, disjoint seeds"
        return "spectest's exact sampler vs the reference"

    @property
    def null_rejection(self) -> str:
        """Rule 1's reason line for this null (or ε arm that cannot bite) when it rejected; a
        plain null's names the engine, whose draws on disjoint seeds were then not one law."""
        if self.null_engine is None:
            what = "null arm" if self.cannot_bite is None else "tooth (one that cannot bite)"
            return f"{what} {self.arm!r} rejected: the harness's false-alarm control failed"
        return (
            f"null arm ({self.null_words}) {self.arm!r} rejected: {self.null_engine}'s plain "
            "draws on disjoint seeds are not one law (its seeding does not give independent "
            "draws, or its law moves between requests), or the harness's false-alarm control "
            "failed"
        )

    @property
    def size_label(self) -> str:
        """``size 0.167`` (exact), ``size ≤ 0.148`` (an upper bound) or ``size unknown``."""
        if self.size_tv is None:
            return "size unknown"
        return f"size {self.size_tv:.3g}" if self.size_exact else f"size ≤ {self.size_tv:.3g}"

    @property
    def label(self) -> str:
        """How the verdict names a tooth's outcome."""
        if self.cannot_bite is not None:
            return "REJECTED (a false alarm: it cannot bite)" if self.rejected else "cannot bite"
        if not self.ran and not self.rejected:
            return "NO DATA (tested nothing)"
        if self.expect == "pass":
            return "passed (sound)" if self.sound else "REJECTED (unsound)"
        if self.sound and self.rejected_by_support:  # say why it claims nothing
            return (
                f"killed ({self.size_label}; by the support check only: a token of target "
                "probability 0, so it claims no power)"
            )
        return f"{'killed' if self.sound else 'NOT KILLED'} ({self.size_label})"

    def tooth_dict(self) -> dict[str, Any]:
        """A tooth as ``summary.json``'s ``verdict.teeth`` lists it."""
        return {
            **pick(self, "arm role expect rejected sound ran label cannot_bite size_tv size_exact"),
            "support_only": self.rejected_by_support,
            **({} if self.null_engine is None else {"null_engine": self.null_engine}),
        }


def pick(obj: Any, names: str) -> dict[str, Any]:
    """``{name: obj.name}`` for each of the space-separated ``names``, in their order."""
    return {k: getattr(obj, k) for k in names.split()}


def _f(x: Any) -> float | None:
    """A finite float, or None (NaN / missing) — JSON-safe."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def compare_arm(
    analysis: Analysis,
    arm: Arm,
    rounds: pd.DataFrame | None = None,
    sizes: pd.DataFrame | None = None,
) -> Comparison:
    """One ``stats.battery.Analysis`` of ``arm`` (a ``plan.Arm``) as the verdict sees it.

    ``failing`` merges every family's failing rows, most significant first; ``rejections``
    counts them all; ``by_config`` the cell-position table's configs. ``rounds`` (every arm's):
    an ε arm's ``eps_cannot_bite``; ``sizes`` (``tooth_sizes.parquet``): a sized tooth's size.
    """

    from spectest.sampling.mutants import eps_of
    from spectest.tooth_size import size_of

    eps = eps_of(arm.variant) if arm.role == "eps" else None
    bite = None
    if eps is not None and rounds is not None and len(rounds):
        bite = eps_cannot_bite(eps, rounds[rounds[schema.ARM] == arm.name])
    size = size_of(sizes, arm.name) if arm.is_sized else None
    results = tuple(analysis.families.values())
    failing = sorted((f for r in results for f in r.failing), key=lambda f: f.key)
    cells = analysis.table("cells")
    p_adj = cells["p_adj"].astype(float) if len(cells) else None
    return Comparison(
        arm=arm.name,
        role=arm.role,
        expect=arm.expect,
        rejected=bool(analysis.rejected),
        cells_tested=int(analysis.n_tested),
        rejections=len(failing),
        min_qvalue=_f(p_adj.min()) if p_adj is not None and p_adj.notna().any() else None,
        mde_tv=_f(analysis.mde_tv),
        failing=tuple(f.line for f in failing),
        by_config=_by_config(cells, results),
        control_failed=bool(analysis.control_failed),
        cells_untestable=int(analysis.n_untestable),
        families=tuple(FamilyScope.of(r) for r in results if r.reported),
        alpha=float(analysis.options.alpha),
        power=float(analysis.options.power),
        mde_tv_max=_f(analysis.mde_tv_max),
        cannot_bite=bite,
        size_tv=None if size is None else size.tv,
        size_exact=False if size is None else bool(size.exact),
        size_where=None if size is None else size.where,
        support_only=bool(analysis.support_violation)
        and not any(r.rejected for r in results if r.black_box),
        rejections_by_family=tuple((r.label, len(r.failing)) for r in results if r.reported),
        null_engine=arm.null_engine,
    )


def _by_config(cells: pd.DataFrame, results: Sequence[FamilyResult]) -> tuple[ConfigStats, ...]:
    """One ``ConfigStats`` per sampling config of the cell-position table; its rejections are
    the failing rows of every family that belong to that config, also counted by family."""
    per_family = {
        r.label: Counter(f.config_id for f in r.failing if f.config_id is not None) for r in results
    }
    per_config: Counter[Any] = Counter()
    for counts in per_family.values():
        per_config.update(counts)
    out = []
    for cid, g in cells.groupby("config_id", sort=False) if len(cells) else ():
        ok = g["status"] == "ok"
        exc = g["tv_excess"].astype(float)
        where = None
        max_exc = None
        if exc.notna().any():
            i = exc.idxmax()
            max_exc = _f(exc.loc[i])
            where = f"{g.loc[i, 'prompt_id']}@{int(g.loc[i, 'position'])}"
        mde = g.loc[ok, "mde_tv"].astype(float).dropna()
        out.append(
            ConfigStats(
                config_id=str(cid),
                cells_tested=int(ok.sum()),
                cells_untestable=int((~ok).sum()),
                rejections=per_config.get(cid, 0),
                max_tv_excess=max_exc,
                max_tv_where=where,
                mde_tv=_f(mde.median()) if len(mde) else None,
                rejections_by_family=tuple(
                    (label, n[cid]) for label, n in per_family.items() if n.get(cid)
                ),
            )
        )
    return tuple(out)


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
