"""The verdict: ``decide`` turns every arm's ``Comparison`` (the teeth among them) into one
``Verdict`` — the decision and exit code by the ladder (``ladder.climb``), its headline, its
reasons, its ``Scope`` (what was tested, at what resolution, the claims' lines) — each with
``to_dict`` for summary.json. The rules: docs/verdict.md "Decision rules"; the details:
docs/internals.md "spectest/decision/verdict.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spectest.decision.claims import PowerClaim, pct, power_claim, required_resolution
from spectest.decision.comparison import Comparison, FamilyScope
from spectest.decision.ladder import EXIT, Decision, Reason, RunFacts, climb, rejection_counts
from spectest.errors import ExitCode

if TYPE_CHECKING:
    from spectest.stats.drift import DriftResult


MASS_FLOOR = 1e-6  # below the precision of the probabilities a resolution is stated as a floor


def _mass(x: float) -> str:
    """A family's resolution (a probability mass or TV) as printed: one below ``MASS_FLOOR``
    (a white-box excess of 1.34e-84 on a near-degenerate law) claims precision the float32
    probabilities it comes from do not have, so it prints as "< 1e-06"."""
    return f"< {MASS_FLOOR:g}" if 0 <= x < MASS_FLOOR else f"{x:.3g}"


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
    requirement: str  # "protocol" | "--max-mde-tv" | "default"
    claim: PowerClaim | None = None  # the power claim (a run with a candidate)
    # the two claims' own lines in matched numerics mode (claim (a), claim (b))
    claims: tuple[str, ...] = ()

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
        head = f"resolution (α {self.alpha:g}, power {pct(self.power)}): " if self.alpha else ""
        parts = []
        if self.mde_tv is not None:
            worst = f", worst {self.mde_tv_max:.3f}" if self.mde_tv_max is not None else ""
            parts.append(f"per-cell TV {self.mde_tv:.3f} (median{worst})")
        else:
            parts.append("per-cell TV unknown (no cell-position tested)")
        for f in self.families:
            if f.name != "cells" and f.ran and f.mde is not None:
                note = f" ({f.mde_note})" if f.mde_note else ""
                parts.append(f"{f.label} {_mass(f.mde)} {f.mde_unit}{note}")
        if self.claim is not None:
            parts.append(f"power claim {self.claim.where()}")
        if self.required_mde_tv is not None:
            parts.append(f"required per-cell TV ≤ {self.required_mde_tv:g} ({self.requirement})")
        return head + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        extra = {"claims": list(self.claims)} if self.claims else {}  # matched mode only
        return {
            "cells_tested": self.cells_tested,
            "cells_untestable": self.cells_untestable,
            "families": [f.to_dict() for f in self.families],
            "teeth_ran": list(self.teeth),
            "alpha": self.alpha,
            "power": self.power,
            "mde_tv": self.mde_tv,
            "mde_tv_max": self.mde_tv_max,
            "required_mde_tv": self.required_mde_tv,
            "requirement": self.requirement,
            "power_claim": self.claim.to_dict() if self.claim is not None else None,
            "tested": self.tested_line(),
            "resolution": self.resolution_line(),
            **extra,
        }


@dataclass(frozen=True)
class Verdict:
    """The run's decision and exit code, with every reason that led to it and its scope."""

    decision: Decision
    exit_code: ExitCode
    reasons: tuple[str, ...]
    candidate: Comparison | None
    teeth: tuple[Comparison, ...]  # the teeth, each judged (``Comparison.sound``)
    mde_tv: float | None
    max_mde_tv: float | None  # the requirement that was applied (protocol's or the default)
    headline: str = ""
    scope: Scope | None = None
    claim: PowerClaim | None = None  # the power claim checked against ``max_mde_tv``
    drift: Any = None  # claim (b): a ``stats.drift.DriftResult`` (matched numerics mode)

    @property
    def power_ok(self) -> bool | None:
        """The power claim meets the requirement (None: no candidate, or the claim unknown)."""
        if self.max_mde_tv is None or self.claim is None or self.claim.tv is None:
            return None
        return self.claim.tv <= self.max_mde_tv

    def to_dict(self) -> dict:
        return {
            "decision": self.decision,
            "exit_code": int(self.exit_code),
            "headline": self.headline,
            "reasons": list(self.reasons),
            "mde_tv": self.mde_tv,
            "max_mde_tv": self.max_mde_tv,
            "power_ok": self.power_ok,
            "power_claim": self.claim.to_dict() if self.claim is not None else None,
            "scope": self.scope.to_dict() if self.scope is not None else None,
            **({"numerics": self.drift.to_dict()} if self.drift is not None else {}),
            "teeth": [t.tooth_dict() for t in self.teeth],
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
    most one candidate) by the decision ladder ``ladder.LADDER`` (docs/verdict.md "Decision rules").

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
    run = RunFacts(
        cand=cand,
        main=cand if cand is not None else (comparisons[0] if comparisons else None),
        teeth=tuple(c for c in comparisons if c.is_tooth),
        claim=power_claim(comparisons) if cand is not None else None,
        required=required,
        requirement=requirement,
        kind=kind,
        drift=drift,
        matched=matched,
        floor=floor,
    )
    decision, reasons = climb(run)
    mde = cand.mde_tv if cand is not None else None
    scope = _scope(run, mde)
    if (matched or floor) and cand is not None:
        scope = replace(scope, claims=_claim_lines(cand, drift, matched))
    return Verdict(
        decision=decision,
        exit_code=EXIT[decision],
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


def _claim_lines(
    cand: Comparison, drift: DriftResult | None, matched: bool = True
) -> tuple[str, ...]:
    """The two claims of matched numerics mode or of a floor arm, one line each."""
    routes = ", ".join(f.label for f in cand.families if f.ran) or "no family ran"
    a = "differs" if cand.rejected else "no difference found"
    if cand.rejected and not (matched or cand.exact_rejected):
        a = "not shown: only black-box families differ, as numerics alone can (claim b decides)"
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


def _lead(decision: Decision, run: RunFacts, reasons: list[Reason]) -> list[Reason]:
    """A run that passes opens its reasons with the teeth's account."""
    if decision == "equivalent" and run.teeth:
        return [("", "the teeth are sound: " + _teeth_summary(run.teeth)), *reasons]
    if decision == "sound":
        return [("", "every tooth behaved: " + _teeth_summary(run.teeth)), *reasons]
    return reasons


def _headline(decision: Decision, run: RunFacts, reasons: list[Reason], scope: Scope) -> str:
    """The decision, its exit code and the claim (or the first reason that may head it)."""
    code = int(EXIT[decision])
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
        if run.cand is not None and not rejection_counts(run):  # claim (b) alone failed
            return f"DIFFERENT (exit {code}): drift beyond numerics (claim b)"
        if run.matched:
            return (
                f"DIFFERENT (exit {code}): the candidate's law differs from the matched "
                "reference's: the sampler is not exact given the engine's numerics (claim a)"
            )
        return f"DIFFERENT (exit {code}): the candidate's law differs from the reference's"
    short = next(s for s, _ in reasons if s)
    return f"{decision.upper()} (exit {code}): {short}"


def _teeth_summary(teeth: Sequence[Comparison]) -> str:
    return ", ".join(f"{t.arm} {t.label}" for t in teeth)


def _scope(run: RunFacts, mde: float | None) -> Scope:
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
