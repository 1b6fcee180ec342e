"""The verdict: ``decide`` → ``Verdict`` (decision, exit code, headline, reasons, scope). The
rules: docs/verdict.md "Decision rules"; the details: docs/internals.md
"spectest/decision/verdict.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spectest.decision.claims import PowerClaim, power_claim, required_resolution
from spectest.decision.comparison import Comparison
from spectest.decision.ladder import EXIT, Decision, Reason, Scope, climb, rejection_counts
from spectest.errors import ExitCode

if TYPE_CHECKING:
    from spectest.stats.drift import DriftResult


@dataclass(frozen=True)
class Verdict:
    """The run's decision and exit code, with every reason that led to it, its headline and
    its ``Scope`` (the candidate, the teeth, the power claim, claim (b))."""

    decision: Decision
    exit_code: ExitCode
    reasons: tuple[str, ...]
    headline: str
    scope: Scope

    @property
    def candidate(self) -> Comparison | None:
        return self.scope.cand

    @property
    def teeth(self) -> tuple[Comparison, ...]:
        return self.scope.teeth

    @property
    def claim(self) -> PowerClaim | None:
        """The power claim checked against ``max_mde_tv``."""
        return self.scope.claim

    @property
    def max_mde_tv(self) -> float:
        """The requirement that was applied (the protocol's or the default)."""
        return self.scope.required

    @property
    def power_ok(self) -> bool | None:
        """The power claim meets the requirement (None: no candidate, or the claim unknown)."""
        if self.claim is None or self.claim.tv is None:
            return None
        return self.claim.tv <= self.max_mde_tv

    def to_dict(self) -> dict:
        return {
            "decision": self.decision,
            "exit_code": int(self.exit_code),
            "headline": self.headline,
            "reasons": list(self.reasons),
            "mde_tv": self.candidate.mde_tv if self.candidate is not None else None,
            "max_mde_tv": self.max_mde_tv,
            "power_ok": self.power_ok,
            "power_claim": self.claim.to_dict() if self.claim is not None else None,
            "scope": self.scope.to_dict(),
            **({"numerics": d.to_dict()} if (d := self.scope.drift) is not None else {}),
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
    scope = Scope(
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
    decision, reasons = climb(scope)
    return Verdict(
        decision=decision,
        exit_code=EXIT[decision],
        reasons=tuple(r for _, r in _lead(decision, scope, reasons)),
        headline=_headline(decision, scope, reasons),
        scope=scope,
    )


def _lead(decision: Decision, run: Scope, reasons: list[Reason]) -> list[Reason]:
    """A run that passes opens its reasons with the teeth's account."""
    if decision == "equivalent" and run.teeth:
        return [("", "the teeth are sound: " + _teeth_summary(run.teeth)), *reasons]
    if decision == "sound":
        return [("", "every tooth behaved: " + _teeth_summary(run.teeth)), *reasons]
    return reasons


def _headline(decision: Decision, run: Scope, reasons: list[Reason]) -> str:
    """The decision, its exit code and the claim (or the first reason that may head it)."""
    code = int(EXIT[decision])
    if decision == "equivalent":
        assert run.cand is not None and run.claim is not None and run.claim.tv is not None
        found = "no difference found"
        if run.floor and run.cand is not None and run.cand.rejected:  # demoted: numerics-sized
            found = "no difference beyond numerics (the black-box difference is within claim b)"
        head = f"EQUIVALENT (exit {code}): {found}: {run.claim.seen(run.cand.power)}"
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
