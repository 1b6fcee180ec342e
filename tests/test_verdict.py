"""The decision rules of ``spectest.decision`` on hand-built comparisons (exact, no statistics)."""

from __future__ import annotations

import dataclasses

import pytest

from spectest.decision.claims import DEFAULT_MAX_MDE_TV
from spectest.decision.comparison import Comparison
from spectest.decision.verdict import decide
from spectest.errors import ExitCode


def comp(
    arm: str, role: str, rejected: bool, *, mde: float | None = 0.1, control_failed: bool = False,
    size: float | None = None,
) -> Comparison:  # fmt: skip
    expect = {"candidate": "subject", "null": "pass"}.get(role, "fail")
    return Comparison(
        arm=arm,
        role=role,
        expect=expect,
        rejected=rejected,
        cells_tested=10,
        rejections=int(rejected),
        min_qvalue=0.01 if rejected else 0.9,
        mde_tv=mde,
        failing=("p0/a@1 p_adj=0.01",) if rejected else (),
        control_failed=control_failed,
        size_tv=size,
        size_exact=size is not None,
    )


@pytest.mark.parametrize(
    ("cand", "null", "mutant", "max_mde", "decision", "code"),
    [
        (False, False, True, None, "equivalent", ExitCode.OK),
        (True, False, True, None, "different", ExitCode.DIFFERENT),
        # a null rejection makes every other finding untrustworthy
        (True, True, True, None, "inconclusive", ExitCode.INCONCLUSIVE),
        (False, True, True, None, "inconclusive", ExitCode.INCONCLUSIVE),
        # a weak test still reports a detection it made ...
        (True, False, False, None, "different", ExitCode.DIFFERENT),
        # ... but "no difference" from a test that misses a known bug means nothing
        (False, False, False, None, "inconclusive", ExitCode.INCONCLUSIVE),
        # power requirement: MDE 0.1 against a required 0.05
        (False, False, True, 0.05, "inconclusive", ExitCode.INCONCLUSIVE),
        (False, False, True, 0.2, "equivalent", ExitCode.OK),
    ],
)
def test_decision_rules(cand, null, mutant, max_mde, decision, code) -> None:
    v = decide(
        [
            comp("candidate", "candidate", cand),
            comp("null", "null", null),
            comp("mutant:x", "mutant", mutant),
        ],
        max_mde_tv=max_mde,
    )
    assert (v.decision, v.exit_code) == (decision, code), v.reasons
    assert v.reasons and all("\n" not in r for r in v.reasons)
    labels = {t.arm: t.label for t in v.teeth}
    assert labels["null"] == ("REJECTED (unsound)" if null else "passed (sound)")
    assert labels["mutant:x"] == ("killed" if mutant else "NOT KILLED") + " (size unknown)"


def test_whitebox_control_failure_is_inconclusive() -> None:
    v = decide([comp("candidate", "candidate", False, control_failed=True)])
    assert v.exit_code == ExitCode.INCONCLUSIVE
    assert "white-box control failed" in v.reasons[0]


def test_teeth_only_run() -> None:
    ok = decide([comp("null", "null", False), comp("eps=0.5", "eps", True)])
    assert (ok.decision, ok.exit_code, ok.candidate) == ("sound", ExitCode.OK, None)
    bad = decide([comp("null", "null", False), comp("eps=0.5", "eps", False)])
    assert bad.exit_code == ExitCode.INCONCLUSIVE
    d = bad.to_dict()
    assert d["teeth"][1]["label"] == "NOT KILLED (size unknown)" and d["exit_code"] == 3
    # a teeth-only run claims no power: sizes are stated, the decision is "sound" either way
    big = decide([comp("null", "null", False), comp("eps=0.5", "eps", True, size=0.9)])
    assert big.decision == "sound" and big.claim is None
    assert big.to_dict()["teeth"][1]["label"] == "killed (size 0.9)"


# ----------------------------------------------------------------- scope and resolution (issue 9)
def fam(name: str, tested: int, *, mde: float | None = None, rejected: bool = False):
    from spectest.decision.comparison import FamilyScope

    return FamilyScope(name, tested, 96 - tested, 0.05, mde, "TV per cell-position", rejected)


