"""``sampling.scaled.ScaledLogits``: native half-precision logits standing for their float32 cast
times a ``logit_scale``. Moves keep the native tensor, everything else sees the product, writes
are refused; the fast pipeline on them gives the product's law bit for bit (dense, shortlist,
draws, ties, fallbacks, overflow under the scale); the static model returns them for a scaled
bfloat16 model and its decode loops give the float32 model's tokens, rounds and white-box columns
(on CUDA: tests/test_sampling_native.py, ``logit_scale`` 20).

All inputs are fixed (seeded) and every CPU comparison is exact (``torch.equal``): the claims are
bit-identities (the product is what the static model computed before, and comparisons on the
native tensor decide what they decide on the product), so the false-failure rate is zero. The
kernel checks are 1e-12 relative (float64 reduction order only, as tests/test_sampling_kernels.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec
from spectest.errors import NumericsError
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.scaled import ScaledLogits, parts
from spectest.sampling.shortlist import logits_to_probs_fast, shortlist_probs
from spectest.sampling.transforms import logits_to_probs
from tests.test_sampling_native import GRID, assert_same_decodes, native_sets, static_pairs

SCALES = [20.0, 0.1, 3.7]  # the realistic pair's; one that float32 rounds; an odd one


def product(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The float32 tensor a ``ScaledLogits`` stands for, as the static model computed it."""
    return x.to(torch.float32).mul_(scale)


def test_moves_keep_the_native_tensor_and_everything_else_sees_the_product() -> None:
    raw = (torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(1)) * 3).bfloat16()
    x, ref = ScaledLogits.wrap(raw, 20.0), product(raw, 20.0)
    assert x.dtype == torch.float32 and x.shape == raw.shape and x.dim() == 3 and len(x) == 3
    for move in (x[:, 0], x.reshape(12, 50)[[0, 2]], torch.stack([x[:, 0], x[:, 1]], 1), x[0].T):
        assert isinstance(move, ScaledLogits) and parts(move)[0].dtype == torch.bfloat16
    assert torch.equal(x.reshape(12, 50)[[0, 2]].float(), ref.reshape(12, 50)[[0, 2]])
    assert torch.equal(torch.stack([x[:, 0], x[:, 1]], 1).float(), ref[:, :2])
    # a plain tensor joined to it is already the law's values: the join is of products
    joined = torch.cat([x, ref])
    assert type(joined) is torch.Tensor and torch.equal(joined, torch.cat([ref, ref]))
    for got, want in (
        (x.float(), ref),
        (x.to(torch.float64), ref.double()),
        (x - 1, ref - 1),
        (torch.where(x > 0, x, 0.0), torch.where(ref > 0, ref, 0.0)),
        (torch.topk(x, 5).values, torch.topk(ref, 5).values),
        (x.softmax(-1), ref.softmax(-1)),
    ):
        assert type(got) is torch.Tensor and torch.equal(got, want)
    assert parts(ref) == (ref, None)


def test_writes_are_refused_and_only_half_precision_is_held() -> None:
    x = ScaledLogits.wrap(torch.zeros(2, 8, dtype=torch.bfloat16), 2.0)
    for write in (lambda: x.mul_(2), lambda: x.__setitem__(0, 1.0), lambda: x.div_(3)):
        with pytest.raises(TypeError, match="read-only"):
            write()
    with pytest.raises(TypeError, match="read-only"):
        torch.add(x, 1, out=x)
    with pytest.raises(TypeError, match="bfloat16 / float16"):
        ScaledLogits.wrap(torch.zeros(2, 8), 2.0)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("width", [4, 64, 1024])
