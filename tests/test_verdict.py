"""The decision rules of ``spectest.verdict`` on hand-built comparisons (exact, no statistics)."""

from __future__ import annotations

import pytest

from spectest.errors import ExitCode
from spectest.verdict import Comparison, decide


def comp(
    arm: str, role: str, rejected: bool, *, mde: float | None = 0.1, control_failed: bool = False
) -> Comparison:
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
    assert labels["mutant:x"] == ("killed" if mutant else "NOT KILLED")


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
    assert d["teeth"][1]["label"] == "NOT KILLED" and d["exit_code"] == 3