def scoped(arm: str, role: str, *, tested: int, mde: float | None, rejected: bool = False):
    """A comparison with its families: ``tested`` cell-positions of 96, nothing else ran."""
    expect = {"candidate": "subject", "null": "pass"}.get(role, "fail")
    return Comparison(
        arm=arm,
        role=role,
        expect=expect,
        rejected=rejected,
        cells_tested=tested,
        rejections=int(rejected),
        min_qvalue=None,
        mde_tv=mde,
        failing=("p0/a@1 p_adj=0.01",) if rejected else (),
        cells_untestable=96 - tested,
        families=(fam("cells", tested, mde=mde, rejected=rejected), fam("trie", 0)),
        alpha=0.05,
        power=0.8,
        mde_tv_max=mde,
    )


def test_nothing_testable_is_inconclusive_whatever_the_teeth() -> None:
    """The issue's compare with 3 samples per cell: 0 cells tested, 96 untestable → exit 3 (it
    printed EQUIVALENT, exit 0); the same with every tooth switched off (`run --seeds 2`)."""
    v = decide([scoped("candidate", "candidate", tested=0, mde=None)], kind="compare")
    assert (v.decision, v.exit_code) == ("inconclusive", ExitCode.INCONCLUSIVE)
    assert v.headline == "INCONCLUSIVE (exit 3): nothing was testable"
    assert "0 of 96 cell-positions" in v.reasons[0]
    assert v.scope is not None
    assert v.scope.tested_line().startswith("tested: 0 of 96 cell-positions (96 untestable)")
    assert "families that ran: none; teeth that ran: none" in v.scope.tested_line()
    assert not any("teeth are sound" in r for r in v.reasons)
    v = decide([scoped("candidate", "candidate", tested=0, mde=None)], kind="run")
    assert v.exit_code == ExitCode.INCONCLUSIVE
    assert any("no teeth ran (the protocol switched them off)" in r for r in v.reasons)


def test_compare_says_it_ran_no_teeth_and_holds_the_default_resolution() -> None:
    """The issue's hidden benchmark: 256 samples per cell, MDE TV 0.28, no rejection. Default:
    exit 3 naming the resolution; an explicit --max-mde-tv 0.3 accepts it and the headline
    still states it. Never "the teeth are sound"."""
    c = scoped("candidate", "candidate", tested=96, mde=0.28)
    v = decide([c], kind="compare")
    assert v.exit_code == ExitCode.INCONCLUSIVE and v.max_mde_tv == DEFAULT_MAX_MDE_TV
    assert v.headline == (
        "INCONCLUSIVE (exit 3): resolution TV 0.280 per cell is worse than the required 0.15"
    )
    assert any("compare has samples only, no sampler to mutate" in r for r in v.reasons)
    assert "required per-cell TV ≤ 0.15 (default)" in v.scope.resolution_line()
    assert "power claim per-cell TV 0.280 from the median MDE" in v.scope.resolution_line()
    ok = decide([c], kind="compare", max_mde_tv=0.3)
    assert ok.exit_code == ExitCode.OK
    assert ok.headline == (
        "EQUIVALENT (exit 0): no difference found: a per-cell TV of 0.280 or more would have "
        "been seen with 80 % power"
    )
    assert not any("teeth are sound" in r for r in ok.reasons)
    assert "per-cell TV 0.280 (median, worst 0.280)" in ok.scope.resolution_line()
    assert "(--max-mde-tv)" in ok.scope.resolution_line()
    # a fine enough resolution passes the default
    fine = decide([scoped("candidate", "candidate", tested=96, mde=0.12)], kind="compare")
    assert fine.exit_code == ExitCode.OK, fine.reasons
    # a rejection is a detection at any resolution
    rej = decide([scoped("candidate", "candidate", tested=96, mde=0.28, rejected=True)])
    assert rej.exit_code == ExitCode.DIFFERENT
    assert rej.headline == "DIFFERENT (exit 1): the candidate's law differs from the reference's"


def sized(arm: str, role: str, size: float | None, *, rejected: bool = True, exact: bool = True):
    from dataclasses import replace

    c = scoped(arm, role, tested=96, mde=0.28, rejected=rejected)
    return replace(c, size_tv=size, size_exact=exact, size_where=None if size is None else "p/c@0")


