"""The decision: test results of each arm against the reference, plus the teeth → one verdict,
stated as a claim with its scope (what was tested) and its resolution (what could have been seen).

Owns: what counts as a tooth that bit, what counts as "tested", the power claim and the
requirement it must meet, the order in which reasons override one another, the exit code, and
the verdict's wording (``Verdict.headline``, ``Scope.tested_line`` / ``Scope.resolution_line``:
every renderer prints these, so the console, summary.json, the reports, JUnit and the CI summary
say the same thing). Knows nothing about how the tests were computed: it reads the
per-comparison summary (``spectest.comparison.Comparison``, with one ``FamilyScope`` per test
family, and a tooth's size from ``spectest.tooth_size``) that ``summarize_comparison`` extracts
from an ``Analysis`` (both re-exported here).

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
      trie node or chain with enough sequences, no sequence-level test whose permutation p-value
      can reach its level, no white-box test, no testable length table — ``spectest.comparison``);
   b. a tooth the protocol asks for did not run on enough data (it tested nothing — a null arm
      that "passes" on no data checked nothing), or an ε arm / mutant was not killed — unless
      the ε arm *cannot bite* in this run (``Comparison.cannot_bite``: it accepted no drafted
      token, so its law is the exact sampler's; ``comparison.eps_cannot_bite``). Such a tooth
      is reported, shows no power, and does not count for rule 3c; if it *rejects*, that is a
      false alarm like a null arm's (rule 1);
   c. the power claim R does not meet the requirement: R is worse than the required per-cell
      TV, or unknown (no cell-position tested and no killed tooth of known size).
4. Otherwise **equivalent (0)**: no difference found, at the stated power claim.

The power claim and its requirement (rule 3c) — they always apply
-----------------------------------------------------------------
The **power claim** R (``power_claim``) is the smallest per-cell TV the run shows it would have
seen: the candidate's median per-cell MDE (the resolution of the token χ² per cell-position at
the run's α and power), or the size of the weakest killed tooth whose size is known, whichever
is smaller. A tooth's size is its largest per-cell-position TV from plain sampling, computed
exactly (or bounded from above, never below) by ``spectest.tooth_size`` from the run's own
models; a killed tooth shows power only against bugs at least as large as itself, so a gross
mutant killed says nothing about a subtle one, and a tooth of unknown size claims nothing.
The **requirement** (``required_resolution``) is the protocol's ``tests.power.max_mde_tv``
(``compare``: ``--max-mde-tv``) when set, else ``DEFAULT_MAX_MDE_TV`` (0.15) — always: teeth
add evidence, they never waive the requirement. Exit 0 needs R known and R ≤ the requirement,
and the headline states R and where it came from ("a per-cell TV of 0.211 or more would have
been seen with 80 % power" from the MDE; "..., as the killed tooth eps=0.5 of exact size 0.167
shows" from a tooth). 0.15 lies below the exact TV of the catalogued mutants except ε = 0.1,
bf16_ratio and bonus_wrong_row with a one-hot drafter (results/LOG.md): a gate that cannot see
0.15 cannot see most real sampler bugs. Why exit 3 and not an exit-0 verdict that carries the
resolution ("no difference found at TV ≥ 0.28"): a CI merge gate reads the exit code only, and a
wrong sampler must not merge because the files were too small to see it — or because a gate's
seed count was lowered by mistake while a gross tooth was still killed. ``--max-mde-tv 1`` (or
the protocol's field) accepts any claim explicitly; the verdict line still states it.
``compare`` has no teeth, so its claim is the MDE.

Switching every tooth off is allowed (the protocol then asks for none): such a run says so in its
reasons ("no teeth ran ...") and its claim is the MDE. So the issue-9 input ``--set
teeth.null_arm=false --set teeth.mutants=[] --set tests.whitebox=false --seeds 2 --set
candidate=always_accept`` is inconclusive twice over: nothing is testable at 2 seeds.

A teeth-only run (``spectest teeth``, no candidate) decides **sound (0)** or **inconclusive (3)**
by rules 1 and 3b; it claims no power (its teeth table states each tooth's size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from spectest.comparison import (
    FAMILY_LABELS,
    Comparison,
    ConfigStats,
    FamilyScope,
    summarize_comparison,
)
from spectest.errors import ExitCode

__all__ = [
    "DEFAULT_MAX_MDE_TV",
    "FAMILY_LABELS",
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

Decision = Literal["equivalent", "different", "inconclusive", "sound"]
DEFAULT_MAX_MDE_TV = 0.15  # the required per-cell TV when the protocol states none (docstring)


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
        return f"{'killed' if self.sound else 'NOT KILLED'} ({self.size_label})"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:g} %"


@dataclass(frozen=True)
class PowerClaim:
    """The run's power claim R (rule 3c): the smallest per-cell TV the run shows it would have
    seen — the candidate's median per-cell MDE, or the size of the weakest killed tooth whose
    size is known, whichever is smaller; ``tv`` None when neither is known."""

    tv: float | None
    source: str  # "mde" | "tooth" | "none"
    tooth: str | None = None  # the killed tooth's arm (source "tooth")
    exact: bool = False  # the tooth's size is exact (else an upper bound)

    def size_words(self) -> str:
        return "exact size" if self.exact else "size ≤"

    def seen(self, power: float | None) -> str:
        """The claim as the headline states it."""
        if self.tv is None:
            return "no per-cell TV is claimed"
        if self.source == "tooth":
            size = f"exact size {self.tv:.3g}" if self.exact else f"size ≤ {self.tv:.3g}"
            return (
                f"a per-cell TV of {self.tv:.3g} or more would have been seen, as the killed "
                f"tooth {self.tooth} of {size} shows"
            )
        return (
            f"a per-cell TV of {self.tv:.3f} or more would have been seen with {_pct(power)} power"
        )

    def where(self) -> str:
        """Where the claim comes from, for the resolution line and the reasons."""
        if self.tv is None:
            return "unknown (no cell-position tested and no killed tooth of known size)"
        if self.source == "tooth":
            kind = "exact size" if self.exact else "size, an upper bound"
            return f"per-cell TV {self.tv:.3g} from the killed tooth {self.tooth} ({kind})"
        return f"per-cell TV {self.tv:.3f} from the median MDE"

    def to_dict(self) -> dict[str, Any]:
        return {"tv": self.tv, "source": self.source, "tooth": self.tooth, "exact": self.exact}


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
        if self.claim is not None:
            parts.append(f"power claim {self.claim.where()}")
        if self.required_mde_tv is not None:
            parts.append(f"required per-cell TV ≤ {self.required_mde_tv:g} ({self.requirement})")
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
            "power_claim": self.claim.to_dict() if self.claim is not None else None,
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
    claim: PowerClaim | None = None  # the power claim checked against ``max_mde_tv``

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
                }
                for t in self.teeth
            ],
        }


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
        arm=c.arm, role=c.role, expect=c.expect, rejected=c.rejected, sound=sound, ran=ran,
        cannot_bite=c.cannot_bite, size_tv=c.size_tv, size_exact=c.size_exact,
    )  # fmt: skip


def _nothing_tested(c: Comparison) -> str:
    n = c.cells_tested + c.cells_untestable
    return (
        f"nothing was testable: 0 of {n} cell-positions had enough samples "
        "(pooled χ² needs an expected count ≥ 5 per arm in two bins or more), and no trie "
        "node, sequence-level, white-box or sequence-length test ran on enough data: no "
        "difference could have been seen, so none is claimed"
    )


def required_resolution(max_mde_tv: float | None = None, *, kind: str = "run") -> tuple[float, str]:
    """The per-cell TV the power claim must meet (rule 3c) and where the requirement comes from:
    the protocol's ``max_mde_tv`` (``compare``: ``--max-mde-tv``) when set, else
    ``DEFAULT_MAX_MDE_TV`` — always: teeth add evidence (``power_claim``), they never waive it.
    ``decide`` and the stop rule of a sequential run's looks (``spectest.sequential``) both use
    it, so a run stops "resolved" exactly when the verdict would accept its claim."""
    if max_mde_tv is not None:
        return float(max_mde_tv), "protocol" if kind != "compare" else "--max-mde-tv"
    return DEFAULT_MAX_MDE_TV, "default"


def power_claim(comparisons: Sequence[Comparison]) -> PowerClaim:
    """The run's power claim R (rule 3c): the candidate's median per-cell MDE, or the size of
    the weakest (smallest) killed tooth whose size is known (``Comparison.size_tv``), whichever
    is smaller (the MDE on a tie); unknown when neither exists. A tooth that cannot bite, one
    that was not killed, or one of unknown size claims nothing. ``decide`` and a sequential
    run's looks both use it.

    Notes
    -----
    The MDE is a worst-case statement (any difference of that TV in a cell-position is seen with
    the run's power); a killed tooth's size is evidence by example (a bug of that per-cell TV
    *was* seen, in this very run, by some family — possibly the white-box or sequence tests
    rather than the per-cell χ²). Its size is computed (or bounded from above) by
    ``spectest.tooth_size`` from the run's own models, and the claim is only as good as that
    size: a stated size is never below the tooth's true largest per-cell-position TV.
    """
    cand = next((c for c in comparisons if c.role == "candidate"), None)
    best = PowerClaim(None, "none")
    if cand is not None and cand.mde_tv is not None:
        best = PowerClaim(float(cand.mde_tv), "mde")
    for c in comparisons:
        t = judge_tooth(c) if c.is_tooth else None
        if t is None or not t.killed or c.size_tv is None:
            continue
        if best.tv is None or c.size_tv < best.tv:
            best = PowerClaim(float(c.size_tv), "tooth", c.arm, bool(c.size_exact))
    return best


def decide(
    comparisons: Sequence[Comparison], *, max_mde_tv: float | None = None, kind: str = "run"
) -> Verdict:
    """Apply the decision rules of the module docstring.

    Parameters
    ----------
    comparisons : every non-reference arm against the reference (at most one candidate).
    max_mde_tv : the protocol's power requirement (``None`` = none set: ``DEFAULT_MAX_MDE_TV``
        applies, whatever the teeth; ``required_resolution``).
    kind : "run", "teeth", "compare" — for the wording of the no-teeth reason only.
    """
    cands = [c for c in comparisons if c.role == "candidate"]
    assert len(cands) <= 1, "one candidate per run"
    cand = cands[0] if cands else None
    tooth_comps = [c for c in comparisons if c.is_tooth]
    teeth = tuple(judge_tooth(c) for c in tooth_comps)
    null_bad = [t for t in teeth if t.expect == "pass" and t.ran and not t.sound]
    toothless = [t for t in teeth if t.cannot_bite is not None]
    null_bad += [t for t in toothless if t.rejected]
    no_data = [t for t in teeth if not t.ran and t.cannot_bite is None]
    main = cand if cand is not None else (comparisons[0] if comparisons else None)
    control_bad = main is not None and main.control_failed
    unkilled = [
        t for t in teeth if t.expect == "fail" and t.ran and not t.sound and t.cannot_bite is None
    ]
    mde = cand.mde_tv if cand is not None else None
    required, requirement = required_resolution(max_mde_tv, kind=kind)
    claim = power_claim(comparisons) if cand is not None else None
    nothing = cand is not None and not cand.tested_anything and not cand.rejected
    low_power = claim is not None and (claim.tv is None or claim.tv > required)

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
        what = "null arm" if t.cannot_bite is None else "tooth (one that cannot bite)"
        reasons.append(
            (
                "a null arm rejected" if t.cannot_bite is None else f"tooth {t.arm!r} rejected",
                f"{what} {t.arm!r} rejected: the harness's false-alarm control failed",
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
    for t in toothless:
        if not t.rejected:
            reasons.append(("", f"tooth {t.arm!r} cannot bite: {t.cannot_bite}"))
    for t in unkilled:
        reasons.append(
            (
                f"tooth {t.arm!r} was not killed",
                f"tooth {t.arm!r} was not killed: the tests cannot see that bug at this size",
            )
        )
    if low_power and claim is not None and (not nothing or claim.tv is not None):
        if claim.tv is None:
            killed = any(t.killed for t in teeth)
            reasons.append(
                (
                    "no cell-position was testable"
                    + (" and no killed tooth has a known size" if killed else "")
                    + ", so the resolution is unknown",
                    "resolution unknown: no cell-position was tested and no killed tooth has a "
                    f"known size, so the required per-cell TV ≤ {required:g} ({requirement}) "
                    "cannot be checked",
                )
            )
        else:
            what = (
                f"the killed tooth {claim.tooth}'s {claim.size_words()} {claim.tv:.4f}"
                if claim.source == "tooth"
                else f"MDE (TV) {claim.tv:.4f}"
            )
            reasons.append(
                (
                    f"resolution TV {claim.tv:.3f} per cell is worse than the required "
                    f"{required:g}",
                    f"power too low: the power claim, {what} per cell, > required "
                    f"{required:.4f} ({requirement}); only differences that large are shown "
                    "to be seen",
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
                "the per-cell MDE is the only power claim",
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
    scope = _scope(main, teeth, mde, required, requirement, claim)
    if decision == "equivalent":
        assert claim is not None and claim.tv is not None
        ok_line = f"no difference found: {claim.seen(scope.power)}"
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
        claim=claim,
    )


def _teeth_summary(teeth: Sequence[ToothVerdict]) -> str:
    return ", ".join(f"{t.arm} {t.label}" for t in teeth)


def _scope(
    main: Comparison | None,
    teeth: Sequence[ToothVerdict],
    mde: float | None,
    required: float | None,
    requirement: str,
    claim: PowerClaim | None = None,
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
        claim=claim,
    )
