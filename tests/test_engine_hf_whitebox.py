"""Generation-time white-box columns of the hf engines (transformers' ``output_scores``).

What is checked: this transformers' decode loops keep, per emitted token, the processed scores
they sample from (``pinning.scores_support``, read from its source); in float32 the columns built
from those scores equal teacher forcing (``hf_teacher_force``) within float32 rounding, for plain
``generate`` and for assisted generation, with and without a draft q; the scores are checked per
token (``emitted_scores``); in bfloat16 no emitted token has p = 0 and a run of
``protocols/hf-assisted-ci.yaml`` is analysed in exact (one-sample) white-box mode with the
control passing. Tiny random-init models (V = 64), CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectest import schema
from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import RowSpec
from spectest.engines.hf import decode as hfd
from spectest.engines.hf import engines as hfe
from spectest.engines.hf import laws as ht
from spectest.engines.hf import pinning as hfp
from spectest.errors import EngineError
from spectest.models.zoo import load_pair
from spectest.sampling.params import SamplingParams

PROMPT = [1, 2, 3]
KW = dict(num_positions=6, run_key=5, prompt_id="p")
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=0.0),
]
ROWS = [RowSpec(f"c{i}", s, p) for i, p in enumerate(PARAMS) for s in range(4)]


def _pair(dtype: str = "float32"):
    return load_pair(
        "hf-preset:llama-tiny,vocab_size=64,logit_scale=30",
        "derived:noised,noise=0.05",
        seed=0,
        dtype=dtype,
    )


@pytest.fixture(scope="module")
def pair():
    return _pair()


def _assert_columns_close(got, want, atol: float) -> None:
    assert len(got) == len(want)
    for c in schema.WHITEBOX_COLUMNS:
        g, w = got[c].to_numpy(), want[c].to_numpy()
        if c == schema.WB_IN_A:
            assert (g == w).all(), c
        else:
            np.testing.assert_allclose(g, w, rtol=0, atol=atol, equal_nan=True, err_msg=c)


def test_this_transformers_keeps_the_sampled_scores() -> None:
    """The check reads the decode loops' source; here (5.x) both statements are present."""
    assert hfp.SCORES.ok, hfp.SCORES.reason
    assert hfe.HFGenerateEngine.whitebox == "generation"
    assert hfe.HFAssistedEngine.whitebox == "generation"
    assert hfd.whitebox_batch(256, 32, 151_936) == 55  # Qwen vocabulary: 1 GiB of scores
    assert hfd.whitebox_batch(256, 8, 64) == 256


@pytest.mark.parametrize("with_draft", [False, True])
def test_plain_generate_scores_equal_teacher_forcing(pair, with_draft: bool) -> None:
    """float32: p_t from ``generate``'s scores = transformers' warpers on a full forward (1e-5),
    every config including greedy; the tokens are those of a run without scores."""
    target, draft = pair
    d = draft if with_draft else None
    out = hfd.hf_plain_decode(
        target, DecodeRequest(PROMPT, ROWS, batch_size=8, whitebox=True, **KW), draft=d
    )
    assert out.whitebox is not None and len(out.whitebox) == len(ROWS) * 6
    want = ht.hf_teacher_force(target, PROMPT, [r.params for r in ROWS], out.tokens, draft=d)
    _assert_columns_close(out.whitebox, want, atol=1e-5)
    assert (out.whitebox[schema.WB_P] > 0).all()
    plain = hfd.hf_plain_decode(target, DecodeRequest(PROMPT, ROWS, batch_size=8, **KW))
    assert np.array_equal(plain.tokens, out.tokens) and plain.whitebox is None