def test_the_product_law_bit_for_bit(scale: float, width: int) -> None:
    g = torch.Generator().manual_seed(21)
    n, V = len(GRID), 300
    params = SamplingTensors.from_params(GRID)
    rows = [i for i, p in enumerate(GRID) if p.top_k or p.top_p < 1 or p.min_p]
    sub = SamplingTensors.from_params([GRID[i] for i in rows])
    for raw in [*native_sets(g, n, V), torch.randn(n, V, generator=g).half()]:
        x, ref = ScaledLogits.wrap(raw, scale), product(raw, scale)
        assert torch.equal(
            logits_to_probs_fast(x, params, width=width),
            logits_to_probs_fast(ref, params, width=width),
        )
        assert torch.equal(logits_to_probs(x, params), logits_to_probs(ref, params))
        got = shortlist_probs(x[rows], sub, width=width)
        want = shortlist_probs(ref[rows], sub, width=width)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert torch.equal(got.ids, want.ids) and torch.equal(got.probs, want.probs)
            u = torch.rand(len(rows), generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
            assert torch.equal(got.draw(u, check=False), want.draw(u))
    # [B, K+1, V] target logits, peaked so the shortlist decides, ties everywhere
    three = SamplingTensors.from_params(
        [SamplingParams(0.8, 0, 0.95), SamplingParams(1.0, 20, 0.9), SamplingParams(0.8, 50)] * 4
    )
    raw = ((torch.randn(12, 5, 2000, generator=g) * 4).round() / scale).bfloat16()
    got = shortlist_probs(ScaledLogits.wrap(raw, scale), three, width=256)
    want = shortlist_probs(product(raw, scale), three, width=256)
    assert got is not None and want is not None
    assert torch.equal(got.ids, want.ids) and torch.equal(got.probs, want.probs)


def test_non_finite_and_overflow_under_the_scale_raise_the_products_line() -> None:
    """NaN and ±inf as for any logits, and a finite bfloat16 logit whose float32 product is inf
    (3e38 · 20): the product's error line, for the fast pipelines as for the reference."""
    params = SamplingTensors.from_params([SamplingParams(temperature=0.8, top_p=0.9)] * 2)
    for bad in (float("nan"), float("inf"), float("-inf"), 3e38, -3e38):
        raw = torch.zeros(2, 3, 50, dtype=torch.bfloat16)
        raw[1, 2, 7] = bad
        with pytest.raises(NumericsError) as ref:
            logits_to_probs(product(raw, 20.0), params)
        for fn in (logits_to_probs_fast, shortlist_probs):
            with pytest.raises(NumericsError) as got:
                fn(ScaledLogits.wrap(raw, 20.0), params, width=8)
            assert str(got.value) == str(ref.value)


@pytest.fixture(scope="module")
def scaled_pair() -> tuple[StaticHFModel, ...]:
    """The realistic pair's ``logit_scale`` 20: native (``ScaledLogits``), then the float32
    product (``native_logits=False``, what the static model returned before)."""
    return static_pairs(20.0)


def test_static_model_returns_scaled_logits(scaled_pair) -> None:
    nat, _, cast, _ = scaled_pair
    assert nat.native_logits and not cast.native_logits
    ids = torch.tensor([3, 1, 4, 1, 5])
    (c1, l1), (c2, l2) = nat.prefill_shared(ids, 2), cast.prefill_shared(ids, 2)
    assert isinstance(l1, ScaledLogits) and l1.scale == 20.0 and type(l2) is torch.Tensor
    assert torch.equal(l1.float(), l2)
    f1, f2 = nat.forward(c1, torch.tensor([[9], [2]])), cast.forward(c2, torch.tensor([[9], [2]]))
    assert isinstance(f1, ScaledLogits) and torch.equal(f1.float(), f2)
    # float32 under a scale: the product as before
    fp32 = from_preset("qwen3-tiny", seed=5, num_hidden_layers=1, logit_scale=2.0)
    assert not StaticHFModel(fp32, cuda_graphs=False).native_logits


@pytest.mark.parametrize("onehot", [True, False], ids=["onehot", "sampled"])
def test_scaled_logits_decode_the_same_tokens(scaled_pair, onehot: bool) -> None:
    """The fast loops on ``ScaledLogits`` vs on the float32 product: the same tokens, rounds and
    white-box columns (greedy and temperature-only rows included: their dense laws)."""
    params = [SamplingParams(0.8, 0, 0.95), SamplingParams(1.0, 8, 0.9, 0.05), SamplingParams(0.7)]
    rows = [RowSpec(f"c{i}", s, p) for s in range(4) for i, p in enumerate(params)]
    rows.append(RowSpec("greedy", 0, SamplingParams(0.0)))
    drafter = DrafterSpec(onehot=onehot, k=3)
    req = DecodeRequest(
        [1, 2, 3], rows, num_positions=9, run_key=7, prompt_id="p", whitebox=True, batch_size=7
    )
    assert_same_decodes(scaled_pair, req, drafter, full=True)
    # mutants: the ε tooth's dense rounds, and a verify hook that takes the logits as they are
    # (it sees the product)
    for name in ("eps_biased:0.5", "target_unprocessed"):
        assert_same_decodes(scaled_pair, req, drafter, name)


INTERPRETED = textwrap.dedent(
    """
    import json, torch
    from spectest.sampling import kernels
    out = {}
    for scale in (20.0, 0.1):
        g = torch.Generator().manual_seed(3)
        x = (torch.randn(6, 5001, generator=g) * 3).bfloat16()
        t = torch.tensor([0.3, 0.8, 1.0, 1.7, 0.8, 2.0], dtype=torch.float64)
        prod = x.to(torch.float32).mul_(scale)
        mx = prod.amax(-1, keepdim=True).to(torch.float64)
        ref = kernels.weight_sum_reference(prod, t, mx)
        same = torch.equal(kernels.weight_sum_reference(x, t, mx, scale), ref)
        got = kernels.launch(x, t, mx, scale)
        out[str(scale)] = [same, float(((got - ref).abs() / ref).max())]
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_the_normaliser_kernel_scales_as_the_model_did() -> None:
    """The fused normaliser on native logits and a scale: its reference is the one on the float32
    product bit for bit, and the kernel (Triton's interpreter) equals that to 1e-12 relative."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPECTEST_NO_KERNELS": ""}
    res = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(out) == {"20.0", "0.1"}
    for same, rel in out.values():
        assert same and rel <= 1e-12, out


# ----------------------------------------------------------------------------- native argmax
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_product_is_strictly_increasing_where_argmax_holds(dtype: torch.dtype) -> None:
    """Every 16-bit value, in order: wherever ``argmax_holds`` says a product is a maximum that
    the native argmax finds, the next smaller value's product is smaller (so no earlier id can
    tie it). Exhaustive over the 65 536 bit patterns at each scale; scales that overflow (20 and
    3e30 for bfloat16, 1e35 for float16) or underflow (1e-30, 1e-41) do tie products, and only
    where it fails, so the rule is not vacuous."""
    from spectest.sampling.scaled import argmax_holds

    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    x = torch.unique(every[~torch.isnan(every)].float()).to(dtype)  # ascending, ±0 as one
    tying = (20.0, 3e30, 1e-30) if dtype == torch.bfloat16 else (1e35, 1e-41)
    for scale in (*SCALES, 1.0, 7.3e-3, *tying):
        f = product(x, scale)
        holds = argmax_holds(f)
        assert bool((f[:-1] < f[1:])[holds[1:]].all()), scale
        ties = f[:-1] == f[1:]
        assert not bool(holds[1:][ties].any()) and (scale not in tying or bool(ties.any()))


class _Kept:
    """A ``draw.Flags`` that keeps each call's rows."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def add(self, ok: torch.Tensor) -> None:
        self.rows.append(ok)


def test_a_native_argmax_is_the_products_where_its_flag_holds() -> None:
    """``argmax_tokens(ScaledLogits, defer=)`` reads the native logits: the product's argmax where
    the flag holds (ties at the maximum, a NaN row: V, a maximum tied only by ``x``), and the flag
    fails where products tie that ``x`` does not (a maximum that overflows at 3e38 · 20, one that
    underflows at 1.2e-15 · 1e-30), or every product is -inf. There the two argmaxes differ: the
    flag is what keeps the tokens the product's."""
    from spectest.sampling.draw import argmax_tokens

    g = torch.Generator().manual_seed(11)
    for scale, big, small in ((20.0, 3e38, 2e38), (1e-30, 1.2e-15, 1e-15)):
        x = (torch.randn(6, 50, generator=g) * 3).bfloat16()
        x[1, [4, 30]] = 20.0  # a tie at the maximum: the first id
        x[2, 17] = float("nan")
        x[3] = -1.0
        x[3, 9], x[3, 4] = big, small  # both products inf (20) / the smallest subnormal (1e-30)
        f = product(x[3, [4, 9]], scale)
        assert bool(f[0] == f[1])
        x[4] = float("-inf")
        x[5, 0] = -50.0
        kept = _Kept()
        got = argmax_tokens(ScaledLogits.wrap(x, scale), defer=kept)
        want = argmax_tokens(product(x, scale))
        (ok,) = kept.rows
        assert ok.tolist() == [True, True, True, False, False, True], scale
        assert torch.equal(got[ok], want[ok]) and got[1] == 4 and got[2] == 50
        assert got[3] == 9 and want[3] == 4  # why the flag: the product ties 4 and 9
        assert torch.equal(argmax_tokens(ScaledLogits.wrap(x, scale)), want)  # no defer: product


def test_a_deferred_native_argmax_decodes_the_same_tokens(scaled_pair, monkeypatch) -> None:
    """The one-hot drafter's argmax, the white-box bonus slot's and the plain loop's white-box q
    (``recorder.teacher_q``) read the native logits when the loop defers its reads: the same
    tokens, rounds and white-box columns as the float32 product's loops, each chunk run once
    (the native argmax ran: counted); with the flag forced to fail, the first chunk is redone
    with the reads made and the rest read at once — the same outputs again."""
    from spectest.sampling import draw, scaled
    from spectest.sampling import pipeline as pipeline_mod
    from tests.test_engine_deferred import _counted

    monkeypatch.setattr(pipeline_mod, "DEFER_ON", frozenset({"cpu"}))
    params = [SamplingParams(temperature=1.0, top_k=20), SamplingParams(temperature=0.7, top_k=8)]
    rows = [RowSpec(f"c{i}", s, p) for s in range(3) for i, p in enumerate(params)]
    req = DecodeRequest(
        [1, 2, 3], rows, num_positions=9, run_key=7, prompt_id="p", whitebox=True, batch_size=4
    )
    native = []
    holds = scaled.argmax_holds
    monkeypatch.setattr(draw, "argmax_holds", lambda top: native.append(1) or holds(top))
    with monkeypatch.context() as mp:
        calls, plain = _counted(mp, "_spec_run"), _counted(mp, "_plain_chunk")
        assert_same_decodes(scaled_pair, req, DrafterSpec(onehot=True, k=3), full=True)
    assert calls == plain == [True] * 4 and native  # both pairs' chunks, never redone
    monkeypatch.setattr(draw, "argmax_holds", lambda top: torch.zeros_like(top, dtype=torch.bool))
    with monkeypatch.context() as mp:
        calls, plain = _counted(mp, "_spec_run"), _counted(mp, "_plain_chunk")
        assert_same_decodes(scaled_pair, req, DrafterSpec(onehot=True, k=3), full=True)
    # native: redone (the plain loop's white-box q too, ``recorder.teacher_q``); the product's:
    # as before
    assert calls == plain == [True, False, False, True, True]
