"""Built-in engines on CUDA: both arms on a tiny HF model, CPU/CUDA uniforms bit-identical,
batch invariance, cache-with-holes equivalence. Skipped cleanly without CUDA."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import (
    DrafterSpec,
    RowSpec,
    plain_decode,
    speculative_decode,
    speculative_decode_reference,
)
from spectest.models.derive import first_layers
from spectest.models.hf import HFModel, from_preset
from spectest.models.toy import ToyLM
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.seeding import STREAM_SPEC, row_key, uniforms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=20),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=0.0),
]
EXACT = get_variant("exact")


@pytest.fixture(scope="module")
def pair() -> tuple[HFModel, HFModel]:
    # float32 on CUDA so that the tiny model's argmax/CDF decisions are stable across batch shapes
    target = from_preset("qwen3-tiny", seed=3, device="cuda", dtype=torch.float32, logit_scale=12.0)
    return target, first_layers(target, 1)


def test_uniforms_cpu_equal_cuda() -> None:
    keys = torch.tensor([row_key(1, "p", f"c{i}", i) for i in range(300)], dtype=torch.int64)
    step = torch.arange(300, dtype=torch.int64) * 7
    cpu = uniforms(keys, STREAM_SPEC, step, 9)
    gpu = uniforms(keys.cuda(), STREAM_SPEC, step.cuda(), 9).cpu()
    assert torch.equal(cpu, gpu)


def test_both_arms_run_and_match_reference(pair) -> None:
    target, draft = pair
    rows = [RowSpec(f"c{i}", s, p) for s in range(3) for i, p in enumerate(PARAMS)]
    plain = plain_decode(
        target, DecodeRequest([1, 2, 3], rows, num_positions=16, run_key=7, prompt_id="p")
    )
    assert plain.tokens.shape == (12, 16) and isinstance(plain.tokens, np.ndarray)  # host
    drafter = DrafterSpec(onehot=False, k=4)
    out = speculative_decode(
        target,
        draft,
        DecodeRequest([1, 2, 3], rows, num_positions=16, run_key=7, prompt_id="p"),
        drafter=drafter,
        variant=EXACT,
    )
    want, _ = speculative_decode_reference(
        target,
        draft,
        DecodeRequest([1, 2, 3], rows, num_positions=16, run_key=7, prompt_id="p"),
        drafter=drafter,
        variant=EXACT,
    )
    assert np.array_equal(out.tokens, want)
    greedy = [i for i, r in enumerate(rows) if r.params.is_greedy]
    assert np.array_equal(out.tokens[greedy], plain.tokens[greedy])


def test_batch_invariance_cuda(pair) -> None:
    target, draft = pair
    rows = [RowSpec(f"c{i % 4}", s, PARAMS[i % 4]) for i, s in enumerate(range(200))]
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    drafter = DrafterSpec(onehot=True, k=3)
    kw = dict(num_positions=12, run_key=7, prompt_id="p")
    big_p = plain_decode(target, DecodeRequest([4], shuffled, batch_size=64, **kw))
    big_s = speculative_decode(
        target,
        draft,
        DecodeRequest([4], shuffled, batch_size=64, **kw),
        drafter=drafter,
        variant=EXACT,
    )
    for r in (rows[0], rows[101], rows[199]):
        i = shuffled.index(r)
        assert np.array_equal(
            plain_decode(target, DecodeRequest([4], [r], **kw)).tokens[0], big_p.tokens[i]
        )
        alone = speculative_decode(
            target, draft, DecodeRequest([4], [r], **kw), drafter=drafter, variant=EXACT
        )
        assert np.array_equal(alone.tokens[0], big_s.tokens[i])


def test_holes_equivalence_cuda_bf16() -> None:
    """bf16 on CUDA: cached incremental logits with holes ≈ full forward (bf16 tolerance)."""
    m = from_preset("qwen3-tiny", seed=5, device="cuda")
    assert m.dtype == torch.bfloat16
    ids = torch.randint(0, 512, (3, 9), generator=torch.Generator().manual_seed(0)).cuda()
    cache = m.new_cache(3)
    a = m.forward(cache, ids[:, :4])
    m.forward(cache, ids[:, :2])
    hole = torch.zeros((3, 6), dtype=torch.bool, device="cuda")
    hole[:, 4:] = True
    cache.invalidate(hole)
    b = m.forward(cache, ids[:, 4:])
    torch.testing.assert_close(torch.cat([a, b], 1), m.logits_full(ids), rtol=0.05, atol=0.05)


def test_toy_on_cuda_equals_cpu() -> None:
    rows = [RowSpec("c", s, PARAMS[s % 4]) for s in range(16)]
    kw = dict(num_positions=10, run_key=3, prompt_id="p")
    outs = []
    for dev in ("cpu", "cuda"):
        t = ToyLM(32, 2, 2.0, seed=1, device=dev)
        d = t.perturbed(0.5, seed=2)
        outs.append(
            speculative_decode(
                t,
                d,
                DecodeRequest([0], rows, **kw),
                drafter=DrafterSpec(onehot=False, k=3),
                variant=EXACT,
            ).tokens
        )
    assert np.array_equal(outs[0], outs[1])