def test_teeth_add_evidence_but_never_waive_the_requirement() -> None:
    """Issue 19: a killed gross tooth used to print "no resolution required (teeth show the
    power)". Issue 33: a killed tooth shows power against bugs of its own shape only, so the
    claim R is the candidate's median per-cell MDE (a bound for every shape) and exit 0 needs
    R ≤ the requirement (0.15 unless the protocol states one); the weakest killed tooth of known
    size below the MDE is stated beside it as "bugs like X"."""
    cand = scoped("candidate", "candidate", tested=96, mde=0.28)
    null = scoped("null", "null", tested=96, mde=0.28)
    # a killed tooth of unknown size shows nothing: R = MDE 0.28 > 0.15
    v = decide([cand, null, sized("mutant:x", "mutant", None)])
    assert v.exit_code == ExitCode.INCONCLUSIVE and v.max_mde_tv == DEFAULT_MAX_MDE_TV
    assert v.headline == (
        "INCONCLUSIVE (exit 3): resolution TV 0.280 per cell is worse than the required 0.15"
    )
    assert "no resolution required" not in v.scope.resolution_line()
    # a gross killed tooth (size 0.9) is no evidence for bugs of 0.15: R = MDE 0.28, no example
    v = decide([cand, null, sized("mutant:x", "mutant", 0.9)])
    assert v.exit_code == ExitCode.INCONCLUSIVE and v.claim.source == "mde"  # type: ignore[union-attr]
    assert v.claim.tooth is None  # type: ignore[union-attr]
    # issue 33: a killed tooth of exact size 0.08 under an MDE of 0.28 no longer passes: it shows
    # bugs of its own shape only (today's tree printed EQUIVALENT, exit 0, "as the killed tooth
    # eps=0.5 of exact size 0.08 shows")
    v = decide([cand, null, sized("mutant:x", "mutant", 0.9), sized("eps=0.5", "eps", 0.08)])
    assert v.exit_code == ExitCode.INCONCLUSIVE, v.reasons
    assert v.headline == (
        "INCONCLUSIVE (exit 3): resolution TV 0.280 per cell is worse than the required 0.15"
    )
    assert any(
        "the killed tooth eps=0.5 (exact size 0.08) shows only bugs of its own shape, and exit 0 "
        "needs the MDE, a bound for every shape" in r
        for r in v.reasons
    )
    assert v.to_dict()["power_claim"] == {
        "tv": 0.28, "source": "mde", "tooth": "eps=0.5", "exact": True, "tooth_tv": 0.08,
    }  # fmt: skip
    # with an MDE that meets the requirement, the tooth sharpens the statement, by shape
    fine = scoped("candidate", "candidate", tested=96, mde=0.12)
    v = decide([fine, null, sized("mutant:x", "mutant", 0.9), sized("eps=0.5", "eps", 0.08)])
    assert v.exit_code == ExitCode.OK, v.reasons
    assert v.headline == (
        "EQUIVALENT (exit 0): no difference found: a per-cell TV of 0.120 or more would have been "
        "seen with 80 % power; bugs like the killed tooth eps=0.5, of exact size 0.08, were seen "
        "too"
    )
    assert v.reasons[0].startswith(
        "the teeth are sound: null passed (sound), mutant:x killed (size 0.9), eps=0.5 killed "
        "(size 0.08)"
    )
    line = v.scope.resolution_line()
    assert (
        "power claim per-cell TV 0.120 from the median MDE (bugs like the killed tooth eps=0.5, "
        "of exact size 0.08, were seen too: its shape only)" in line
    )
    assert line.endswith("required per-cell TV ≤ 0.15 (default)")
    # an upper bound says so
    v = decide([fine, null, sized("eps=0.5", "eps", 0.1, exact=False)])
    assert v.exit_code == ExitCode.OK
    assert v.headline.endswith("bugs like the killed tooth eps=0.5, of size ≤ 0.1, were seen too")
    # the protocol's requirement applies to the MDE whatever the tooth
    v = decide([fine, null, sized("eps=0.5", "eps", 0.05)], max_mde_tv=0.1)
    assert v.exit_code == ExitCode.INCONCLUSIVE
    assert any(
        "the power claim, MDE (TV) 0.1200 per cell, > required 0.1000 (protocol)" in r
        for r in v.reasons
    )
    # a tooth that was not killed claims nothing, whatever its size (and fails rule 3b)
    v = decide([cand, null, sized("eps=0.5", "eps", 0.05, rejected=False)], max_mde_tv=0.3)
    assert v.exit_code == ExitCode.INCONCLUSIVE and v.claim.tooth is None  # type: ignore[union-attr]
    # a tooth above the MDE adds nothing to the statement
    v = decide([scoped("candidate", "candidate", tested=96, mde=0.07), null,
                sized("eps=0.5", "eps", 0.12)])  # fmt: skip
    assert v.exit_code == ExitCode.OK and v.claim.tooth is None  # type: ignore[union-attr]
    assert v.headline.endswith(
        "a per-cell TV of 0.070 or more would have been seen with 80 % power"
    )
    # a tooth killed by the support check alone (an emitted token with p = 0) claims nothing,
    # and its label says so wherever it is printed (issue 34: combined.yaml's
    # swapped_filter_order printed "killed (size 0.0261)" beside a headline claiming 0.197)
    from dataclasses import replace

    support = replace(sized("mutant:swapped_filter_order", "mutant", 0.026), support_only=True)
    v = decide([cand, null, support])
    assert v.exit_code == ExitCode.INCONCLUSIVE and v.claim.tooth is None  # type: ignore[union-attr]
    assert v.claim.tv == 0.28  # type: ignore[union-attr]
    t = next(t for t in v.teeth if t.arm == "mutant:swapped_filter_order")
    assert t.label == (
        "killed (size 0.026; by the support check only: a token of target probability 0, so it "
        "claims no power)"
    )
    assert v.to_dict()["teeth"][-1]["support_only"] is True


