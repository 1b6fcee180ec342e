"""The ``realistic:`` benchmark pair (models/realistic.py): what the construction changes in the
weights, that damp = 0 makes the first-layers draft the target exactly, and that a realistic
damp and logit scale give a draft that accepts tokens (the figures at Qwen3-0.6B shape are in
results/LOG.md; this checks the mechanism at CI size)."""

from __future__ import annotations

import pytest
import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec, speculative_decode
from spectest.errors import ConfigError, ModelError
from spectest.models import zoo
from spectest.models.hf import from_preset
from spectest.models.realistic import damped_target
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.sampling.shortlist import fast_variant

TINY = dict(num_hidden_layers=4)


def test_only_the_deep_output_projections_are_scaled():
    ref = from_preset("qwen3-tiny", seed=3, **TINY)
    got = damped_target("qwen3-tiny", draft_layers=1, damp=0.25, logit_scale=1.0, seed=3, **TINY)
    ref_sd, got_sd = ref.model.state_dict(), got.model.state_dict()
    assert ref_sd.keys() == got_sd.keys()
    mods = ("self_attn.o_proj", "mlp.down_proj")
    scaled = {f"model.layers.{i}.{m}.weight" for i in (1, 2, 3) for m in mods}
    for name, w in ref_sd.items():
        expected = w * 0.25 if name in scaled else w
        assert torch.equal(got_sd[name], expected), name


def test_damp_zero_makes_the_draft_the_target():
    target, draft = zoo.load_pair(
        "realistic:qwen3-tiny,draft_layers=2,damp=0,logit_scale=5,num_hidden_layers=4",
        "derived:first_layers,layers=2",
    )
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    assert torch.allclose(target.logits_full(ids), draft.logits_full(ids), atol=1e-5, rtol=1e-5)
    assert target.name.startswith("realistic:qwen3-tiny,draft_layers=2,damp=0.0")


def test_damped_pair_accepts_and_undamped_does_not_beat_it():
    """Mean accepted tokens per round, one-hot drafter, K = 4, t 0.8, top-p 0.95, 32 rows x 16
    positions (deterministic: fixed weights and counter-based uniforms)."""
    rows = [RowSpec("c", s, SamplingParams(temperature=0.8, top_p=0.95)) for s in range(32)]
    accepted = {}
    for damp in (0.03, 1.0):
        spec = f"realistic:qwen3-tiny,draft_layers=1,damp={damp},logit_scale=20,num_hidden_layers=4"
        target, draft = zoo.load_pair(spec, "derived:first_layers,layers=1")
        out = speculative_decode(
            target,
            draft,
            DecodeRequest([1, 2, 3], rows, num_positions=16, run_key=7, prompt_id="p"),
            drafter=DrafterSpec(onehot=True, k=4),
            variant=fast_variant(get_variant("exact")),
        )
        assert out.rounds is not None
        accepted[damp] = float(out.rounds["accepted"].mean())
    assert accepted[0.03] >= 1.5, accepted
    assert accepted[0.03] > accepted[1.0], accepted


def test_listed_and_bad_options():
    assert "realistic:qwen3-0.6b" in zoo.PRESETS
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        zoo.load_model("realistic:nope")
    with pytest.raises(ModelError, match="damp must be a number in"):
        zoo.load_model("realistic:qwen3-tiny,damp=2")
    with pytest.raises(ModelError, match="draft_layers=5"):
        zoo.load_model("realistic:qwen3-tiny,draft_layers=5")
