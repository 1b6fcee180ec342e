"""The fast sampling pipeline (``sampling/shortlist.py``) against the exact one (``transforms``):
the same support, probabilities within 1e-12 relative, the same tokens under the same uniforms, on
random and tied logits, every filter combination, widths that force the fallback; and the exact
variant wired to it still has the exact law (quadrature, as tests/test_mutants.py)."""

from __future__ import annotations

import math

import pytest
import torch

from spectest.errors import InputError
from spectest.sampling.draw import categorical
from spectest.sampling.exact_law import complete_law, plain_law, round_law, total_variation
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.shortlist import fast_variant, logits_to_probs_fast
from spectest.sampling.transforms import logits_to_probs


def random_params(g: torch.Generator, n: int, V: int) -> list[SamplingParams]:
    out = []
    for _ in range(n):
        r = torch.rand(4, generator=g, dtype=torch.float64).tolist()
        out.append(
            SamplingParams(
                temperature=[0.0, 0.3, 0.8, 1.0, 1.7][int(r[0] * 5)],
                top_k=[0, 1, 3, 20, V - 1, V][int(r[1] * 6)],
                top_p=[1.0, 0.5, 0.9, 0.95, 0.999][int(r[2] * 5)],
                min_p=[0.0, 0.0, 0.05, 0.3][int(r[3] * 4)],
            )
        )
    return out


def logits_sets(g: torch.Generator, n: int, V: int) -> list[torch.Tensor]:
    cont = (torch.randn(n, V, generator=g) * 3).float()  # [n, V] float32, as the models give
    ties = torch.randint(-3, 3, (n, V), generator=g).float()  # many exact ties at every boundary
    flat = torch.randn(n, V, generator=g).float() * 0.01  # near-uniform: wide nuclei (fallback)
    return [cont, ties, flat]


