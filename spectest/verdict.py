"""The decision: test results of each arm against the reference, plus the teeth → one verdict,
stated as a claim with its scope (what was tested) and its resolution (what could have been seen).

Owns: what counts as a tooth that bit, what counts as "tested", the power requirement that
applies when no tooth shows the tests' power, the order in which reasons override one another,
the exit code, and the verdict's wording (``Verdict.headline``, ``Scope.tested_line`` /
``Scope.resolution_line``: every renderer prints these, so the console, summary.json, the
reports, JUnit and the CI summary say the same thing). Knows nothing about how the tests were
computed: it reads the per-comparison summary (``Comparison``, with one ``FamilyScope`` per test
family) that ``summarize_comparison`` extracts from an ``Analysis``.

Decision rules (the exit codes of ``spectest.errors.ExitCode``)
---------------------------------------------------------------
1. A null arm (the exact sampler on seeds disjoint from the reference's) that rejects means the
   harness's false-alarm control failed for this run: **inconclusive (3)**, whatever the
   candidate did — a rejection of the candidate cannot be trusted when the null rejects too.
   So does a white-box test of the *reference* (plain) arm that rejects in the main comparison
   (the candidate's, else the first tooth's): spectest's own p_t would then be wrong.
2. Otherwise, a candidate that rejects: **different (1)**. A rejection is evidence whatever the
   power: an unkilled mutant says the test is weak, not that a detection is false.
3. Otherwise, **inconclusive (3)** when "no difference found" would claim more than was tested:
   a. nothing was tested: no test family ran on enough data (every cell-position untestable, no
      trie node or chain with enough sequences, no white-box test, no testable length table);
   b. a tooth the protocol asks for did not run on enough data (it tested nothing — a null arm
      that "passes" on no data checked nothing), or an ε arm / mutant was not killed;
   c. the resolution is worse than required: the median per-cell MDE (TV) exceeds the required
      ``max_mde_tv``, or no cell-position was tested so the resolution is unknown.
4. Otherwise **equivalent (0)**: no difference found, at the stated resolution.

The power requirement (rule 3c)
-------------------------------
Power evidence comes from teeth (an ε arm or mutant that the tests killed shows they see a bug of
that size in this very run) or from the resolution (the MDE). The required ``max_mde_tv`` is the
protocol's ``tests.power.max_mde_tv`` (``compare``: ``--max-mde-tv``) when set. When it is not set
and no tooth that must be killed ran — the protocol switched every ε and mutant off, or the run is
a ``compare``, which has samples only and no sampler to mutate — ``DEFAULT_MAX_MDE_TV`` (0.15)
applies: without teeth the resolution is the only check that "no difference" means anything.
0.15 lies below the exact TV of the catalogued mutants except ε = 0.1, bf16_ratio and
bonus_wrong_row with a one-hot drafter (results/LOG.md): a gate that cannot see 0.15 cannot
see most real sampler bugs. Why exit 3 and not an exit-0 verdict that carries the resolution
("no difference found at TV ≥ 0.28"): a CI merge gate reads the exit code only, and a wrong
sampler must not merge because the files were too small to see it. ``--max-mde-tv 1`` (or the
protocol's field) accepts any resolution explicitly; the verdict line still states it.

Switching every tooth off is allowed (the protocol then asks for none): such a run says so in its
reasons ("no teeth ran ...") and falls under the default requirement above. So the issue-9 input
``--set teeth.null_arm=false --set teeth.mutants=[] --set tests.whitebox=false --seeds 2
--set candidate=always_accept`` is inconclusive twice over: nothing is testable at 2 seeds.

A teeth-only run (``spectest teeth``, no candidate) decides **sound (0)** or **inconclusive (3)**
by rules 1 and 3b.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from spectest.errors import ExitCode

Decision = Literal["equivalent", "different", "inconclusive", "sound"]
DEFAULT_MAX_MDE_TV = 0.15  # required resolution when no tooth shows the tests' power (docstring)
FAMILY_LABELS = {
    "cells": "token χ² per cell-position",
    "trie": "prefix trie",
    "whitebox": "white-box",
    "lengths": "sequence lengths",
}


@dataclass(frozen=True)
class FamilyScope:
    """What one test family of one comparison actually tested, and at what resolution.

    ``alpha`` is the family's share of the run's α (0 when the family was not active); ``mde``
    the smallest effect one of its tests detects with the run's power at the per-test level a
    lone bad cell faces, in ``mde_unit`` (None where the family has no closed-form MDE).
    """

    name: str  # cells | trie | whitebox | lengths
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

    @property
    def is_tooth(self) -> bool:
        return self.role in ("null", "eps", "mutant")

    @property
    def tested_anything(self) -> bool:
        """At least one family ran on enough data (without families: a cell was tested)."""
        if self.families:
            return any(f.ran for f in self.families)
        return self.cells_tested > 0


@dataclass(frozen=True)
class ToothVerdict:
    """Whether one tooth behaved: the null must pass, ε and mutants must be killed (rejected);
    a tooth that tested nothing did not behave (a null "passing" on no data checked nothing)."""

    arm: str
    role: str
    expect: str
    rejected: bool
    sound: bool
    ran: bool = True

    @property
    def label(self) -> str:
        if not self.ran and not self.rejected:
            return "NO DATA (tested nothing)"
        if self.expect == "pass":
            return "passed (sound)" if self.sound else "REJECTED (unsound)"
        return "killed" if self.sound else "NOT KILLED"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:g} %"


@dataclass(frozen=True)
class Scope:
    """What the verdict is a claim about: the main comparison's families and cells, the teeth
    that ran, and the resolution at the run's α and power (with the requirement applied)."""

    cells_tested: int
    cells_untestable: int
    families: tuple[FamilyScope, ...]
    teeth: tuple[str, ...]  # teeth that ran on enough data
    alpha: float | None
    power: float | None
    mde_tv: float | None  # median per-cell MDE (TV) of the candidate
    mde_tv_max: float | None
    required_mde_tv: float | None
    requirement: str  # "protocol" | "default (no teeth)" | "none"

    def tested_line(self) -> str:
        n = self.cells_tested + self.cells_untestable
        ran = [f for f in self.families if f.ran]
        fams = ", ".join(f"{f.label} ({f.n_tested})" for f in ran) or "none"
        teeth = ", ".join(self.teeth) if self.teeth else "none"
        return (
            f"tested: {self.cells_tested} of {n} cell-positions "
            f"({self.cells_untestable} untestable); families that ran: {fams}; "
            f"teeth that ran: {teeth}"
        )

    def resolution_line(self) -> str:
        head = f"resolution (α {self.alpha:g}, power {_pct(self.power)}): " if self.alpha else ""
        parts = []
        if self.mde_tv is not None:
            worst = f", worst {self.mde_tv_max:.3f}" if self.mde_tv_max is not None else ""
            parts.append(f"per-cell TV {self.mde_tv:.3f} (median{worst})")
        else:
            parts.append("per-cell TV unknown (no cell-position tested)")
        for f in self.families:
            if f.name != "cells" and f.ran and f.mde is not None:
                parts.append(f"{f.label} {f.mde:.3g} {f.mde_unit}")
        if self.required_mde_tv is not None:
            parts.append(f"required per-cell TV ≤ {self.required_mde_tv:g} ({self.requirement})")
        else:
            parts.append("no resolution required (teeth show the power)")
        return head + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cells_tested": self.cells_tested,
            "cells_untestable": self.cells_untestable,
            "families": [{**vars(f), "label": f.label, "ran": f.ran} for f in self.families],
            "teeth_ran": list(self.teeth),
            "alpha": self.alpha,
            "power": self.power,
            "mde_tv": self.mde_tv,
            "mde_tv_max": self.mde_tv_max,
            "required_mde_tv": self.required_mde_tv,
            "requirement": self.requirement,
            "tested": self.tested_line(),
            "resolution": self.resolution_line(),
        }


