"""The verdict's types and their wording, which every renderer prints: ``Verdict``, ``Scope``,
``PowerClaim`` and ``ToothVerdict``, each with ``to_dict`` for summary.json.

The why and the details: docs/internals.md "spectest/verdict_types.py".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from spectest.comparison import Comparison, FamilyScope
from spectest.errors import ExitCode

Decision = Literal["equivalent", "different", "inconclusive", "sound"]


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
    cannot_bite: str | None = None  # an ε arm whose law is the exact sampler's in this run
    size_tv: float | None = None  # an ε arm's / mutant's size (``spectest.tooth_size``)
    size_exact: bool = False
    # killed by the support check alone (a token of target probability 0): claims no power
    support_only: bool = False
    null_engine: str | None = None  # a plain null's engine (``Comparison.null_engine``)

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
    def killed(self) -> bool:
        """An ε arm or mutant that can bite and was rejected: it shows the tests' power."""
        return self.expect == "fail" and self.cannot_bite is None and self.rejected

    @property
    def size_label(self) -> str:
        """``size 0.167`` (exact), ``size ≤ 0.148`` (an upper bound) or ``size unknown``."""
        if self.size_tv is None:
            return "size unknown"
        return f"size {self.size_tv:.3g}" if self.size_exact else f"size ≤ {self.size_tv:.3g}"

    @property
    def label(self) -> str:
        if self.cannot_bite is not None:
            return "REJECTED (a false alarm: it cannot bite)" if self.rejected else "cannot bite"
        if not self.ran and not self.rejected:
            return "NO DATA (tested nothing)"
        if self.expect == "pass":
            return "passed (sound)" if self.sound else "REJECTED (unsound)"
        if self.sound and self.support_only:  # say why it claims nothing
            return (
                f"killed ({self.size_label}; by the support check only: a token of target "
                "probability 0, so it claims no power)"
            )
        return f"{'killed' if self.sound else 'NOT KILLED'} ({self.size_label})"


MASS_FLOOR = 1e-6  # below the precision of the probabilities a resolution is stated as a floor


def _mass(x: float) -> str:
    """A family's resolution (a probability mass or TV) as printed: one below ``MASS_FLOOR``
    (a white-box excess of 1.34e-84 on a near-degenerate law) claims precision the float32
    probabilities it comes from do not have, so it prints as "< 1e-06"."""
    return f"< {MASS_FLOOR:g}" if 0 <= x < MASS_FLOOR else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:g} %"


@dataclass(frozen=True)
class PowerClaim:
    """The run's power claim R (rule 3c): the candidate's median per-cell MDE — the smallest
    per-cell TV that any difference, whatever its shape, would have been seen at with the run's
    power; ``tv`` None when no cell-position was tested. The weakest killed tooth of known size
    (``tooth``, ``tooth_tv``) is stated beside it, as what it is: evidence by example that bugs
    *of its shape* of that size were seen (a tooth never stands in for the MDE)."""

    tv: float | None
    source: str  # "mde" | "none"
    tooth: str | None = None  # the weakest killed tooth of known size below the MDE, if any
    exact: bool = False  # its size is exact (else an upper bound)
    tooth_tv: float | None = None  # its size

    def size_words(self) -> str:
        return "exact size" if self.exact else "size ≤"

    def example(self) -> str:
        """``bugs like eps=0.5 of exact size 0.167 were seen too`` (empty when no tooth)."""
        if self.tooth is None or self.tooth_tv is None:
            return ""
        size = f"exact size {self.tooth_tv:.3g}" if self.exact else f"size ≤ {self.tooth_tv:.3g}"
        return f"bugs like the killed tooth {self.tooth}, of {size}, were seen too"

    def seen(self, power: float | None) -> str:
        """The claim as the headline states it."""
        ex = f"; {self.example()}" if self.example() else ""
        if self.tv is None:
            return "no per-cell TV is claimed" + ex
        return (
            f"a per-cell TV of {self.tv:.3f} or more would have been seen with {_pct(power)} "
            f"power{ex}"
        )

    def where(self) -> str:
        """Where the claim comes from, for the resolution line and the reasons."""
        ex = f" ({self.example()}: its shape only)" if self.example() else ""
        if self.tv is None:
            return "unknown (no cell-position tested: no power claim)" + ex
        return f"per-cell TV {self.tv:.3f} from the median MDE" + ex

    def to_dict(self) -> dict[str, Any]:
        return {
            "tv": self.tv,
            "source": self.source,
            "tooth": self.tooth,
            "exact": self.exact,
            "tooth_tv": self.tooth_tv,
        }


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
        head = f"resolution (α {self.alpha:g}, power {_pct(self.power)}): " if self.alpha else ""
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
    teeth: tuple[ToothVerdict, ...]
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
            "teeth": [
                {
                    "arm": t.arm,
                    "role": t.role,
                    "expect": t.expect,
                    "rejected": t.rejected,
                    "sound": t.sound,
                    "ran": t.ran,
                    "label": t.label,
                    "cannot_bite": t.cannot_bite,
                    "size_tv": t.size_tv,
                    "size_exact": t.size_exact,
                    "support_only": t.support_only,
                    **({} if t.null_engine is None else {"null_engine": t.null_engine}),
                }
                for t in self.teeth
            ],
        }
