"""The round-aware family (issue 22 item 2): the vectorised 2×k χ² against scipy, the strata a
rounds table claims (by hand), and on real speculative runs of the toy pair that two exact arms
pass while a bonus-confined mutant the token families miss at 120 seeds is caught, and that a
fabricated rounds table never turns a wrong sampler into a pass.

False-failure rates: the H0 check runs 30 replications at α = 0.1 and fails at ≥ 10 rejections
(binomial(30, 0.1) tail ≈ 1e-3 if the family is exact; deterministic given the seeds); the
mutant checks read fixed seeds (measured p_adj 0.005 = 1/(B+1) against a share 0.0125).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from toy_protocol import TOY, write_toy

from spectest.decision.comparison import FamilyScope, compare_arm
from spectest.decision.verdict import decide
from spectest.engines.base import DecodeRequest, rounds_frame, samples_frame
from spectest.engines.builtin import DrafterSpec, RowSpec, speculative_decode
from spectest.errors import ExitCode
from spectest.models.toy import ToyLM
from spectest.plan import Arm, SeedRange
from spectest.protocol import load_protocol
from spectest.runner import run_protocol
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.stats.battery import AnalysisOptions, analyze
from spectest.stats.families import relabelings
from spectest.stats.histograms import encode_samples
from spectest.stats.rounds import (
    any_testable,
    chi2_under_labels,
    round_tests,
    strata_of,
    stratum_counts,
)

CANDIDATE = Arm("candidate", "candidate", None, SeedRange(0, 1), "subject")
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, top_k=6)]


def _arm(variant: str, arm: str, seeds: range) -> tuple[pd.DataFrame, pd.DataFrame]:
    target = ToyLM(10, 3, 1.5, seed=4)
    draft = target.perturbed(0.8, seed=5)
    rows = [RowSpec(f"c{i}", s, p) for s in seeds for i, p in enumerate(PARAMS)]
    out = speculative_decode(
        target,
        draft,
        DecodeRequest(
            [1, 2, 3], rows, num_positions=12, run_key=22, prompt_id="p", batch_size=len(rows)
        ),
        drafter=DrafterSpec(onehot=False, k=3),
        variant=get_variant(variant),
    )
    return samples_frame(out.tokens, "p", rows, arm), rounds_frame(out.rounds, "p", rows, arm)


def _pair(variant: str, n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    s1, r1 = _arm("exact", "reference", range(n))
    s2, r2 = _arm(variant, "candidate", range(10**6, 10**6 + n))
    return pd.concat([s1, s2], ignore_index=True), pd.concat([r1, r2], ignore_index=True)


def test_chi2_under_labels_is_pearsons_2xk() -> None:
    rng = np.random.default_rng(0)
    x = rng.poisson(2.0, size=(40, 5)).astype(np.float64) + (rng.random((40, 5)) < 0.1)
    x[:, 0] += 1  # every bin has mass
    labels = np.stack([rng.permutation(np.r_[np.ones(17), np.zeros(23)]) for _ in range(6)], 1)
    got = chi2_under_labels(x, labels)
    for b in range(labels.shape[1]):
        ref = (x * labels[:, b : b + 1]).sum(0)
        tab = np.stack([ref, x.sum(0) - ref])
        want = stats.chi2_contingency(tab, correction=False)[0]
        assert got[b] == pytest.approx(want, rel=1e-10)
    empty = np.zeros((40, 1))
    assert chi2_under_labels(x, empty)[0] == 0.0  # one arm empty: no statistic


def test_strata_of_a_hand_made_rounds_table() -> None:
    """A 6-token sequence with rounds (d=2, a=2, e=3) then (d=2, a=0, e=1) then (d=2, a=1,
    e=2): offsets, the bonus (position 2), the recovered tokens (positions 3 and 5), the
    accepted lengths; a claimed position past the sequence is skipped."""
    toks = [4, 5, 6, 7, 8, 9]
    samples = pd.DataFrame(
        {
            "prompt_id": "p",
            "config_id": "c",
            "arm": "a",
            "seed": 0,
            "position": range(6),
            "token_id": toks,
        }
    )
    rounds = pd.DataFrame(
        {
            "prompt_id": "p",
            "config_id": "c",
            "arm": "a",
            "seed": 0,
            "round": [0, 1, 2, 3],
            "position": [0, 3, 4, 6],
            "drafted": 2,
            "accepted": [2, 0, 1, 0],
            "emitted": [3, 1, 2, 1],
        }
    )
    samples = pd.concat([samples, samples.assign(arm="b")], ignore_index=True)
    enc = encode_samples(samples, ("a", "b"))
    st = strata_of(enc, rounds)
    V = 10
    got = {
        (st.names[s], int(c)) for q, s, c in zip(st.seq, st.stratum, st.category, strict=True)
        if q == 0
    }  # fmt: skip
    want = {
        ("offset_0", 0 * V + 4), ("offset_1", 1 * V + 5), ("bonus", 2 * V + 6),
        ("offset_0", 3 * V + 7), ("recovered", 3 * V + 7),
        ("offset_0", 4 * V + 8), ("offset_1", 5 * V + 9), ("recovered", 5 * V + 9),
        ("accepted_len", 2 * 3 + 2), ("accepted_len", 2 * 3 + 0), ("accepted_len", 2 * 3 + 1),
    }  # fmt: skip
    assert got == want  # round 3 (position 6) has no token: only its accepted length counts
    assert int((st.seq == 0).sum()) == len(want) + 1  # the two (2, 0) rounds are two entries
    absurd = rounds.assign(emitted=10**12, drafted=10**12, position=-(10**12))
    assert len(strata_of(enc, absurd).seq) == 4  # only the four accepted lengths are left
    x = stratum_counts(np.array([0, 0, 1, 2]), np.array([7, 7, 7, 3]), 3, min_expected=1.0)
    assert x.tolist() == [[2.0, 0.0], [1.0, 0.0], [0.0, 1.0]]  # 7 kept, 3 in the rest bin


def test_two_exact_arms_pass_at_alpha() -> None:
    """H0 in CI: 30 replications of exact vs exact (the same drafter, disjoint seeds)."""
    s, r = _pair("exact", 30 * 30)
    rng = np.random.default_rng(5)
    hits = 0
    for i in range(30):
        keep = (s.seed % 10**6) // 30 == i
        keep_r = (r.seed % 10**6) // 30 == i
        enc = encode_samples(s[keep], ("reference", "candidate"))
        df = round_tests(enc, r[keep_r], relabelings(enc, 99, rng), 0.1)
        assert len(df) and (df.status == "ok").sum() >= 5
        hits += bool(df.reject.any())
    assert hits < 10, hits


def test_any_testable_is_the_tables_status_without_its_statistics() -> None:
    """``RoundsFamily.active`` reads ``any_testable``: it says what ``round_tests``' status
    column says, at several sizes down to none testable and at a stricter ``min_expected``."""
    s, r = _pair("exact", 40)
    rng = np.random.default_rng(3)
    seen = set()
    for n, min_expected in [(40, 5.0), (8, 5.0), (2, 5.0), (1, 5.0), (40, 400.0)]:
        keep, keep_r = s.seed % 10**6 < n, r.seed % 10**6 < n
        enc = encode_samples(s[keep], ("reference", "candidate"))
        df = round_tests(enc, r[keep_r], relabelings(enc, 9, rng), 0.1, min_expected)
        want = bool(len(df) and (df.status == "ok").any())
        assert any_testable(enc, r[keep_r], min_expected) == want, (n, min_expected)
        seen.add(want)
    assert seen == {True, False}  # both answers were checked


def test_the_family_finds_the_strata_once_per_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    """``active`` and ``run`` share one ``strata_of`` (``FamilyInputs.memoized``)."""
    from spectest.stats import rounds as rounds_mod

    s, r = _pair("exact", 20)
    calls: list[int] = []
    strata = rounds_mod.strata_of
    monkeypatch.setattr(rounds_mod, "strata_of", lambda *a: calls.append(1) or strata(*a))
    a = analyze(s, reference="reference", candidate="candidate", rounds=r)
    assert a.families["rounds"].active and len(a.families["rounds"].table) and calls == [1]


def test_bonus_mutant_missed_by_token_families_is_caught() -> None:
    s, r = _pair("bonus_wrong_row", 120)
    a = analyze(s, reference="reference", candidate="candidate", rounds=r,
                options=AnalysisOptions(sequence=True))  # fmt: skip
    fam = a.families
    assert fam["rounds"].active and fam["rounds"].claims
    assert not any(f.rejected for k, f in fam.items() if k != "rounds"), a.summary()
    assert fam["rounds"].rejected
    rej = fam["rounds"].table[fam["rounds"].table.reject.astype(bool)]
    assert set(rej.stratum) == {"bonus"}  # the one stratum the bug lives in
    comp = compare_arm(a, CANDIDATE)
    assert comp.rejected and decide([comp]).exit_code == ExitCode.DIFFERENT
    without = analyze(s, reference="reference", candidate="candidate", rounds=None,
                      options=AnalysisOptions(sequence=True))  # fmt: skip
    assert not without.families["rounds"].active and not without.rejected


def test_fabricated_rounds_never_make_a_wrong_sampler_pass() -> None:
    """A wrong sampler whose engine claims the reference's rounds (a perfect-looking readout):
    the token families still reject it (exit 1); a family of claims alone never counts as
    'a family ran' for a pass."""
    s, r = _pair("bonus_wrong_row", 400)
    ref_r = r[r.arm == "reference"]
    fake = ref_r.assign(arm="candidate", seed=ref_r.seed + 10**6)  # the reference's rounds
    a = analyze(s, reference="reference", candidate="candidate",
                rounds=pd.concat([ref_r, fake], ignore_index=True))  # fmt: skip
    assert a.families["rounds"].active and a.rejected
    assert a.families["cells"].rejected
    comp = compare_arm(a, CANDIDATE)
    assert decide([comp]).exit_code == ExitCode.DIFFERENT
    only = FamilyScope("rounds", 12, 0, 0.0125, None, "", False, claims=True)
    assert only.ran and only.to_dict()["claims"] is True
    assert not comp.__class__(
        arm="candidate", role="candidate", expect="subject", rejected=False, cells_tested=0,
        rejections=0, min_qvalue=None, mde_tv=None, failing=(), by_config=(),
        control_failed=False, families=(only,),
    ).tested_anything  # fmt: skip


def test_a_matched_run_spends_alpha_on_reported_rounds(tmp_path: Path) -> None:
    """End to end (matched numerics mode: the candidate and the matched arm both run
    spectest's loop with the same drafter): the round-aware family is active for the candidate,
    its scope is marked as claims, and the exact candidate still ends EQUIVALENT."""
    models = {**TOY["models"], "target": "toy:V=16,order=2,scale=2.0,seed=3"}  # type: ignore[dict-item]
    tests = {**TOY["tests"], "numerics": "matched"}  # type: ignore[dict-item]
    path = write_toy(tmp_path, models=models, tests=tests, positions=6, candidate="exact")
    res = run_protocol(load_protocol(path), out=tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    cand = next(c for c in summary["comparisons"] if c["role"] == "candidate")
    fams = {f["name"]: f for f in summary["verdict"]["scope"]["families"]}
    assert fams["rounds"]["alpha"] > 0 and fams["rounds"]["claims"] is True, fams
    assert cand["rejected"] is False and int(res.verdict.exit_code) == 0, summary["verdict"]
