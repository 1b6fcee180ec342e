"""An ε tooth that cannot bite: its arm accepted no drafted token, so its law is the exact
sampler's and "not killed" says nothing about power (issue 12: a random-init draft at a real
vocabulary whose every proposal the target gives p = 0). Exact checks on hand-built rounds and
comparisons, and one real run on the analytic toy LM (no statistics asserted beyond the verdict's
own rules)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from spectest import runner
from spectest.decision.claims import DEFAULT_MAX_MDE_TV
from spectest.decision.comparison import Comparison, eps_cannot_bite
from spectest.decision.verdict import decide
from spectest.errors import ExitCode
from spectest.protocol import load_protocol
from spectest.sampling.mutants import eps_of
from tests.toy_protocol import write_toy


def rounds(accepted: list[int], seeds: int = 4) -> pd.DataFrame:
    """One round per (cell, seed): two cells of ``seeds`` sequences, K = 3 drafted each."""
    rows = []
    i = 0
    for cell in ("a", "b"):
        for seed in range(seeds):
            rows.append(dict(prompt_id="p0", config_id=cell, arm="eps=0.5", seed=seed, round=0,
                             position=0, drafted=3, accepted=accepted[i % len(accepted)],
                             emitted=accepted[i % len(accepted)] + 1))  # fmt: skip
            i += 1
    return pd.DataFrame(rows)


def test_eps_of_reads_the_spec() -> None:
    assert eps_of("eps_biased:0.5") == 0.5 and eps_of("eps_biased") == 0.1
    assert eps_of("exact") is None and eps_of(None) is None and eps_of("eps_biased:x") is None


def test_cannot_bite_only_when_nothing_was_accepted_and_eps_positive() -> None:
    why = eps_cannot_bite(0.5, rounds([0], seeds=300))
    assert why is not None and "accepted 0 of 1800 drafted tokens in 600 sequences" in why
    # the exact one-sided 95 % bound for 0 of 300 sequences per cell: 1 - 0.05^(1/300) = 0.0099
    assert "within TV 0.0099" in why
    assert eps_cannot_bite(0.5, rounds([0, 0, 0, 1])) is None  # one acceptance: no claim
    assert eps_cannot_bite(-0.3, rounds([0])) is None  # ε < 0 accepts less: no coupling claim
    assert eps_cannot_bite(0.0, rounds([0])) is None
    assert eps_cannot_bite(0.5, None) is None
    assert eps_cannot_bite(0.5, rounds([0]).iloc[:0]) is None


def comp(
    arm: str, role: str, rejected: bool, *, mde: float = 0.1, bite: str | None = None,
    size: float | None = None,
):  # fmt: skip
    expect = {"candidate": "subject", "null": "pass"}.get(role, "fail")
    return Comparison(
        arm=arm, role=role, expect=expect, rejected=rejected, cells_tested=10,
        rejections=int(rejected), min_qvalue=None, mde_tv=mde,
        failing=("p0/a@1 p_adj=0.01",) if rejected else (), cannot_bite=bite,
        size_tv=size, size_exact=size is not None,
    )  # fmt: skip


def test_a_tooth_that_cannot_bite_is_reported_and_shows_no_power() -> None:
    why = "its arm accepted 0 of 9 drafted tokens"
    arms = [comp("candidate", "candidate", False), comp("null", "null", False)]
    # alone: no tooth shows the power, so the default resolution requirement decides
    fine = decide([*arms, comp("eps=0.5", "eps", False, bite=why)])
    assert (fine.decision, fine.max_mde_tv) == ("equivalent", DEFAULT_MAX_MDE_TV)
    assert {t.arm: t.label for t in fine.teeth}["eps=0.5"] == "cannot bite"
    assert any("cannot bite: " + why in r for r in fine.reasons)
    assert fine.to_dict()["teeth"][1]["cannot_bite"] == why
    coarse = decide([comp("candidate", "candidate", False, mde=0.3), arms[1],
                     comp("eps=0.5", "eps", False, bite=why)])  # fmt: skip
    assert coarse.exit_code == ExitCode.INCONCLUSIVE
    assert coarse.headline.endswith("worse than the required 0.15")
    # the same ε arm without the bite note is an unkilled tooth: inconclusive whatever the MDE
    weak = decide([*arms, comp("eps=0.5", "eps", False)])
    assert weak.exit_code == ExitCode.INCONCLUSIVE and "was not killed" in weak.headline
    # a killed mutant of size 0.1 is stated beside the claim as evidence for bugs of its own
    # shape, but never stands in for the MDE (0.3 > 0.15: inconclusive, issue 33); the ε arm that
    # cannot bite shows nothing even with a small size
    with_mutant = decide([comp("candidate", "candidate", False, mde=0.3), arms[1],
                          comp("eps=0.5", "eps", False, bite=why, size=0.01),
                          comp("mutant:x", "mutant", True, size=0.1)])  # fmt: skip
    assert with_mutant.exit_code == ExitCode.INCONCLUSIVE
    assert with_mutant.claim is not None and with_mutant.claim.tooth == "mutant:x"
    assert (with_mutant.claim.source, with_mutant.claim.tv) == ("mde", 0.3)
    # a killed mutant of unknown size shows nothing: the MDE is the claim
    unsized = decide(
        [
            comp("candidate", "candidate", False, mde=0.3),
            arms[1],
            comp("eps=0.5", "eps", False, bite=why),
            comp("mutant:x", "mutant", True),
        ]
    )
    assert unsized.exit_code == ExitCode.INCONCLUSIVE


def test_a_rejection_by_a_tooth_that_cannot_bite_is_a_false_alarm() -> None:
    v = decide([comp("candidate", "candidate", True), comp("null", "null", False),
                comp("eps=0.5", "eps", True, bite="its arm accepted 0 of 9")])  # fmt: skip
    assert v.exit_code == ExitCode.INCONCLUSIVE  # not "different": the harness false-alarmed
    assert "false-alarm control failed" in " ".join(v.reasons)
    assert {t.arm: t.label for t in v.teeth}["eps=0.5"].startswith("REJECTED (a false alarm")


def _toothless_toy(tmp_path: Path, seeds: int) -> Path:
    """Order-1 toy target and an independent toy draft whose argmax (token 56) is outside the
    target's top 8 ({41, 42, 53, ...}): every one-hot proposal has p = 0 under top_k = 8."""
    path = write_toy(
        tmp_path, models={"target": "toy:V=64,order=1,scale=3,seed=1",
                          "draft": "toy:V=64,order=1,scale=3,seed=2"},
        configs={"t1-k8": {"temperature": 1.0, "top_k": 8}}, seeds={"per_arm": seeds},
        positions=3, tests={"alpha": 0.05, "null_permutations": 100},
        teeth={"null_arm": True, "epsilons": [0.5], "mutants": []}, batch_size=1000,
    )  # fmt: skip
    return path


