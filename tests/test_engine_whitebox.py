"""Generation-time white-box columns of the built-in engine against teacher forcing.

The fast path (``ArmOutput.whitebox``, recorded inside ``plain_decode`` /
``speculative_decode`` from the very p_t and q_t rows the loop sampled from) must equal the slow
path (``engines.teacher.teacher_force``: one full forward over the emitted sequence) wherever the
two numerics agree: exactly (1e-12) on the float64 toy LM, within float32 rounding on a float32
tiny HF model. In bfloat16 they need not agree, and the test shows why recording at generation
time matters: no emitted token ever has recorded p = 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from spectest import schema
from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec, plain_decode, speculative_decode
from spectest.engines.teacher import teacher_force
from spectest.errors import InputError
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.models.toy import ToyLM
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams

PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=4),
    SamplingParams(temperature=1.2, top_p=0.7),
    SamplingParams(temperature=1.0, top_k=8, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=0.0),
]
ROWS = [RowSpec(f"c{i}", s, p) for s in range(3) for i, p in enumerate(PARAMS)]
PROMPT = [1, 2, 3]


def _generate(target, draft, arm: str, drafter: DrafterSpec, T: int, batch_size: int):
    common = dict(num_positions=T, run_key=11, prompt_id="p", batch_size=batch_size)
    if arm == "plain":
        return plain_decode(
            target,
            DecodeRequest(PROMPT, ROWS, whitebox=True, **common),
            draft=draft,
            drafter=drafter,
        )
    return speculative_decode(
        target,
        draft,
        DecodeRequest(PROMPT, ROWS, whitebox=True, **common),
        drafter=drafter,
        variant=get_variant(arm),
    )


def _assert_equal_columns(got, want, atol: float, max_in_a_flips: int = 0) -> None:
    assert len(got) == len(want)
    for c in schema.WHITEBOX_COLUMNS:
        g, w = got[c].to_numpy(), want[c].to_numpy()
        if c == schema.WB_IN_A:
            assert int((g != w).sum()) <= max_in_a_flips, c
        else:
            np.testing.assert_allclose(g, w, rtol=0, atol=atol, equal_nan=True, err_msg=c)


ARMS = ["plain", "exact", "eps_biased:0.5", "onehot_softmax_q"]


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("onehot", [False, True])
def test_generation_time_equals_teacher_forcing_toy(arm: str, onehot: bool) -> None:
    """Toy LM (float64): every column equal to 1e-12, for the plain arm, the exact sampler and
    two mutants, sampled and one-hot drafters, in chunks of 4 rows (batches cut rounds)."""
    if arm == "onehot_softmax_q" and onehot:
        pytest.skip("that mutant is a sampled-drafter bug")
    target = ToyLM(9, 3, 1.5, seed=4)
    draft = target.perturbed(0.7, seed=5)
    drafter = DrafterSpec(onehot=onehot, k=3)
    out = _generate(target, draft, arm, drafter, T=7, batch_size=4)
    assert out.whitebox is not None
    want = teacher_force(
        target, PROMPT, [r.params for r in ROWS], out.tokens, draft=draft, drafter=drafter
    )
    _assert_equal_columns(out.whitebox, want, atol=1e-12)


@pytest.mark.parametrize("arm", ["plain", "exact"])
def test_generation_time_equals_teacher_forcing_hf(arm: str) -> None:
    """Tiny HF model in float32 (cached incremental forwards vs one full forward; the HF wrapper
    has no float64): within 2e-5 with at most 2 flips of x ∈ A_t (a q ≈ p tie moved by
    rounding)."""
    target = from_preset("qwen3-tiny", seed=1, logit_scale=8.0, dtype="float32")
    draft = first_layers(target, 1)
    drafter = DrafterSpec(onehot=False, k=3)
    out = _generate(target, draft, arm, drafter, T=6, batch_size=len(ROWS))
    want = teacher_force(
        target, PROMPT, [r.params for r in ROWS], out.tokens, draft=draft, drafter=drafter
    )
    _assert_equal_columns(out.whitebox, want, atol=2e-5, max_in_a_flips=2)


def test_generation_time_has_no_support_violation_in_bfloat16() -> None:
    """bfloat16 tiny HF model: the recorded p of every emitted token is > 0 (it was drawn from
    that row), and the PIT pieces are consistent (cdf_lo + p ≤ 1). Deterministic."""
    target = from_preset("qwen3-tiny", seed=1, logit_scale=8.0, dtype="bfloat16")
    draft = first_layers(target, 1)
    drafter = DrafterSpec(onehot=True, k=3)
    for arm in ("plain", "exact"):
        out = _generate(target, draft, arm, drafter, T=6, batch_size=len(ROWS))
        wb = out.whitebox
        assert wb is not None and len(wb) == len(ROWS) * 6
        assert (wb[schema.WB_P] > 0).all()
        assert (wb[schema.WB_CDF_LO] + wb[schema.WB_P] <= 1 + 1e-9).all()


def test_no_whitebox_unless_asked_and_bad_input() -> None:
    target = ToyLM(6, 2, 1.0, seed=0)
    out = plain_decode(
        target, DecodeRequest([1], ROWS[:2], num_positions=3, run_key=1, prompt_id="p")
    )
    assert out.whitebox is None
    out = plain_decode(
        target,
        DecodeRequest([1], ROWS[:2], num_positions=3, run_key=1, prompt_id="p", whitebox=True),
    )
    assert out.whitebox is not None and out.whitebox[schema.WB_OVERLAP].isna().all()
    with pytest.raises(InputError, match="needs its drafter"):
        plain_decode(
            target,
            DecodeRequest([1], ROWS[:2], num_positions=3, run_key=1, prompt_id="p", whitebox=True),
            draft=target,
        )
    assert np.array_equal(
        out.tokens,
        plain_decode(
            target, DecodeRequest([1], ROWS[:2], num_positions=3, run_key=1, prompt_id="p")
        ).tokens,
    )


# ------------------------------------------------------------------------------- through a run
def _hf_teacher_fallback(monkeypatch) -> None:
    """The hf engines as on a transformers whose scores are not per emitted token
    (``pinning.scores_support`` false): they declare teacher-forced white-box columns."""
    from spectest.engines.hf import engines as hfe
    from spectest.engines.hf import pinning as hfp

    monkeypatch.setattr(hfp, "SCORES", hfp.ScoresSupport(False, "simulated"))
    monkeypatch.setattr(hfe.HFGenerateEngine, "whitebox", "teacher")
    monkeypatch.setattr(hfe.HFAssistedEngine, "whitebox", "teacher")


def test_whitebox_mode_of_a_plan(monkeypatch) -> None:
    """bf16/fp16 with an engine that needs a teacher → teacher mode; float32, or engines that
    record at generation time (built-in; hf through transformers' output_scores) in any dtype →
    exact. Deterministic."""
    from spectest.plan import make_plan, whitebox_mode
    from spectest.protocol import load_protocol

    hf = make_plan(load_protocol("protocols/hf-assisted-ci.yaml")).arms
    builtin = make_plan(load_protocol("protocols/ci.yaml")).arms
    assert whitebox_mode("bfloat16", hf) == "exact"  # output_scores: generation time
    assert whitebox_mode("bfloat16", builtin) == "exact"
    _hf_teacher_fallback(monkeypatch)
    assert whitebox_mode("bfloat16", hf) == "teacher"
    assert whitebox_mode("float16", hf) == "teacher"
    assert whitebox_mode("float32", hf) == "exact"
    command = make_plan(load_protocol("protocols/command-example.yaml")).arms
    assert whitebox_mode("float32", command) == "teacher"  # token-only: never spectest's numerics


def test_builtin_run_uses_generation_time_columns(tmp_path) -> None:
    """protocols/ci.yaml at 60 seeds: the stored samples carry the loops' own columns (a plain
    arm's p > 0 on every token), the analysis is in exact mode, the control passes."""
    import pandas as pd

    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    proto = load_protocol("protocols/ci.yaml", overrides={"seeds.per_arm": 60})
    res = run_protocol(proto, out=tmp_path / "run")
    s = pd.read_parquet(tmp_path / "run" / "samples.parquet")
    assert (s.loc[s[schema.ARM] == "reference", schema.WB_P] > 0).all()
    for d in res.summary["details"].values():
        assert d["whitebox_mode"] == "exact" and not d["whitebox_control_failed"]


@pytest.mark.slow
def test_hf_bf16_run_is_in_teacher_mode_slow(tmp_path, monkeypatch) -> None:
    """protocols/hf-assisted-ci.yaml in bfloat16 at 120 seeds, hf engines in their teacher
    fallback (``_hf_teacher_fallback``): every comparison runs the teacher-mode family (control
    rows on the reference, two-sample rows on the arm), the control and the null pass, the
    onehot_softmax_q mutant is killed. Fixed seeds (the protocol's key); false-failure rate: the
    null and control at α = 0.05 each."""
    import pandas as pd

    _hf_teacher_fallback(monkeypatch)

    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    proto = load_protocol(
        "protocols/hf-assisted-ci.yaml",
        overrides={"seeds.per_arm": 120, "batch_size": 120, "models.dtype": "bfloat16"},
    )
    res = run_protocol(proto, out=tmp_path / "run")
    wb = pd.read_parquet(tmp_path / "run" / "whitebox.parquet")
    assert set(wb.loc[wb["arm"] == "reference", "test"]) == {"support_tol", "pit_tol"}
    assert "directed_z_2s" in set(wb["test"])
    teeth = {t["arm"]: t for t in res.summary["verdict"]["teeth"]}
    assert teeth["null"]["sound"] and teeth["mutant:onehot_softmax_q"]["sound"], teeth
    for d in res.summary["details"].values():
        assert d["whitebox_mode"] == "teacher" and not d["whitebox_control_failed"]


@pytest.mark.parametrize("onehot", [True, False], ids=["onehot", "sampled"])
def test_roles_and_round_offsets_follow_the_rounds(onehot: bool) -> None:
    """``whitebox_roles`` appends each emitted token's role and offset in its round (the hook
    for white-box tests stratified by role): exactly what the rounds table implies — offsets
    0..emitted-1 from each round's position, ``accepted`` below the round's accepted count, then
    ``recovered`` after a rejection or ``bonus`` after K acceptances — while the white-box columns
    are the ones recorded without it; plain decode: "plain", offset 0 everywhere."""
    from spectest.engines.recorder import ROLES

    target = ToyLM(9, 3, 1.5, seed=4)
    draft = target.perturbed(0.7, seed=5)
    drafter, T = DrafterSpec(onehot=onehot, k=3), 9
    common = dict(num_positions=T, run_key=11, prompt_id="p", batch_size=4, whitebox=True)
    v = get_variant("exact")
    got = speculative_decode(
        target,
        draft,
        DecodeRequest(PROMPT, ROWS, whitebox_roles=True, **common),
        drafter=drafter,
        variant=v,
    )
    plain = speculative_decode(
        target, draft, DecodeRequest(PROMPT, ROWS, **common), drafter=drafter, variant=v
    )
    assert got.whitebox is not None and plain.whitebox is not None and got.rounds is not None
    cols = [*schema.WHITEBOX_COLUMNS, *schema.ROLE_COLUMNS]
    assert list(got.whitebox.columns) == [*cols, "role", "round_offset"]
    assert got.whitebox[cols].equals(plain.whitebox)
    role = np.full(len(ROWS) * T, "", dtype=object)
    offset = np.full(len(ROWS) * T, -1)
    for r in got.rounds.itertuples():
        for o in range(r.emitted):
            at = r.row * T + r.position + o
            final = "recovered" if r.accepted < r.drafted else "bonus"
            role[at], offset[at] = ("accepted" if o < r.accepted else final), o
    assert (offset >= 0).all()  # every position belongs to exactly one round
    assert got.whitebox["role"].tolist() == role.tolist()
    assert got.whitebox[schema.WB_ROLE].tolist() == role.tolist()
    assert np.array_equal(got.whitebox["round_offset"].to_numpy(), offset)
    assert np.array_equal(got.whitebox[schema.WB_SLOT].to_numpy(), offset)
    assert set(role) == set(ROLES[1:])  # accepted, recovered and bonus all occur
    out = plain_decode(
        target,
        DecodeRequest(PROMPT, ROWS, whitebox_roles=True, **common),
        draft=draft,
        drafter=drafter,
    )
    assert out.whitebox is not None
    assert set(out.whitebox["role"]) == {"plain"} and (out.whitebox["round_offset"] == 0).all()