@dataclass(frozen=True)
class Verdict:
    """The run's decision and exit code, with every reason that led to it and its scope."""

    decision: Decision
    exit_code: ExitCode
    reasons: tuple[str, ...]
    candidate: Comparison | None
    teeth: tuple[ToothVerdict, ...]
    mde_tv: float | None
    max_mde_tv: float | None  # the requirement that was applied (protocol's or the default)
    headline: str = ""
    scope: Scope | None = None

    @property
    def power_ok(self) -> bool | None:
        if self.max_mde_tv is None or self.mde_tv is None:
            return None
        return self.mde_tv <= self.max_mde_tv

    def to_dict(self) -> dict:
        return {
            "decision": self.decision,
            "exit_code": int(self.exit_code),
            "headline": self.headline,
            "reasons": list(self.reasons),
            "mde_tv": self.mde_tv,
            "max_mde_tv": self.max_mde_tv,
            "power_ok": self.power_ok,
            "scope": self.scope.to_dict() if self.scope is not None else None,
            "teeth": [
                {
                    "arm": t.arm,
                    "role": t.role,
                    "expect": t.expect,
                    "rejected": t.rejected,
                    "sound": t.sound,
                    "ran": t.ran,
                    "label": t.label,
                }
                for t in self.teeth
            ],
        }