def test_unknown_resolution_is_inconclusive_even_with_a_killed_tooth() -> None:
    """Issue 19's `ci --seeds 5`: no cell-position tested (MDE unknown), the gross tooth killed
    by the white-box family: no power claim → exit 3, whatever the tooth's size and whatever the
    requirement (issue 33: `tests.power.max_mde_tv: 1.0` with a killed tooth made it exit 0)."""
    c = scoped("candidate", "candidate", tested=0, mde=None)
    from dataclasses import replace

    c = replace(c, families=(fam("cells", 0), fam("whitebox", 5)))
    null = replace(scoped("null", "null", tested=0, mde=None), families=c.families)
    killer = replace(sized("mutant:always_accept", "mutant", None), families=c.families)
    v = decide([c, null, killer])
    assert v.exit_code == ExitCode.INCONCLUSIVE
    assert v.headline == (
        "INCONCLUSIVE (exit 3): no cell-position was testable, so there is no power claim"
    )
    assert "no power claim: no cell-position was tested" in " ".join(v.reasons)
    assert "power claim unknown" in v.scope.resolution_line()
    for req in (None, 1.0):
        v = decide([c, null, replace(killer, size_tv=0.97, size_exact=True)], max_mde_tv=req)
        assert v.exit_code == ExitCode.INCONCLUSIVE
        assert v.headline == (
            "INCONCLUSIVE (exit 3): no cell-position was testable, so there is no power claim"
        )
        assert (
            "the killed tooth mutant:always_accept (exact size 0.97) shows only bugs"
            in " ".join(v.reasons)
        )


def test_a_tooth_that_tested_nothing_did_not_run() -> None:
    """A null arm "passing" on no testable data checked nothing: exit 3, labelled NO DATA."""
    v = decide(
        [
            scoped("candidate", "candidate", tested=96, mde=0.1),
            scoped("null", "null", tested=0, mde=None),
            scoped("mutant:x", "mutant", tested=96, mde=0.1, rejected=True),
        ]
    )
    assert v.exit_code == ExitCode.INCONCLUSIVE
    assert v.headline == "INCONCLUSIVE (exit 3): tooth 'null' tested nothing"
    labels = {t.arm: t.label for t in v.teeth}
    assert labels["null"] == "NO DATA (tested nothing)"
    assert "teeth that ran: mutant:x" in v.scope.tested_line()