@pytest.mark.parametrize(("seeds", "code"), [(300, ExitCode.INCONCLUSIVE), (1000, ExitCode.OK)])
def test_run_with_a_draft_the_target_never_accepts(tmp_path: Path, seeds: int, code) -> None:
    """A real run: the ε arm accepts nothing, the verdict says it cannot bite and the default
    per-cell resolution (0.15) decides — 300 seeds per arm resolve TV ≈ 0.19 (exit 3), 1 000
    resolve ≈ 0.10 (exit 0). No statistical assertion beyond the run's own verdict (null arm:
    false-failure rate ≤ α = 0.05 at this fixed key; it passes here)."""
    proto = load_protocol(_toothless_toy(tmp_path, seeds))
    res = runner.run_protocol(proto, out=tmp_path / "out")
    r = pd.read_parquet(res.run_dir / "rounds.parquet")
    assert int(r.loc[r["arm"] == "eps=0.5", "accepted"].sum()) == 0
    teeth = {t.arm: t for t in res.verdict.teeth}
    assert teeth["eps=0.5"].cannot_bite is not None and teeth["null"].sound
    assert res.verdict.exit_code == code, res.verdict.reasons
    assert res.verdict.max_mde_tv == DEFAULT_MAX_MDE_TV
    assert any("cannot bite" in x for x in res.verdict.reasons)
    assert dataclasses.asdict(res.verdict.teeth[-1])["cannot_bite"].startswith("its arm accepted 0")