def judge_tooth(c: Comparison) -> ToothVerdict:
    """A null is sound when it tested something and did not reject; an ε arm or mutant when it
    rejected (a rejection always tested something)."""
    assert c.is_tooth, c
    ran = c.tested_anything or c.rejected
    sound = (ran and not c.rejected) if c.expect == "pass" else c.rejected
    return ToothVerdict(
        arm=c.arm, role=c.role, expect=c.expect, rejected=c.rejected, sound=sound, ran=ran
    )


def _nothing_tested(c: Comparison) -> str:
    n = c.cells_tested + c.cells_untestable
    return (
        f"nothing was testable: 0 of {n} cell-positions had enough samples "
        "(pooled χ² needs an expected count ≥ 5 per arm in two bins or more), and no trie "
        "node, white-box test or sequence-length table ran: no difference could have been "
        "seen, so none is claimed"
    )


def decide(
    comparisons: Sequence[Comparison], *, max_mde_tv: float | None = None, kind: str = "run"
) -> Verdict:
    """Apply the decision rules of the module docstring.

    Parameters
    ----------
    comparisons : every non-reference arm against the reference (at most one candidate).
    max_mde_tv : the protocol's power requirement (``None`` = none set: the default applies
        when no tooth that must be killed ran).
    kind : "run", "teeth", "compare" — for the wording of the no-teeth reason only.
    """
    cands = [c for c in comparisons if c.role == "candidate"]
    assert len(cands) <= 1, "one candidate per run"
    cand = cands[0] if cands else None
    tooth_comps = [c for c in comparisons if c.is_tooth]
    teeth = tuple(judge_tooth(c) for c in tooth_comps)
    null_bad = [t for t in teeth if t.expect == "pass" and t.ran and not t.sound]
    no_data = [t for t in teeth if not t.ran]
    main = cand if cand is not None else (comparisons[0] if comparisons else None)
    control_bad = main is not None and main.control_failed
    unkilled = [t for t in teeth if t.expect == "fail" and t.ran and not t.sound]
    killers = [t for t in teeth if t.expect == "fail"]
    mde = cand.mde_tv if cand is not None else None
    if max_mde_tv is not None:
        required, requirement = max_mde_tv, "protocol" if kind != "compare" else "--max-mde-tv"
    elif cand is not None and not killers:
        required, requirement = DEFAULT_MAX_MDE_TV, "default: no tooth shows the tests' power"
    else:
        required, requirement = None, "none"
    nothing = cand is not None and not cand.tested_anything and not cand.rejected
    low_power = cand is not None and required is not None and (mde is None or mde > required)

    # (short, long) reasons in the order of the rules; the headline uses the first short one
    reasons: list[tuple[str, str]] = []
    if control_bad:
        reasons.append(
            (
                "the white-box control failed",
                "white-box control failed: a test of the plain reference arm against "
                "spectest's own p_t rejected",
            )
        )
    for t in null_bad:
        reasons.append(
            (
                "a null arm rejected",
                f"null arm {t.arm!r} rejected: the harness's false-alarm control failed",
            )
        )
    if cand is not None and cand.rejected:
        first = cand.failing[0] if cand.failing else "?"
        reasons.append(
            (
                "the candidate's law differs from the reference's",
                f"candidate differs from the reference: {cand.rejections} rejection(s) "
                f"after correction, most significant: {first}",
            )
        )
    if nothing and cand is not None:
        reasons.append(("nothing was testable", _nothing_tested(cand)))
    for t in no_data:
        reasons.append(
            (
                f"tooth {t.arm!r} tested nothing",
                f"tooth {t.arm!r} ran on no testable data: it checked nothing (every cell "
                "untestable at its seeds)",
            )
        )
    for t in unkilled:
        reasons.append(
            (
                f"tooth {t.arm!r} was not killed",
                f"tooth {t.arm!r} was not killed: the tests cannot see that bug at this size",
            )
        )
    if low_power and not nothing:
        if mde is None:
            reasons.append(
                (
                    "the resolution is unknown",
                    f"resolution unknown: no cell-position was tested, so the required per-cell "
                    f"MDE (TV) ≤ {required:g} ({requirement}) cannot be checked",
                )
            )
        else:
            reasons.append(
                (
                    f"resolution TV {mde:.3f} per cell is worse than the required {required:g}",
                    f"power too low: MDE (TV) {mde:.4f} per cell > required {required:.4f} "
                    f"({requirement}); only differences that large could have been seen",
                )
            )
    if cand is not None and not tooth_comps:
        what = (
            "compare has samples only, no sampler to mutate"
            if kind == "compare"
            else "the protocol switched them off"
        )
        reasons.append(
            (
                "no teeth ran",
                f"no teeth ran ({what}): no null arm checked the false-alarm rate and no "
                "ε arm or mutant showed that these tests catch a bug of a given size here; "
                "the resolution requirement is the only power check",
            )
        )

    decision: Decision
    if null_bad or control_bad:
        decision, code = "inconclusive", ExitCode.INCONCLUSIVE
    elif cand is not None and cand.rejected:
        decision, code = "different", ExitCode.DIFFERENT
    elif nothing or no_data or unkilled or low_power:
        decision, code = "inconclusive", ExitCode.INCONCLUSIVE
    else:
        decision, code = ("equivalent" if cand is not None else "sound"), ExitCode.OK
    scope = _scope(main, teeth, mde, required, requirement)
    if decision == "equivalent":
        res = f"{mde:.3f}" if mde is not None else "?"
        ok_line = (
            "no difference found: a per-cell TV of "
            f"{res} or more would have been seen with {_pct(scope.power)} power"
        )
        if tooth_comps:
            reasons.insert(0, ("", "the teeth are sound: " + _teeth_summary(teeth)))
        headline = f"EQUIVALENT (exit 0): {ok_line}"
    elif decision == "sound":
        reasons.insert(0, ("", "every tooth behaved: " + _teeth_summary(teeth)))
        headline = "SOUND (exit 0): every tooth behaved"
    else:
        short = next(s for s, _ in reasons if s)
        if decision == "different":
            short = "the candidate's law differs from the reference's"
        headline = f"{decision.upper()} (exit {int(code)}): {short}"
    return Verdict(
        decision=decision,
        exit_code=code,
        reasons=tuple(r for _, r in reasons),
        candidate=cand,
        teeth=teeth,
        mde_tv=mde,
        max_mde_tv=required,
        headline=headline,
        scope=scope,
    )