def test_assisted_scores_equal_teacher_forcing(pair) -> None:
    """float32: the scores assisted generation keeps per emitted token (accepted, recovered and
    bonus tokens, from the verify forward) = teacher forcing (1e-5); tokens unchanged."""
    target, draft = pair
    rows = [r for r in ROWS if not r.params.is_greedy]
    req = DecodeRequest(PROMPT, rows, whitebox=True, **KW)
    out = hfd.hf_assisted_decode(target, draft, req, num_assistant_tokens=3, draft_teacher=draft)
    assert out.whitebox is not None and out.rounds is not None
    assert (out.rounds["accepted"] > 0).any() and (out.rounds["accepted"] < 3).any()
    want = ht.hf_teacher_force(target, PROMPT, [r.params for r in rows], out.tokens, draft=draft)
    _assert_columns_close(out.whitebox, want, atol=1e-5)
    again = hfd.hf_assisted_decode(
        target, draft, DecodeRequest(PROMPT, rows, **KW), num_assistant_tokens=3
    )
    assert np.array_equal(again.tokens, out.tokens)


def test_emitted_scores_are_checked() -> None:
    class Out:
        scores = (torch.zeros(2, 5), torch.zeros(2, 5))

    assert tuple(hfd.emitted_scores(Out(), 2, 2, "x").shape) == (2, 2, 5)
    with pytest.raises(EngineError, match="returned 2 score tensors for 3 emitted tokens"):
        hfd.emitted_scores(Out(), 2, 3, "x")
    with pytest.raises(EngineError, match=r"expected one \[3, V\] per token"):
        hfd.emitted_scores(Out(), 3, 2, "x")
    Out.scores = None  # type: ignore[assignment]
    with pytest.raises(EngineError, match="returned None score tensors"):
        hfd.emitted_scores(Out(), 2, 2, "x")


def test_bfloat16_no_emitted_token_has_p_zero() -> None:
    """bfloat16: the recorded p of every emitted token (plain and assisted) is > 0 — it is the
    law transformers drew it from — while teacher forcing the same tokens may give p = 0 (not
    asserted: it depends on the boundary). Deterministic."""
    target, draft = _pair("bfloat16")
    rows = [r for r in ROWS if not r.params.is_greedy]
    assisted = hfd.hf_assisted_decode(
        target,
        draft,
        DecodeRequest(PROMPT, rows, whitebox=True, **KW),
        num_assistant_tokens=3,
        draft_teacher=draft,
    )
    plain = hfd.hf_plain_decode(
        target, DecodeRequest(PROMPT, rows, whitebox=True, **KW), draft=draft
    )
    for out in (plain, assisted):
        wb = out.whitebox
        assert wb is not None and (wb[schema.WB_P] > 0).all()
        assert (wb[schema.WB_CDF_LO] + wb[schema.WB_P] <= 1 + 1e-9).all()


def test_hf_bf16_run_is_exact_mode(tmp_path) -> None:
    """protocols/hf-assisted-ci.yaml in bfloat16 at 120 seeds: the plan's white-box mode is exact
    (generation-time columns), the stored reference arm has p > 0 on every token, the provenance
    says where the columns came from, control and null pass and onehot_softmax_q is killed.
    Fixed seeds (the protocol's key); false-failure rate: the null at α = 0.05, the control
    (exact one-sample tests on a correct arm) at its α share."""
    import pandas as pd

    from spectest.plan import make_plan, whitebox_mode
    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    proto = load_protocol(
        "protocols/hf-assisted-ci.yaml",
        overrides={"seeds.per_arm": 120, "batch_size": 120, "models.dtype": "bfloat16"},
    )
    assert whitebox_mode("bfloat16", make_plan(proto).arms) == "exact"
    res = run_protocol(proto, out=tmp_path / "run")
    s = pd.read_parquet(tmp_path / "run" / "samples.parquet")
    for arm in ("reference", "candidate"):
        assert (s.loc[s[schema.ARM] == arm, schema.WB_P] > 0).all(), arm
    for d in res.summary["details"].values():
        assert d["whitebox_mode"] == "exact" and not d["whitebox_control_failed"]
    teeth = {t["arm"]: t for t in res.summary["verdict"]["teeth"]}
    assert teeth["null"]["sound"] and teeth["mutant:onehot_softmax_q"]["sound"], teeth
