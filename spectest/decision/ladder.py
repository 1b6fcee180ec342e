"""The decision ladder: one rung per rule (docs/verdict.md "Decision rules"), ``climb``, the exit
codes (``EXIT``), and the ``Scope`` the rungs read and the verdict states. The details:
docs/internals.md "spectest/decision/ladder.py".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from spectest.decision.claims import pct
from spectest.errors import ExitCode
from spectest.stats.drift import in_units as _num
from spectest.stats.drift import margin_words as _margin
from spectest.stats.drift import to_resolve

if TYPE_CHECKING:
    from spectest.decision.claims import PowerClaim
    from spectest.decision.comparison import Comparison, FamilyScope
    from spectest.stats.drift import DriftResult

Decision = Literal["equivalent", "different", "inconclusive", "sound"]


Reason = tuple[str, str]  # (short: may head the headline, "" if not; long: the reason line)
Rung = tuple[bool, list[Reason]]  # (fires, its reasons)


def _fires(short: str, long: str) -> Rung:
    """A rung that fires with one reason."""
    return True, [(short, long)]


@dataclass(frozen=True)
class Scope:
    """What the verdict is a claim about, and what the rungs read: the main comparison (the
    candidate, else the first; its cells and families at the run's α and power), the teeth, the
    power claim against its requirement, and claim (b) (``drift``: required when ``matched``,
    matched numerics mode, or ``floor``, a floor arm's claim from tokens)."""

    cand: Comparison | None
    main: Comparison | None  # the candidate, else the first comparison (the control's arm)
    teeth: tuple[Comparison, ...]  # every tooth, judged (``Comparison.sound``)
    claim: PowerClaim | None  # the power claim (a run with a candidate)
    required: float  # the per-cell TV the claim must meet (``claims.required_resolution``)
    requirement: str  # where that comes from: "protocol" | "--max-mde-tv" | "default"
    kind: str = "run"  # run | teeth | compare: the wording of the no-teeth note only
    drift: DriftResult | None = None  # claim (b)
    matched: bool = False
    floor: bool = False

    @property
    def nothing(self) -> bool:
        c = self.cand
        return c is not None and not c.tested_anything and not c.rejected

    @property
    def low_power(self) -> bool:
        c = self.claim
        return c is not None and (c.tv is None or c.tv > self.required)

    @property
    def claim_lines(self) -> tuple[str, ...]:
        """The two claims' own lines (claim (a), claim (b)) in matched numerics mode or beside
        a floor arm; () otherwise."""
        c, matched = self.cand, self.matched
        if c is None or not (matched or self.floor):
            return ()
        routes = ", ".join(f.label for f in c.families if f.ran) or "no family ran"
        a = "differs" if c.rejected else "no difference found"
        if c.rejected and not (matched or c.exact_rejected):
            a = (
                "not shown: only families that see numerics differ (black-box, or white-box "
                "through a teacher), as numerics alone can (claim b decides)"
            )
        against = (
            "against the matched reference (spectest's exact sampler in the same loop, disjoint "
            "seeds)"
            if matched
            else "against plain decode (the black-box families see numerics too, and so does the "
            "white-box family through a teacher; on the engine's own p it is exact in any dtype)"
        )
        line_a = (
            f"sampler exact given the engine's numerics: {a} (claim a) — {against}; families: "
            f"{routes}"
        )
        d = self.drift
        return (line_a, d.line if d is not None else "numerics drift: not measured (claim b)")

    def tested_line(self) -> str:
        m = self.main
        tested, untestable = (m.cells_tested, m.cells_untestable) if m else (0, 0)
        fams = ", ".join(f"{f.label} ({f.n_tested})" for f in self.families if f.ran) or "none"
        teeth = ", ".join(self._teeth_ran) or "none"
        return (
            f"tested: {tested} of {tested + untestable} cell-positions "
            f"({untestable} untestable); families that ran: {fams}; "
            f"teeth that ran: {teeth}"
        )

    def resolution_line(self) -> str:
        m = self.main
        head = f"resolution (α {m.alpha:g}, power {pct(m.power)}): " if m and m.alpha else ""
        parts = []
        if m is not None and m.mde_tv is not None:
            worst = f", worst {m.mde_tv_max:.3f}" if m.mde_tv_max is not None else ""
            parts.append(f"per-cell TV {m.mde_tv:.3f} (median{worst})")
        else:
            parts.append("per-cell TV unknown (no cell-position tested)")
        for f in self.families:
            if f.name != "cells" and f.ran and f.mde is not None:
                note = f" ({f.mde_note})" if f.mde_note else ""
                parts.append(f"{f.label} {_mass(f.mde)} {f.mde_unit}{note}")
        if self.claim is not None:
            parts.append(f"power claim {self.claim.where()}")
        parts.append(f"required per-cell TV ≤ {self.required:g} ({self.requirement})")
        return head + "; ".join(parts)

    @property
    def families(self) -> tuple[FamilyScope, ...]:
        """The main comparison's families."""
        return self.main.families if self.main is not None else ()

    @property
    def _teeth_ran(self) -> list[str]:
        return [t.arm for t in self.teeth if t.ran]

    def to_dict(self) -> dict[str, Any]:
        m = self.main
        extra = {"claims": list(self.claim_lines)} if self.claim_lines else {}
        return {
            "cells_tested": m.cells_tested if m else 0,
            "cells_untestable": m.cells_untestable if m else 0,
            "families": [f.to_dict() for f in self.families],
            "teeth_ran": self._teeth_ran,
            "alpha": m.alpha if m else None,
            "power": m.power if m else None,
            "mde_tv": m.mde_tv if m else None,
            "mde_tv_max": m.mde_tv_max if m else None,
            "required_mde_tv": self.required,
            "requirement": self.requirement,
            "power_claim": self.claim.to_dict() if self.claim is not None else None,
            "tested": self.tested_line(),
            "resolution": self.resolution_line(),
            **extra,
        }


MASS_FLOOR = 1e-6  # below the precision of the probabilities a resolution is stated as a floor


def _mass(x: float) -> str:
    """A family's resolution (a probability mass or TV) as printed: one below ``MASS_FLOOR``
    (a white-box excess of 1.34e-84 on a near-degenerate law) claims precision the float32
    probabilities it comes from do not have, so it prints as "< 1e-06"."""
    return f"< {MASS_FLOOR:g}" if 0 <= x < MASS_FLOOR else f"{x:.3g}"


def _controls_failed(run: Scope) -> Rung:
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


def _candidate_rejected(run: Scope) -> Rung:
    """Rule 2: the candidate rejects — evidence whatever the power."""
    c = run.cand
    if c is None or not c.rejected:
        return False, []
    first = c.failing[0] if c.failing else "?"
    if not rejection_counts(run):
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


def rejection_counts(run: Scope) -> bool:
    """Whether the candidate's rejection decides (rule 2): beside a floor arm only an exact one."""
    c = run.cand
    return c is not None and c.rejected and (not run.floor or c.exact_rejected)


def _drift_beyond(run: Scope) -> Rung:
    """Rule 2b: claim (b) fails (drift beyond the numerics floor plus the margin, at α)."""
    d = run.drift
    if d is None or d.decision != "beyond" or run.cand is None:
        return False, []
    return _fires(
        "drift beyond numerics",
        f"drift beyond numerics (claim b): D = drift − floor {_num(d, d.statistic)} > margin "
        f"{_margin(d)} (lower bound {_num(d, d.lcb)} at {1 - d.alpha:.0%})",
    )


def _drift_unresolved(run: Scope) -> Rung:
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
        f"{_num(d, d.ucb)}] straddles the margin {_margin(d)}: {_narrowing(d, run.matched)}",
    )


def _narrowing(d: DriftResult, matched: bool) -> str:
    """What narrows an unresolved claim (b): in matched mode the settings and about how far
    (``stats.drift.to_resolve``); teacher-forced, ``arms.floor.sequences``; beside a floor arm,
    the arms' seeds."""
    from spectest.stats.teacher_forced import TeacherForcedResult
    from spectest.stats.token_floor import TokenFloorResult

    if isinstance(d, TeacherForcedResult):
        return "more sequences narrow it: arms.floor.sequences (per cell, at most the seeds)"
    if isinstance(d, TokenFloorResult):
        return (
            "more sequences narrow it: seeds.per_arm (the candidate's) and "
            "seeds.reference_per_arm (the reference's and the floor arm's)"
        )
    k = to_resolve(d) if matched else None
    parts = []
    if k is not None and d.floor_kind == "batch" and k[1] > 1:
        floor = math.ceil(d.n_floor * k[1])
        parts.append(f"tests.numerics_floor_sequences about {floor} ({d.n_floor} now)")
    if k is not None and k[0] > 1:
        parts.append(f"tests.numerics_sequences about {k[0]:.1f}× its value ({d.n_sequences} now)")
    if not parts:
        return "more sequences narrow it"
    return (
        f"more sequences narrow it: {' and '.join(parts)} would resolve it were D to stay at "
        f'{_num(d, d.statistic)} (docs/numerics.md "How many sequences")'
    )


def _claim_a_unresolved(run: Scope) -> Rung:
    """Rule 3e: a candidate family cannot decide its claim (``FamilyResult.unresolved``)."""
    why = [f.unresolved for f in run.cand.families if f.unresolved] if run.cand else []
    return bool(why), [("claim (a) unresolved: too many tokens left out", w) for w in why]


def _nothing_tested(run: Scope) -> Rung:
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


def _teeth_misbehaved(run: Scope) -> Rung:
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


def _power_short(run: Scope) -> Rung:
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


def _no_teeth(run: Scope) -> Rung:
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


# The decision ladder (docs/verdict.md "Decision rules"), top rung first (``climb``).
LADDER: tuple[tuple[Callable[[Scope], Rung], Decision], ...] = (
    (_controls_failed, "inconclusive"),  # 1
    (_candidate_rejected, "different"),  # 2
    (_drift_beyond, "different"),  # 2b
    (_nothing_tested, "inconclusive"),  # 3a
    (_teeth_misbehaved, "inconclusive"),  # 3b
    (_power_short, "inconclusive"),  # 3c
    (_drift_unresolved, "inconclusive"),  # 3d
    (_claim_a_unresolved, "inconclusive"),  # 3e
)
NOTES = (_no_teeth,)
EXIT: dict[Decision, ExitCode] = {
    "equivalent": ExitCode.OK,
    "sound": ExitCode.OK,
    "different": ExitCode.DIFFERENT,
    "inconclusive": ExitCode.INCONCLUSIVE,
}


def climb(run: Scope) -> tuple[Decision, list[Reason]]:
    """The first rung of ``LADDER`` that fires decides (none: rule 4); every rung adds its
    reasons in ladder order, then the notes."""
    reasons: list[Reason] = []
    decision: Decision | None = None
    for rung, outcome in LADDER:
        fires, found = rung(run)
        reasons += found
        if fires and decision is None:
            decision = outcome
    for note in NOTES:
        reasons += note(run)[1]
    if decision is None:  # rule 4
        decision = "equivalent" if run.cand is not None else "sound"
    return decision, reasons