def _teeth_summary(teeth: Sequence[ToothVerdict]) -> str:
    return ", ".join(f"{t.arm} {t.label}" for t in teeth)


def _scope(
    main: Comparison | None,
    teeth: Sequence[ToothVerdict],
    mde: float | None,
    required: float | None,
    requirement: str,
) -> Scope:
    return Scope(
        cells_tested=main.cells_tested if main is not None else 0,
        cells_untestable=main.cells_untestable if main is not None else 0,
        families=main.families if main is not None else (),
        teeth=tuple(t.arm for t in teeth if t.ran),
        alpha=main.alpha if main is not None else None,
        power=main.power if main is not None else None,
        mde_tv=mde if mde is not None else (main.mde_tv if main is not None else None),
        mde_tv_max=main.mde_tv_max if main is not None else None,
        required_mde_tv=required,
        requirement=requirement,
    )


# ------------------------------------------------------------------ Analysis → Comparison
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


def summarize_comparison(analysis: Any, *, arm: str, role: str, expect: str) -> Comparison:
    """Read one ``spectest.stats.analyze.Analysis`` into a ``Comparison``.

    Uses only the documented fields: ``rejected``, ``n_tested``, ``n_rejected``, ``mde_tv``,
    ``support_violation``, ``whitebox_control_failed`` and the tidy tables ``cells`` (status,
    reject, p_adj, tv_excess, mde_tv per prompt × config × position), ``trie`` (reject, p_adj
    per node) and ``whitebox`` (arm, test, reject, p_adj). ``rejections`` counts every rejected
    test of every family (cells, trie rows, the candidate's white-box tests, length tables).
    ``lengths`` / ``alpha_lengths`` / ``lengths_rejected`` (``spectest.stats.lengths``) are read
    when present.
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
        + (len(len_rej) if len_rej is not None else 0),
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
    )
