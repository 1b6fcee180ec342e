"""The decision: every arm's comparison plus the teeth → one ``Verdict`` (headline, claims,
scope, exit code) by the decision ladder ``decide``. The rules: docs/verdict.md "Decision rules";
the details: docs/internals.md "spectest/verdict.py".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spectest.comparison import (
    Comparison,
    ConfigStats,
    FamilyScope,
    summarize_comparison,
)
from spectest.errors import ExitCode
from spectest.stats.drift import in_units as _num
from spectest.stats.drift import margin_words as _margin
from spectest.verdict_types import Decision, PowerClaim, Scope, ToothVerdict, Verdict

if TYPE_CHECKING:
    from spectest.stats.drift import DriftResult

__all__ = [
    "DEFAULT_MAX_MDE_TV",
    "Comparison",
    "ConfigStats",
    "Decision",
    "FamilyScope",
    "PowerClaim",
    "Scope",
    "ToothVerdict",
    "Verdict",
    "decide",
    "judge_tooth",
    "power_claim",
    "required_resolution",
    "summarize_comparison",
]

DEFAULT_MAX_MDE_TV = 0.15  # the required per-cell TV when the protocol states none (docstring)


def judge_tooth(c: Comparison) -> ToothVerdict:
    """A null is sound when it tested something and did not reject; an ε arm or mutant when it
    rejected (a rejection always tested something); an ε arm that cannot bite when it did not
    reject (its law is the exact sampler's: a rejection is a false alarm)."""
    assert c.is_tooth, c
    ran = c.tested_anything or c.rejected
    if c.cannot_bite is not None:
        sound = not c.rejected
    else:
        sound = (ran and not c.rejected) if c.expect == "pass" else c.rejected
    return ToothVerdict(
        arm=c.arm,
        role=c.role,
        expect=c.expect,
        rejected=c.rejected,
        sound=sound,
        ran=ran,
        cannot_bite=c.cannot_bite,
        size_tv=c.size_tv,
        size_exact=c.size_exact,
        support_only=bool(c.support_only and c.rejected and c.cannot_bite is None),
        null_engine=c.null_engine,
    )


def required_resolution(max_mde_tv: float | None = None, *, kind: str = "run") -> tuple[float, str]:
    """The per-cell TV the power claim must meet (rule 3c) and where that comes from: the
    protocol's ``max_mde_tv`` (``compare``: ``--max-mde-tv``), else ``DEFAULT_MAX_MDE_TV``.
    ``decide`` and a sequential run's looks both use it."""
    if max_mde_tv is not None:
        return float(max_mde_tv), "protocol" if kind != "compare" else "--max-mde-tv"
    return DEFAULT_MAX_MDE_TV, "default"


def power_claim(comparisons: Sequence[Comparison]) -> PowerClaim:
    """The run's power claim (rule 3c): the candidate's median per-cell MDE (None when no
    cell-position was tested), with the weakest killed tooth of known size below it attached as
    an example (``PowerClaim.tooth``), never as the claim.

    Notes
    -----
    A tooth that cannot bite, was not killed, has no size, or was rejected by the support check
    alone (``Comparison.support_only``) gives no example. Why: docs/verdict.md
    "The power claim and its requirement (rule 3c) — they always apply".
    """
    cand = next((c for c in comparisons if c.role == "candidate"), None)
    mde = None if cand is None or cand.mde_tv is None else float(cand.mde_tv)
    sized = [
        (float(c.size_tv), c)
        for c in comparisons
        if c.is_tooth and judge_tooth(c).killed and c.size_tv is not None and not c.support_only
    ]
    below = [(tv, c) for tv, c in sized if mde is None or tv < mde]
    source = "mde" if mde is not None else "none"
    if not below:
        return PowerClaim(mde, source)
    tv, best = min(below, key=lambda x: x[0])
    return PowerClaim(mde, source, best.arm, bool(best.size_exact), tv)


Reason = tuple[str, str]  # (short: may head the headline, "" if not; long: the reason line)
Rung = tuple[bool, list[Reason]]  # (fires, its reasons)


def _fires(short: str, long: str) -> Rung:
    """A rung that fires with one reason."""
    return True, [(short, long)]


@dataclass(frozen=True)
class _Run:
    """What the rungs of the decision ladder read."""

    cand: Comparison | None
    main: Comparison | None  # the candidate, else the first comparison (the control's arm)
    teeth: tuple[ToothVerdict, ...]
    claim: PowerClaim | None
    required: float
    requirement: str
    kind: str
    drift: DriftResult | None = None  # claim (b)
    matched: bool = False
    floor: bool = False  # claim (b) from tokens against a floor arm: required too

    @property
    def nothing(self) -> bool:
        c = self.cand
        return c is not None and not c.tested_anything and not c.rejected

    @property
    def low_power(self) -> bool:
        c = self.claim
        return c is not None and (c.tv is None or c.tv > self.required)


def _controls_failed(run: _Run) -> Rung:
    """Rule 1: the white-box control, a null arm or a tooth that cannot bite rejected."""
    out: list[Reason] = []
    control_bad = run.main is not None and run.main.control_failed
    if control_bad:
        out.append(
            (
                "the white-box control failed",
                "white-box control failed: a test of the plain reference arm against "
                "spectest's own p_t rejected",
            )
        )
    null_bad = [t for t in run.teeth if t.expect == "pass" and t.ran and not t.sound]
    null_bad += [t for t in run.teeth if t.cannot_bite is not None and t.rejected]
    for t in null_bad:
        short = "a null arm rejected" if t.cannot_bite is None else f"tooth {t.arm!r} rejected"
        out.append((short, t.null_rejection))
    return bool(control_bad or null_bad), out


def _candidate_rejected(run: _Run) -> Rung:
    """Rule 2: the candidate rejects — evidence whatever the power."""
    c = run.cand
    if c is None or not c.rejected:
        return False, []
    first = c.failing[0] if c.failing else "?"
    if not _rejection_counts(run):
        return False, [
            (
                "",
                f"black-box difference from plain decode (not a decision with a floor arm: the "
                f"black-box families, and the white-box one through a teacher, see numerics too; "
                f"claim (b) decides whether the token law's "
                f"distance is numerics-sized): {c.rejections} rejection(s), most significant: "
                f"{first}",
            )
        ]
    return _fires(
        "the candidate's law differs from the reference's",
        f"candidate differs from the reference: {c.rejections} rejection(s) after correction, "
        f"most significant: {first}",
    )


def _rejection_counts(run: _Run) -> bool:
    """Whether the candidate's rejection decides (rule 2): beside a floor arm only an exact one."""
    c = run.cand
    return c is not None and c.rejected and (not run.floor or c.exact_rejected)


def _drift_beyond(run: _Run) -> Rung:
    """Rule 2b: claim (b) fails (drift beyond the numerics floor plus the margin, at α)."""
    d = run.drift
    if d is None or d.decision != "beyond" or run.cand is None:
        return False, []
    return _fires(
        "drift beyond numerics",
        f"drift beyond numerics (claim b): D = drift − floor {_num(d, d.statistic)} > margin "
        f"{_margin(d)} (lower bound {_num(d, d.lcb)} at {1 - d.alpha:.0%})",
    )


def _drift_unresolved(run: _Run) -> Rung:
    """Rule 3d: claim (b) is required (matched mode, a floor arm) and undecided: not measured,
    its bounds straddle the margin, or (teacher-forced) too many tokens were left out."""
    if not (run.matched or run.floor) or run.cand is None:
        return False, []
    d = run.drift
    if d is None:
        why = (
            "the floor arm and the reference share no (prompt, config, position) with two "
            "tokens or more on every side"
            if run.floor
            else "no sequence of the matched arm could be replayed (its rounds are missing, or "
            "every sequence ended early)"
        )
        return _fires(
            "numerics drift not measured", f"numerics drift not measured (claim b): {why}"
        )
    if d.decision != "unresolved":
        return False, []
    if why := getattr(d, "unresolved_why", ""):
        return _fires("numerics drift unresolved: too many tokens left out", why)
    return _fires(
        "numerics drift unresolved",
        f"numerics drift unresolved (claim b): D = drift − floor in [{_num(d, d.lcb)}, "
        f"{_num(d, d.ucb)}] straddles the margin {_margin(d)}: more sequences narrow it",
    )


def _claim_a_unresolved(run: _Run) -> Rung:
    """Rule 3e: a candidate family cannot decide its claim (``FamilyResult.unresolved``)."""
    why = [f.unresolved for f in run.cand.families if f.unresolved] if run.cand else []
    return bool(why), [("claim (a) unresolved: too many tokens left out", w) for w in why]


def _nothing_tested(run: _Run) -> Rung:
    """Rule 3a: no test family of the candidate ran on enough data."""
    if not run.nothing or run.cand is None:
        return False, []
    n = run.cand.cells_tested + run.cand.cells_untestable
    return _fires(
        "nothing was testable",
        f"nothing was testable: 0 of {n} cell-positions had enough samples "
        "(pooled χ² needs an expected count ≥ 5 per arm in two bins or more), and no trie "
        "node, sequence-level, white-box or sequence-length test ran on enough data: no "
        "difference could have been seen, so none is claimed",
    )


def _teeth_misbehaved(run: _Run) -> Rung:
    """Rule 3b: a tooth tested nothing, or an ε arm / mutant that can bite was not killed; a
    tooth that cannot bite is reported and decides nothing."""
    no_data = [t for t in run.teeth if not t.ran and t.cannot_bite is None]
    unkilled = [
        t
        for t in run.teeth
        if t.expect == "fail" and t.ran and not t.sound and t.cannot_bite is None
    ]
    out: list[Reason] = [
        (
            f"tooth {t.arm!r} tested nothing",
            f"tooth {t.arm!r} ran on no testable data: it checked nothing (every cell "
            "untestable at its seeds)",
        )
        for t in no_data
    ]
    out += [
        ("", f"tooth {t.arm!r} cannot bite: {t.cannot_bite}")
        for t in run.teeth
        if t.cannot_bite is not None and not t.rejected
    ]
    out += [
        (
            f"tooth {t.arm!r} was not killed",
            f"tooth {t.arm!r} was not killed: the tests cannot see that bug at this size",
        )
        for t in unkilled
    ]
    return bool(no_data or unkilled), out


def _power_short(run: _Run) -> Rung:
    """Rule 3c: the power claim is unknown or worse than the requirement."""
    c = run.claim
    if not run.low_power or c is None or (run.nothing and c.tv is None):
        return run.low_power, []
    req = f"{run.required:g} ({run.requirement})"
    shape = (
        f"; the killed tooth {c.tooth} ({c.size_words()} {c.tooth_tv:.3g}) shows only bugs of "
        "its own shape, and exit 0 needs the MDE, a bound for every shape"
        if c.tooth is not None and c.tooth_tv is not None
        else ""
    )
    if c.tv is None:
        return _fires(
            "no cell-position was testable, so there is no power claim",
            "no power claim: no cell-position was tested, so no per-cell MDE exists and the "
            f"required per-cell TV ≤ {req} cannot be checked{shape}",
        )
    return _fires(
        f"resolution TV {c.tv:.3f} per cell is worse than the required {run.required:g}",
        f"power too low: the power claim, MDE (TV) {c.tv:.4f} per cell, > required "
        f"{run.required:.4f} ({run.requirement}); only differences that large are shown to be "
        f"seen{shape}",
    )


def _no_teeth(run: _Run) -> Rung:
    """A note, not a rung: a run with a candidate and no teeth says so."""
    if run.cand is None or run.teeth:
        return False, []
    what = (
        "compare has samples only, no sampler to mutate"
        if run.kind == "compare"
        else "the protocol switched them off"
    )
    return False, [
        (
            "no teeth ran",
            f"no teeth ran ({what}): no null arm checked the false-alarm rate and no ε arm or "
            "mutant showed that these tests catch a bug of a given size here; the per-cell MDE is "
            "the only power claim",
        )
    ]


# The decision ladder (docs/verdict.md "Decision rules"), top rung first (``_climb``).
_LADDER: tuple[tuple[Callable[[_Run], Rung], Decision], ...] = (
    (_controls_failed, "inconclusive"),  # 1
    (_candidate_rejected, "different"),  # 2
    (_drift_beyond, "different"),  # 2b
    (_nothing_tested, "inconclusive"),  # 3a
    (_teeth_misbehaved, "inconclusive"),  # 3b
    (_power_short, "inconclusive"),  # 3c
    (_drift_unresolved, "inconclusive"),  # 3d
    (_claim_a_unresolved, "inconclusive"),  # 3e
)
_NOTES = (_no_teeth,)
_EXIT: dict[Decision, ExitCode] = {
    "equivalent": ExitCode.OK,
    "sound": ExitCode.OK,
    "different": ExitCode.DIFFERENT,
    "inconclusive": ExitCode.INCONCLUSIVE,
}


def decide(
    comparisons: Sequence[Comparison],
    *,
    max_mde_tv: float | None = None,
    kind: str = "run",
    drift: DriftResult | None = None,
    matched: bool = False,
    floor: bool = False,
) -> Verdict:
    """The ``Verdict`` of ``comparisons`` (every non-reference arm against the reference, at
    most one candidate) by the decision ladder ``_LADDER`` (docs/verdict.md "Decision rules").

    Parameters
    ----------
    max_mde_tv : the protocol's power requirement (None: ``required_resolution``'s default).
    kind : "run", "teeth" or "compare": the wording of the no-teeth note only.
    drift : claim (b)'s result (None: not measured); required when ``matched`` (the
        comparisons are against the matched arm) or ``floor`` (a floor arm's token claim).
    """
    cands = [c for c in comparisons if c.role == "candidate"]
    assert len(cands) <= 1, "one candidate per run"
    cand = cands[0] if cands else None
    required, requirement = required_resolution(max_mde_tv, kind=kind)
    run = _Run(
        cand=cand,
        main=cand if cand is not None else (comparisons[0] if comparisons else None),
        teeth=tuple(judge_tooth(c) for c in comparisons if c.is_tooth),
        claim=power_claim(comparisons) if cand is not None else None,
        required=required,
        requirement=requirement,
        kind=kind,
        drift=drift,
        matched=matched,
        floor=floor,
    )
    decision, reasons = _climb(run)
    mde = cand.mde_tv if cand is not None else None
    scope = _scope(run, mde)
    if (matched or floor) and cand is not None:
        scope = replace(scope, claims=_claim_lines(cand, drift, matched))
    return Verdict(
        decision=decision,
        exit_code=_EXIT[decision],
        reasons=tuple(r for _, r in _lead(decision, run, reasons)),
        candidate=cand,
        teeth=run.teeth,
        mde_tv=mde,
        max_mde_tv=required,
        headline=_headline(decision, run, reasons, scope),
        scope=scope,
        claim=run.claim,
        drift=drift,
    )


def _climb(run: _Run) -> tuple[Decision, list[Reason]]:
    """The first rung of ``_LADDER`` that fires decides (none: rule 4); every rung adds its
    reasons in ladder order, then the notes."""
    reasons: list[Reason] = []
    decision: Decision | None = None
    for rung, outcome in _LADDER:
        fires, found = rung(run)
        reasons += found
        if fires and decision is None:
            decision = outcome
    for note in _NOTES:
        reasons += note(run)[1]
    if decision is None:  # rule 4
        decision = "equivalent" if run.cand is not None else "sound"
    return decision, reasons


def _claim_lines(
    cand: Comparison, drift: DriftResult | None, matched: bool = True
) -> tuple[str, ...]:
    """The two claims of matched numerics mode or of a floor arm, one line each."""
    routes = ", ".join(f.label for f in cand.families if f.ran) or "no family ran"
    a = "differs" if cand.rejected else "no difference found"
    if cand.rejected and not (matched or cand.exact_rejected):
        a = (
            "not shown: only families that see numerics differ (black-box, or white-box through "
            "a teacher), as numerics alone can (claim b decides)"
        )
    against = (
        "against the matched reference (spectest's exact sampler in the same loop, disjoint seeds)"
        if matched
        else "against plain decode (the black-box families see numerics too; the white-box "
        "family, where it ran, is exact in any dtype)"
    )
    line_a = (
        f"sampler exact given the engine's numerics: {a} (claim a) — {against}; families: {routes}"
    )
    line_b = drift.line if drift is not None else "numerics drift: not measured (claim b)"
    return (line_a, line_b)


def _lead(decision: Decision, run: _Run, reasons: list[Reason]) -> list[Reason]:
    """A run that passes opens its reasons with the teeth's account."""
    if decision == "equivalent" and run.teeth:
        return [("", "the teeth are sound: " + _teeth_summary(run.teeth)), *reasons]
    if decision == "sound":
        return [("", "every tooth behaved: " + _teeth_summary(run.teeth)), *reasons]
    return reasons


def _headline(decision: Decision, run: _Run, reasons: list[Reason], scope: Scope) -> str:
    """The decision, its exit code and the claim (or the first reason that may head it)."""
    code = int(_EXIT[decision])
    if decision == "equivalent":
        assert run.claim is not None and run.claim.tv is not None
        found = "no difference found"
        if run.floor and run.cand is not None and run.cand.rejected:  # demoted: numerics-sized
            found = "no difference beyond numerics (the black-box difference is within claim b)"
        head = f"EQUIVALENT (exit {code}): {found}: {run.claim.seen(scope.power)}"
        if run.matched and run.drift is not None:
            head += f"; numerics drift {run.drift.drift:.4f} per token within numerics"
        elif run.floor and run.drift is not None:
            head += f"; {getattr(run.drift, 'headline_words', 'numerics drift within numerics')}"
        return head
    if decision == "sound":
        return f"SOUND (exit {code}): every tooth behaved"
    if decision == "different":
        if run.cand is not None and not _rejection_counts(run):  # claim (b) alone failed
            return f"DIFFERENT (exit {code}): drift beyond numerics (claim b)"
        if run.matched:
            return (
                f"DIFFERENT (exit {code}): the candidate's law differs from the matched "
                "reference's: the sampler is not exact given the engine's numerics (claim a)"
            )
        return f"DIFFERENT (exit {code}): the candidate's law differs from the reference's"
    short = next(s for s, _ in reasons if s)
    return f"{decision.upper()} (exit {code}): {short}"


def _teeth_summary(teeth: Sequence[ToothVerdict]) -> str:
    return ", ".join(f"{t.arm} {t.label}" for t in teeth)


def _scope(run: _Run, mde: float | None) -> Scope:
    """What was tested (the main comparison's cells, families, α, power) and how finely."""
    main, teeth = run.main, run.teeth
    return Scope(
        cells_tested=main.cells_tested if main is not None else 0,
        cells_untestable=main.cells_untestable if main is not None else 0,
        families=main.families if main is not None else (),
        teeth=tuple(t.arm for t in teeth if t.ran),
        alpha=main.alpha if main is not None else None,
        power=main.power if main is not None else None,
        mde_tv=mde if mde is not None else (main.mde_tv if main is not None else None),
        mde_tv_max=main.mde_tv_max if main is not None else None,
        required_mde_tv=run.required,
        requirement=run.requirement,
        claim=run.claim,
    )
