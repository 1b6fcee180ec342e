"""The model's native logits (bfloat16) through the fast pipeline, against their float32 cast:
the same law bit for bit (dense and on the shortlist, ties and fallbacks included), the same
tokens under the same uniforms, the same error line for NaN / ±inf and for bad parameters; the
sync-free positive-weight fix-up of ``categorical`` against the synced one; and
``StaticHFModel(native_logits=True)`` decoding the same tokens as its float32-cast twin.

All inputs are fixed (seeded) and every comparison is exact (``torch.equal``): the claims are
bit-identities (bfloat16 → float32 → float64 is exact and monotone), so the false-failure rate is
zero."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec
from spectest.engines.fast import plain_decode_fast, speculative_decode_fast
from spectest.errors import ConfigError, NumericsError
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel
from spectest.sampling.draw import _next_positive, categorical
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.shortlist import logits_to_probs_fast, shortlist_probs
from spectest.sampling.transforms import logits_to_probs

GRID = [
    SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp)
    for t in (0.3, 0.8, 1.0)
    for k in (0, 1, 3, 20)
    for tp in (1.0, 0.5, 0.9, 0.95)
    for mp in (0.0, 0.05)
]


def native_sets(g: torch.Generator, n: int, V: int) -> list[torch.Tensor]:
    """``[n, V]`` bfloat16 logits: continuous (rounded to bfloat16: many ties), small integers
    (ties at every boundary) and near-flat (nuclei wider than the shortlist: fallback)."""
    cont = torch.randn(n, V, generator=g) * 3
    ties = torch.randint(-3, 3, (n, V), generator=g).float()
    flat = torch.randn(n, V, generator=g) * 0.01
    return [x.to(torch.bfloat16) for x in (cont, ties, flat)]


@pytest.mark.parametrize("width", [4, 16, 64, 1024])
def test_native_logits_give_the_cast_logits_law_bit_for_bit(width: int) -> None:
    g = torch.Generator().manual_seed(11)
    n, V = len(GRID), 300
    params = SamplingTensors.from_params(GRID)
    for x in native_sets(g, n, V):
        cast = x.float()
        assert torch.equal(
            logits_to_probs_fast(x, params, width=width),
            logits_to_probs_fast(cast, params, width=width),
        )
        assert torch.equal(logits_to_probs(x, params), logits_to_probs(cast, params))
        # every row filtered: the shortlist decides, or says None, the same way for both
        rows = [i for i, p in enumerate(GRID) if p.top_k or p.top_p < 1 or p.min_p]
        sub = SamplingTensors.from_params([GRID[i] for i in rows])
        got, want = (
            shortlist_probs(x[rows], sub, width=width),
            shortlist_probs(cast[rows], sub, width=width),
        )
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert torch.equal(got.ids, want.ids) and torch.equal(got.probs, want.probs)
            for _ in range(10):
                u = torch.rand(len(rows), generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
                assert torch.equal(got.draw(u, check=False), want.draw(u))


def test_native_three_d_logits_and_the_shortlist_draws() -> None:
    """``[B, K+1, V]`` bfloat16 target logits, peaked enough that the shortlist decides."""
    g = torch.Generator().manual_seed(12)
    B, S, V, W = 40, 5, 2000, 256
    params = SamplingTensors.from_params(
        [
            SamplingParams(0.8, 0, 0.95),
            SamplingParams(1.0, 20, 0.9),
            SamplingParams(0.7, 0, 1.0, 0.1),
            SamplingParams(0.8, 50),
        ]
        * 10
    )
    x = (torch.randn(B, S, V, generator=g) * 4).round().to(torch.bfloat16)  # ties everywhere
    got, want = shortlist_probs(x, params, width=W), shortlist_probs(x.float(), params, width=W)
    assert got is not None and want is not None
    assert torch.equal(got.ids, want.ids) and torch.equal(got.probs, want.probs)
    assert torch.equal(got.dense(), logits_to_probs_fast(x.float(), params, width=W))
    u = torch.rand(B, S, generator=g, dtype=torch.float64)
    assert torch.equal(got.draw(u, check=False), categorical(want.dense(), u))


def test_native_non_finite_logits_and_bad_params_raise_the_same_line() -> None:
    params = SamplingTensors.from_params([SamplingParams(temperature=0.8, top_p=0.9)] * 2)
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.zeros(2, 3, 50, dtype=torch.bfloat16)
        x[1, 2, 7] = bad
        with pytest.raises(NumericsError) as ref:
            logits_to_probs(x.float(), params)
        for fn in (logits_to_probs_fast, shortlist_probs):
            with pytest.raises(NumericsError) as got:
                fn(x, params, width=8)
            assert str(got.value) == str(ref.value)
        # bad parameters come first, as ``validate`` then the finite check ordered them
        worse = SamplingTensors.from_params([SamplingParams(temperature=0.8, top_p=0.9)] * 2)
        worse.top_p[1] = 1.5
        with pytest.raises(ConfigError) as ref_c:
            worse.validate(batch_size=2, where="shortlist_probs params")
        with pytest.raises(ConfigError) as got_c:
            shortlist_probs(x, worse, width=8)
        assert str(got_c.value) == str(ref_c.value)


def test_sync_free_fix_up_equals_the_synced_one() -> None:
    """The fix-up on every row (an id with weight is its own fix-up) equals the fix-up on the
    flagged rows only (``index_put``) for any found indices; ``categorical`` unchecked (sync-free
    at a shortlist's width) draws the checked one's tokens. (On CPU a sequential cumsum never
    lands on a zero weight, so the fix-up is exercised through its two forms directly.)"""
    g = torch.Generator().manual_seed(13)
    N, W = 400, 64
    w = torch.rand(N, W, generator=g, dtype=torch.float64)
    w[w < 0.6] = 0.0  # zero runs everywhere
    w[:, 0] = 0.5  # every row has positive mass
    idx = torch.randint(0, W, (N,), generator=g)
    zero = ~(w.gather(-1, idx[:, None]).squeeze(-1) > 0)
    assert int(zero.sum()) >= 100
    rows = torch.nonzero(zero).squeeze(-1)
    synced = idx.index_put((rows,), _next_positive(w[rows], idx[rows]))
    assert torch.equal(_next_positive(w, idx), synced)
    for _ in range(5):
        u = torch.rand(N, generator=g, dtype=torch.float64)
        assert torch.equal(categorical(w, u, check=False), categorical(w, u, check=True))


def static_pairs(logit_scale: float) -> tuple[StaticHFModel, ...]:
    """A bfloat16 target and draft, native (target, draft), then on the float32 logits."""
    # V = 2048 > the shortlist's 1024: the rounds run on shortlist laws (top-k rows decide)
    target = from_preset(
        "qwen3-tiny",
        seed=5,
        num_hidden_layers=3,
        vocab_size=2048,
        dtype=torch.bfloat16,
        logit_scale=logit_scale,
    )
    draft = first_layers(target, 1)
    return tuple(
        StaticHFModel(m, cuda_graphs=False, native_logits=native)
        for native in (True, False)
        for m in (target, draft)
    )


@pytest.fixture(scope="module")
def bf16_pair() -> tuple[StaticHFModel, ...]:
    return static_pairs(1.0)


def test_static_model_native_logits(bf16_pair) -> None:
    """bfloat16 logits as computed, equal to the float32-cast model's (under a ``logit_scale``:
    tests/test_sampling_scaled.py)."""
    nat, _, cast, _ = bf16_pair
    assert nat.native_logits and not cast.native_logits
    ids = torch.tensor([3, 1, 4, 1, 5])
    (c1, l1), (c2, l2) = nat.prefill_shared(ids, 2), cast.prefill_shared(ids, 2)
    assert l1.dtype == torch.bfloat16 and l2.dtype == torch.float32
    assert torch.equal(l1.float(), l2)
    f1, f2 = nat.forward(c1, torch.tensor([[9], [2]])), cast.forward(c2, torch.tensor([[9], [2]]))
    assert f1.dtype == torch.bfloat16 and torch.equal(f1.float(), f2)


@pytest.mark.parametrize("onehot", [True, False], ids=["onehot", "sampled"])
def test_native_logits_decode_the_same_tokens(bf16_pair, onehot: bool) -> None:
    """The fast loops on native bfloat16 logits vs on their float32 cast: the same tokens,
    rounds and white-box columns (CPU, where every float64 sum runs in one order)."""
    params = [SamplingParams(0.8, 50), SamplingParams(1.0, 8, 0.9, 0.05), SamplingParams(0.7, 20)]
    rows = [RowSpec(f"c{i}", s, p) for s in range(4) for i, p in enumerate(params)]
    mixed = [*rows, RowSpec("greedy", 0, SamplingParams(0.0))]  # a greedy row: dense laws
    drafter = DrafterSpec(onehot=onehot, k=3)
    kw = dict(run_key=7, prompt_id="p", whitebox=True, batch_size=6)
    req = DecodeRequest([1, 2, 3], rows, num_positions=9, **kw)
    assert_same_decodes(bf16_pair, req, drafter, full=True)
    req = DecodeRequest([1, 2, 3], mixed, num_positions=9, **kw)
    assert_same_decodes(bf16_pair, req, drafter)


def assert_same_decodes(
    pairs: tuple[Any, Any, Any, Any],
    req: DecodeRequest,
    drafter: DrafterSpec,
    variant: str = "exact",
    *,
    full: bool = False,
) -> None:
    """The fast speculative loop of ``req`` on both pairs ``(target, draft, target', draft')``:
    the same tokens and white-box columns; ``full``: also the same rounds, and plain decode's
    tokens and white-box columns the same."""
    nt, nd, ct, cd = pairs
    a = speculative_decode_fast(nt, nd, req, drafter=drafter, variant=get_variant(variant))
    b = speculative_decode_fast(ct, cd, req, drafter=drafter, variant=get_variant(variant))
    assert np.array_equal(a.tokens, b.tokens) and a.whitebox is not None
    assert a.whitebox.equals(b.whitebox)
    if not full:
        return
    assert a.rounds is not None and b.rounds is not None and a.rounds.equals(b.rounds)
    p1 = plain_decode_fast(nt, req, draft=nd, drafter=drafter)
    p2 = plain_decode_fast(ct, req, draft=cd, drafter=drafter)
    assert np.array_equal(p1.tokens, p2.tokens) and p1.whitebox is not None
    assert p1.whitebox.equals(p2.whitebox)


@pytest.mark.gpu
@pytest.mark.parametrize("logit_scale", [1.0, 20.0])
def test_native_logits_on_cuda_decode_the_same_tokens(logit_scale: float) -> None:
    """On CUDA (graphs, the fused normaliser): native bfloat16 logits vs their float32 cast (under
    the realistic pair's ``logit_scale`` 20: ``ScaledLogits`` vs the float32 product), the same
    tokens and rounds. False-failure rate: a draw can differ only if the shortlist's tie choice
    moves a zero in a parallel float64 scan, or the normaliser's float64 terms are added in
    another order (a bfloat16 load), and ``u * total`` lies within that rounding of a CDF step
    (~1e-16 per draw)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    target = from_preset(
        "qwen3-tiny",
        seed=5,
        num_hidden_layers=3,
        vocab_size=4096,
        device="cuda",
        dtype=torch.bfloat16,
        logit_scale=logit_scale,
    )
    draft = first_layers(target, 1)
    params = [SamplingParams(0.8, 0, 0.95), SamplingParams(0.8, 50), SamplingParams(1.0, 8, 0.9)]
    rows = [RowSpec(f"c{i}", s, p) for s in range(64) for i, p in enumerate(params)]
    req = DecodeRequest([1, 2, 3], rows, num_positions=40, run_key=7, prompt_id="p")
    outs = []
    for native in (True, False):
        t, d = (StaticHFModel(m, native_logits=native) for m in (target, draft))
        assert t.native_logits == native
        for onehot in (False, True):
            drafter = DrafterSpec(onehot=onehot, k=4)
            out = speculative_decode_fast(t, d, req, drafter=drafter, variant=get_variant("exact"))
            outs.append((out.tokens, out.rounds))
            assert t.graph_error is None, t.graph_error
    for (ta, ra), (tb, rb) in zip(outs[:2], outs[2:], strict=True):
        assert np.array_equal(ta, tb) and ra is not None and ra.equals(rb)