def test_sequence_family_counts_only_when_its_permutation_p_can_reach_its_level() -> None:
    """Exact: 2 + 2 sequences in one cell have C(4, 2) = 6 relabelings, so the smallest p-value is
    1/6 > α/3 — the family ran formally but tested nothing (the issue's `run --seeds 2`); 3 + 3
    in 12 cells have 20^12 relabelings and B = 100 permutations give 1/101 ≤ 0.05/3."""
    import pandas as pd

    from spectest.stats.family_sequence import _can_reach

    def cells(n: int, k: int) -> pd.DataFrame:
        return pd.DataFrame(
            {"prompt_id": [f"p{i}" for i in range(k)], "config_id": "c", "scope": "cell",
             "n_ref": n, "n_cand": n}
        )  # fmt: skip

    assert not _can_reach(cells(2, 1), 100, 0.05 / 3)
    assert _can_reach(cells(3, 12), 100, 0.05 / 3)
    assert not _can_reach(cells(3, 12), 20, 0.05 / 3)  # 1/21 > α/3: B too small


def test_required_resolution_is_the_one_decide_applies():
    """The sources of rule 3c's requirement — the protocol's, ``--max-mde-tv`` or 0.15, whatever
    the teeth — and ``decide`` applying exactly that one (the sequential stop rule calls the same
    function, tests/test_sequential_run.py)."""
    from spectest.decision.claims import power_claim, required_resolution

    cand = comp("candidate", "candidate", False, mde=0.12)
    null = comp("null", "null", False)
    killer = comp("always_accept", "mutant", True, size=0.9)
    cases = [
        (([cand, null, killer], 0.3, "run"), (0.3, "protocol")),
        (([cand], 0.3, "compare"), (0.3, "--max-mde-tv")),
        (([cand, null], None, "run"), (DEFAULT_MAX_MDE_TV, "default")),
        (([cand], None, "compare"), (DEFAULT_MAX_MDE_TV, "default")),
        (([cand, null, killer], None, "run"), (DEFAULT_MAX_MDE_TV, "default")),
        (([null, killer], None, "teeth"), (DEFAULT_MAX_MDE_TV, "default")),
    ]
    for (comps, max_mde, kind), (want, source) in cases:
        got, requirement = required_resolution(max_mde, kind=kind)
        assert got == want and requirement.startswith(source), (comps, max_mde, kind)
        v = decide(comps, max_mde_tv=max_mde, kind=kind)
        assert v.max_mde_tv == want
        assert v.scope is not None and v.scope.requirement == requirement
        claim = power_claim(comps)
        if kind != "teeth":
            assert v.claim == claim and claim.tv == 0.12 and claim.source == "mde"
            assert v.exit_code == (ExitCode.OK if 0.12 <= want else ExitCode.INCONCLUSIVE)


# ------------------------------------------- beside a floor arm: which rejection decides (issue 31)
def _beside_floor(*families) -> Comparison:
    c = scoped("candidate", "candidate", tested=96, mde=0.1, rejected=True)
    return dataclasses.replace(c, families=families)


def test_beside_a_floor_an_exact_rejection_decides_and_a_black_box_one_does_not() -> None:
    """Beside a floor arm, a black-box rejection can be numerics (claim b decides), but a
    rejection by a test exact at any numerics is the sampler's: the reported-p family's support
    or PIT (conditional on the engine's own reported law) decides DIFFERENT as the white-box
    family's does. Session 11 found a reported-p rejection (21 tokens reported at p = 0) left
    INCONCLUSIVE beside a teacher-forced floor (only ``name == "whitebox"`` counted)."""
    from spectest.decision.comparison import FamilyScope

    cells = fam("cells", 96, mde=0.1, rejected=True)
    for exact in ("whitebox", "reported"):
        f = FamilyScope(exact, 3, 0, 0.05, None, "", True, exact_rejected=True)
        v = decide([_beside_floor(cells, f)], floor=True)
        assert (v.decision, v.exit_code) == ("different", ExitCode.DIFFERENT), exact
    # rejected only by its approximate cross-check: not exact, not decisive beside a floor
    cross = FamilyScope("reported", 3, 0, 0.05, None, "", True, exact_rejected=False)
    v = decide([_beside_floor(cells, cross)], floor=True)
    assert v.decision != "different", v.headline
    # without a floor arm any rejection decides
    assert decide([_beside_floor(cells, cross)]).decision == "different"