def assert_same_law(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == torch.float64 and got.shape == ref.shape
    assert torch.equal(got > 0, ref > 0)  # the support, exactly
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("width", [4, 16, 64, 1024])
def test_equal_to_the_exact_pipeline(width):
    """Widths 4 and 16 force the fallback on many rows (nuclei and top-k sets wider than W, ties
    across the shortlist boundary); 1024 > V shortlists every token."""
    g = torch.Generator().manual_seed(1)
    n, V = 150, 300
    params = SamplingTensors.from_params(random_params(g, n, V))
    for logits in logits_sets(g, n, V):
        got = logits_to_probs_fast(logits, params, width=width)
        assert_same_law(got, logits_to_probs(logits, params))


def test_three_d_logits_process_the_k_plus_1_rows_in_one_call():
    g = torch.Generator().manual_seed(2)
    B, S, V = 40, 5, 200
    params = SamplingTensors.from_params(random_params(g, B, V))
    logits = (torch.randn(B, S, V, generator=g) * 2).float()  # [B, K+1, V]
    assert_same_law(logits_to_probs_fast(logits, params, width=32), logits_to_probs(logits, params))


def test_same_tokens_under_the_same_uniforms():
    """The draws of categorical() on both laws, 50 uniforms per row (a boundary event, u*total
    within 1e-12 of a CDF step, has probability ~1e-10 over this test: effectively never)."""
    g = torch.Generator().manual_seed(3)
    n, V = 120, 500
    params = SamplingTensors.from_params(random_params(g, n, V))
    for logits in logits_sets(g, n, V):
        fast = logits_to_probs_fast(logits, params, width=64)
        ref = logits_to_probs(logits, params)
        for _ in range(50):
            u = torch.rand(n, generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
            assert torch.equal(categorical(fast, u), categorical(ref, u))


def test_seed_001_configs_at_a_large_vocabulary():
    """The three configs of seed 001 at V = 151 936 (Qwen3's vocabulary), logits with a realistic
    spread: equal laws, and the nucleus decided on the shortlist alone (no fallback needed)."""
    g = torch.Generator().manual_seed(4)
    V = 151_936
    configs = [
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=1.0, top_k=50),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
    ]
    params = SamplingTensors.from_params(configs * 2)
    logits = (torch.randn(6, V, generator=g) * 1.5).float()
    logits[:, :40] += 9.0  # a peaked head, as a trained or lm_head-scaled model
    assert_same_law(logits_to_probs_fast(logits, params), logits_to_probs(logits, params))
    # every row the same top-p-only config (the normaliser over V for all rows at once)
    one = SamplingTensors.from_params(configs[:1] * 6)
    assert_same_law(logits_to_probs_fast(logits, one), logits_to_probs(logits, one))


def test_bad_width_and_shape():
    params = SamplingTensors.from_params([SamplingParams()])
    with pytest.raises(InputError, match="width must be an integer >= 1"):
        logits_to_probs_fast(torch.zeros(1, 4), params, width=0)
    with pytest.raises(InputError, match=r"logits must be \[B, V\]"):
        logits_to_probs_fast(torch.zeros(4), params)


CANON = SamplingParams(temperature=0.8, top_k=4, top_p=0.8)


@pytest.mark.parametrize("onehot", [False, True], ids=["sampled", "onehot"])
def test_exact_variant_on_the_fast_pipeline_has_the_exact_law(onehot):
    """Quadrature over the uniforms (exact, no sampling): the fast-wired exact sampler's emitted
    prefix completed by plain sampling has the plain law to 1e-9 (the test_mutants setting)."""
    from test_mutants import canonical_chain

    chain = canonical_chain()
    variant = fast_variant(get_variant("exact"))
    assert variant.verify_fn is not get_variant("exact").verify_fn
    law = round_law(variant, chain.target, chain.draft, CANON, 2, onehot=onehot)
    assert math.isclose(sum(law.values()), 1.0, abs_tol=1e-12)
    plain = plain_law(chain.target, CANON, 3)
    assert total_variation(complete_law(law, chain.target, CANON, 3), plain) <= 1e-9


def test_fast_variant_keeps_a_mutants_changed_hook():
    swapped = get_variant("swapped_filter_order")
    assert fast_variant(swapped).verify_fn is swapped.verify_fn
    lying = get_variant("raw_q")
    assert fast_variant(lying).draft_fn is lying.draft_fn


@pytest.mark.parametrize("shape", ["2d", "3d"])
def test_shortlist_law_is_the_fast_pipelines_law_and_draws_the_same_tokens(shape):
    """``shortlist_probs(x).dense()`` is bit-equal to ``logits_to_probs_fast(x)``, and its draw on
    the shortlist gives ``categorical(dense)``'s token under every uniform (exact on CPU: the
    float64 CDF is summed in the same order); ``None`` whenever a row is greedy, unfiltered or
    not decided on its shortlist."""
    from spectest.sampling.shortlist import shortlist_probs

    g = torch.Generator().manual_seed(5)
    B, S, V, W = 60, 3, 400, 64
    # filtered rows whose kept sets fit in a shortlist of W = 64: top-k <= 20 or a 0.9-nucleus
    grid = [(t, k, tp, mp) for t in (0.3, 0.8, 1.0) for k in (0, 1, 3, 20)
            for tp in (1.0, 0.5, 0.9) for mp in (0.0, 0.05, 0.3)]  # fmt: skip
    grid = [c for c in grid if c[1] > 0 or c[2] < 1 or c[3] > 0]
    filt = [SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp) for t, k, tp, mp in grid]
    filt = (filt * 3)[:B]
    params = SamplingTensors.from_params(filt)
    logits = (torch.randn(B, S, V, generator=g) * 3).float()  # [B, S, V] peaked enough for W
    if shape == "2d":
        logits = logits[:, 0]
    law = shortlist_probs(logits, params, width=W)
    assert law is not None and law.ids.shape == (*logits.shape[:-1], W)
    dense = logits_to_probs_fast(logits, params, width=W)
    assert torch.equal(law.dense(), dense)
    assert bool((law.ids.diff(dim=-1) > 0).all())  # ascending, distinct
    for _ in range(30):
        u = torch.rand(logits.shape[:-1], generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
        assert torch.equal(law.draw(u), categorical(dense, u))
    greedy = SamplingTensors.from_params([SamplingParams(temperature=0.0), *filt[1:]])
    assert shortlist_probs(logits, greedy, width=W) is None
    plain = SamplingTensors.from_params([SamplingParams(temperature=0.9), *filt[1:]])
    assert shortlist_probs(logits, plain, width=W) is None
    wide = SamplingTensors.from_params([SamplingParams(temperature=1.0, top_k=W + 1), *filt[1:]])
    assert shortlist_probs(logits, wide, width=W) is None  # top-k wider than W: fallback row
    assert shortlist_probs(logits, params, width=V) is None


def test_non_finite_logits_raise_as_the_exact_pipeline():
    """The one-pass finite check raises the reference's error for NaN / ±inf, and lets through
    float64 logits whose sum overflows although every value is finite."""
    from spectest.errors import NumericsError
    from spectest.sampling.shortlist import shortlist_probs

    params = SamplingTensors.from_params([SamplingParams(temperature=0.8, top_p=0.9)] * 2)
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.zeros(2, 3, 50)
        x[1, 2, 7] = bad
        with pytest.raises(NumericsError) as ref:
            logits_to_probs(x, params)
        for fn in (logits_to_probs_fast, shortlist_probs):
            with pytest.raises(NumericsError) as got:
                fn(x, params, width=8)
            assert str(got.value) == str(ref.value)
            assert "row 1, position 2" in str(got.value) and "token 7" in str(got.value)
    huge = torch.full((2, 50), 1e308, dtype=torch.float64)
    huge[:, 0] = 0.0
    got_p = logits_to_probs_fast(huge, params, width=8)
    assert torch.equal(got_p, logits_to_probs(huge, params))


def test_one_host_sync_per_call_once_the_parameters_are_read(monkeypatch):
    """``shortlist_probs`` reads a parameter object's flags once (``params.host``) and then syncs
    once per call, after the work; a non-finite logit still raises the reference's line, also for
    unfiltered rows (which return None) and on the second call of the same parameters."""
    from spectest.errors import NumericsError
    from spectest.sampling.shortlist import shortlist_probs

    syncs = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: syncs.append(1) or tolist(t))
    g = torch.Generator().manual_seed(4)
    params = SamplingTensors.from_params([SamplingParams(temperature=0.8, top_p=0.9)] * 3)
    x = (torch.randn(3, 2, 300, generator=g) * 4).float()
    first = shortlist_probs(x, params, width=64)
    assert first is not None and len(syncs) == 2 and len(params.host) == 1
    again = shortlist_probs(x, params, width=64)
    assert again is not None and len(syncs) == 3
    assert torch.equal(again.ids, first.ids) and torch.equal(again.probs, first.probs)
    # the same law from fresh parameters (no flags kept)
    fresh = SamplingTensors.from_params([SamplingParams(temperature=0.8, top_p=0.9)] * 3)
    other = shortlist_probs(x, fresh, width=64)
    assert other is not None and torch.equal(other.probs, first.probs)
    unfiltered = SamplingTensors.from_params([SamplingParams(temperature=0.8)] * 3)
    for p in (params, unfiltered):
        bad = x.clone()
        bad[2, 1, 5] = float("nan")
        with pytest.raises(NumericsError) as ref:
            logits_to_probs(bad, p)
        with pytest.raises(NumericsError) as got:
            shortlist_probs(bad, p, width=64)
        assert str(got.value) == str(ref.value)
    assert shortlist_probs(x, unfiltered, width=64) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_p_only_calls_take_the_short_path_with_the_general_paths_bits(dtype):
    """A call whose every row has top-p alone (``_filtered``'s short path: no top-k or min-p
    steps) returns the general path's ids, law and decisions bit for bit — on continuous, tied
    and flat (undecided) logits, one temperature and nucleus per row — and dispatches fewer ops.
    The general path is forced by stating one min-p row, which changes nothing of its law."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from spectest.sampling.shortlist import _filtered

    class Ops(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.n += 1
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(6)
    n, V, W = 90, 400, 32
    cfgs = [SamplingParams(temperature=t, top_p=p) for t in (0.3, 0.8, 1.7) for p in (0.5, 0.9)]
    params = SamplingTensors.from_params((cfgs * n)[:n])
    undecided = 0
    for logits in logits_sets(g, n, V):
        x = logits.to(dtype)
        counts = []
        for stated in ((n, 0), (n, 1)):  # short path, general path
            Ops.n = 0
            with Ops():
                out = _filtered(x, params, W, stated)
            counts.append((Ops.n, out))
        (short_ops, short), (general_ops, general) = counts
        assert all(torch.equal(a, b) for a, b in zip(short, general, strict=True))
        assert short_ops < general_ops - 20
        undecided += int((~short[2]).sum())
    assert undecided > 0  # the flat logits' nuclei do not fit W: the decisions were exercised
