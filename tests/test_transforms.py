"""logits_to_probs (pipeline, tie rules, greedy, errors) and the inverse-CDF draw, each against its
slow Python reference, and the pipeline against HF transformers' warpers."""

from __future__ import annotations

import math

import pytest
import torch

from spectest.errors import ConfigError, InputError, NumericsError
from spectest.sampling.draw import argmax_tokens, categorical, categorical_reference
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs, logits_to_probs_reference


def st(*params: SamplingParams) -> SamplingTensors:
    return SamplingTensors.from_params(list(params))


def random_params(
    g: torch.Generator, n: int, ks: tuple[int, ...] = (0, 1, 3, 6)
) -> list[SamplingParams]:
    out = []
    for _ in range(n):
        r = torch.rand(4, generator=g, dtype=torch.float64).tolist()
        out.append(
            SamplingParams(
                temperature=[0.0, 0.3, 1.0, 1.7][int(r[0] * 4)],
                top_k=ks[int(r[1] * len(ks))],
                top_p=[1.0, 0.5, 0.8, 0.95][int(r[2] * 4)],
                min_p=[0.0, 0.05, 0.3, 0.0][int(r[3] * 4)],
            )
        )
    return out


@pytest.mark.parametrize("ks", [(0, 1, 3, 6), (1, 3, 6)], ids=["mixed_top_k", "all_top_k"])
@pytest.mark.parametrize("order", ["top_k_then_top_p", "top_p_then_top_k"])
def test_fast_path_equals_reference(order, ks):
    """Random logits (continuous) and integer logits (many exact ties) vs the Python reference.
    With top-k on every row, top-p sorts only the surviving tokens (the reduced path)."""
    g = torch.Generator().manual_seed(0)
    n, V = 200, 9
    params = random_params(g, n, ks)
    cont = torch.randn(n, V, generator=g, dtype=torch.float64) * 2
    ties = torch.randint(-2, 2, (n, V), generator=g).to(torch.float64)
    for logits in (cont, ties, cont.float()):
        got = logits_to_probs(logits, st(*params), order=order)
        assert got.dtype == torch.float64 and got.shape == (n, V)
        for i, prm in enumerate(params):
            ref = logits_to_probs_reference(
                logits[i].double().tolist(), prm.temperature, prm.top_k, prm.top_p, prm.min_p, order
            )
            assert [r == 0 for r in ref] == (got[i] == 0).tolist(), (i, prm)  # same support
            assert torch.allclose(
                got[i], torch.tensor(ref, dtype=torch.float64), atol=1e-15, rtol=1e-12
            )
        assert torch.allclose(got.sum(-1), torch.ones(n, dtype=torch.float64), atol=1e-14)


def test_matches_hf_warpers():
    """Without ties, temperature → top-k → top-p → min-p equals HF's warper chain (transformers
    ``generation/utils.py`` builds them in this order) on the support and the values."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(1)
    V = 50
    for T, k, p, m in [
        (0.7, 20, 0.9, 0.0),
        (1.3, 0, 0.6, 0.1),
        (1.0, 5, 1.0, 0.2),
        (0.5, 30, 0.75, 0.05),
    ]:
        logits = torch.randn(64, V, generator=g, dtype=torch.float64) * 2
        scores = logits.clone()
        for w in (
            TemperatureLogitsWarper(T),
            *([TopKLogitsWarper(k)] if k else []),
            *([TopPLogitsWarper(p)] if p < 1 else []),
            *([MinPLogitsWarper(m)] if m else []),
        ):
            scores = w(None, scores)
        hf = torch.softmax(scores, -1)
        ours = logits_to_probs(logits, st(*[SamplingParams(T, k, p, m)] * 64))
        assert torch.equal(hf == 0, ours == 0)
        assert torch.allclose(hf, ours, atol=1e-12)


def test_greedy_one_hot_lowest_id_on_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0], [0.0, 1.0, 2.0, 2.5]])
    probs = logits_to_probs(logits, st(*[SamplingParams(temperature=0.0, top_k=2)] * 3))
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]


def test_top_k_keeps_all_ties_at_the_boundary():
    logits = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.1, 0.1]], dtype=torch.float64))
    probs = logits_to_probs(logits, st(SamplingParams(top_k=2)))
    assert (probs[0] > 0).tolist() == [
        True,
        True,
        True,
        False,
        False,
    ]  # 3 tokens tied/above the 2nd
    assert torch.allclose(probs[0, :3], torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    probs = logits_to_probs(logits, st(SamplingParams(top_k=4)))
    assert (probs[0] > 0).tolist() == [True] * 5  # the 4th value (0.1) is tied with the 5th


def test_top_p_keeps_the_crossing_token_and_breaks_ties_by_id():
    logits = torch.log(torch.tensor([[0.1, 0.5, 0.25, 0.15]], dtype=torch.float64))
    # sorted: 0.5, 0.25 (mass before: 0, 0.5, 0.75, 0.9)
    assert (logits_to_probs(logits, st(SamplingParams(top_p=0.5)))[0] > 0).tolist() == [0, 1, 0, 0]
    assert (logits_to_probs(logits, st(SamplingParams(top_p=0.6)))[0] > 0).tolist() == [0, 1, 1, 0]
    assert (logits_to_probs(logits, st(SamplingParams(top_p=0.76)))[0] > 0).tolist() == [0, 1, 1, 1]
    flat = torch.zeros(1, 4, dtype=torch.float64)  # four ties of 0.25: lower ids first
    assert (logits_to_probs(flat, st(SamplingParams(top_p=0.3)))[0] > 0).tolist() == [1, 1, 0, 0]
    assert (logits_to_probs(flat, st(SamplingParams(top_p=0.25)))[0] > 0).tolist() == [1, 0, 0, 0]
    # after top-k (the reduced sort over survivors): the tie is still broken by id
    x = torch.tensor([[-5.0, 0.0, 0.0, 3.0, 0.0, -5.0, 0.0, -5.0]], dtype=torch.float64)
    for k in (5, 6):  # both keep {3} and the four tied zeros (ties at the top-k boundary)
        kept = logits_to_probs(x, st(SamplingParams(top_k=k, top_p=0.9)))[0] > 0
        assert kept.tolist() == [0, 1, 1, 1, 0, 0, 0, 0]  # 0.83 + 2 x 0.04 crosses 0.9


def test_top_p_one_is_off_even_with_a_tiny_tail():
    logits = torch.tensor(
        [[0.0, -700.0, -745.0]], dtype=torch.float64
    )  # tail mass ~1e-304, ~5e-324
    probs = logits_to_probs(logits, st(SamplingParams(top_p=1.0)))
    assert bool((probs > 0).all())


def test_min_p_uses_the_post_top_p_max():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]], dtype=torch.float64))
    probs = logits_to_probs(logits, st(SamplingParams(min_p=0.2)))  # threshold 0.1
    assert (probs[0] > 0).tolist() == [True, True, True, False]
    # top_p = 0.8 keeps {0.5, 0.3} → renormalised (0.625, 0.375); min_p 0.7 → threshold 0.4375
    probs = logits_to_probs(logits, st(SamplingParams(top_p=0.8, min_p=0.7)))
    assert (probs[0] > 0).tolist() == [True, False, False, False]
    # min_p 0.5 → threshold 0.3125 keeps both (on the pre-top-p law 0.5 * 0.5 = 0.25 < 0.3 too)
    probs = logits_to_probs(logits, st(SamplingParams(top_p=0.8, min_p=0.5)))
    assert torch.allclose(probs[0], torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))


def test_swapped_order_differs_only_when_both_filters_are_active():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]], dtype=torch.float64))
    both = st(SamplingParams(top_k=3, top_p=0.8))
    a = logits_to_probs(logits, both)
    b = logits_to_probs(logits, both, order="top_p_then_top_k")
    assert (a[0] > 0).tolist() == [1, 1, 0, 0, 0] and (b[0] > 0).tolist() == [1, 1, 1, 0, 0]
    for one in (SamplingParams(top_k=3), SamplingParams(top_p=0.8)):
        assert torch.equal(
            logits_to_probs(logits, st(one)),
            logits_to_probs(logits, st(one), order="top_p_then_top_k"),
        )


def test_three_d_logits_broadcast_params_over_positions():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 6, generator=g)
    params = [SamplingParams(0.5, 2), SamplingParams(1.0, 0, 0.7), SamplingParams(0.0)]
    probs = logits_to_probs(logits, st(*params))
    assert probs.shape == (3, 4, 6)
    for b in range(3):
        assert torch.equal(probs[b], logits_to_probs(logits[b], st(*[params[b]] * 4)))


def test_per_position_parameters_are_made_once_per_parameter_object():
    """``per_position`` repeats each row's parameters for its positions and keeps the result: a
    speculative chunk's verify call asks for the same K + 1 positions every round."""
    params = st(SamplingParams(0.5, 2), SamplingParams(1.0, 0, 0.7, 0.1))
    five = params.per_position(5, torch.device("cpu"))
    assert five is params.per_position(5, torch.device("cpu"))
    assert five.top_k.tolist() == [2] * 5 + [0] * 5
    assert five.min_p.tolist() == [0.0] * 5 + [0.1] * 5
    one = params.per_position(1, torch.device("cpu"))
    assert one is not five and torch.equal(one.top_p, params.top_p)


def test_non_finite_logits_name_the_row():
    logits = torch.zeros(3, 2, 5)
    logits[2, 1, 3] = float("inf")
    with pytest.raises(NumericsError, match=r"row 2, position 1 .* token 3: inf"):
        logits_to_probs(logits, st(*[SamplingParams()] * 3))
    with pytest.raises(NumericsError, match="row 1 has a non-finite value at token 0: nan"):
        logits_to_probs(
            torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), st(*[SamplingParams()] * 2)
        )


def test_bad_param_tensors_raise():
    good = st(SamplingParams(), SamplingParams())
    bad_t = SamplingTensors(
        torch.tensor([1.0, -1.0], dtype=torch.float64), good.top_k, good.top_p, good.min_p
    )
    with pytest.raises(
        ConfigError, match=r"row 1: temperature must be a finite number >= 0, got -1.0"
    ):
        logits_to_probs(torch.zeros(2, 3), bad_t)
    bad_p = SamplingTensors(
        good.temperature, good.top_k, torch.tensor([1.0, 0.0], dtype=torch.float64), good.min_p
    )
    with pytest.raises(ConfigError, match=r"row 1: top_p must be in \(0, 1\], got 0.0"):
        logits_to_probs(torch.zeros(2, 3), bad_p)
    with pytest.raises(InputError, match="rows, expected 3"):
        logits_to_probs(torch.zeros(3, 3), good)
    wrong_dtype = SamplingTensors(good.temperature, good.top_k.float(), good.top_p, good.min_p)
    with pytest.raises(InputError, match=r"top_k must be a 1-D torch\.int64 tensor"):
        logits_to_probs(torch.zeros(2, 3), wrong_dtype)
    with pytest.raises(InputError, match="order must be one of"):
        logits_to_probs(torch.zeros(2, 3), good, order="min_p_first")


# ----------------------------------------------------------------------------- draw


def test_categorical_equals_reference_and_never_a_zero_weight_token():
    g = torch.Generator().manual_seed(3)
    n, V = 2000, 7
    w = torch.rand(n, V, generator=g, dtype=torch.float64)
    w[torch.rand(n, V, generator=g) < 0.4] = 0.0
    w[:, 3] += 1e-3  # every row has mass
    u = torch.rand(n, generator=g, dtype=torch.float64).clamp(1e-300, 1 - 2**-53)
    u[:5] = torch.tensor([2.0**-53, 1e-300, 1 - 2**-53, 0.5, 1 - 2**-52], dtype=torch.float64)
    tok = categorical(w, u)
    assert tok.dtype == torch.int64 and tok.shape == (n,)
    assert bool((w.gather(-1, tok[:, None]) > 0).all())
    ref = [categorical_reference(w[i].tolist(), float(u[i])) for i in range(n)]
    assert tok.tolist() == ref


def test_categorical_fixup_equals_the_reference_rule():
    """``_next_positive`` (the fix-up of rows whose found index has zero weight) against the
    reference's rule, a Python loop: the first positive-weight id at or after the index, else the
    last positive-weight id — every index of random rows with zeros (exact)."""
    from spectest.sampling.draw import _next_positive

    g = torch.Generator().manual_seed(4)
    n, V = 300, 9
    w = torch.rand(n, V, generator=g, dtype=torch.float64)
    w[torch.rand(n, V, generator=g) < 0.6] = 0.0
    w[:, 0] += 1e-3  # every row has mass
    for i in range(V):
        idx = torch.full((n,), i, dtype=torch.int64)
        got = _next_positive(w, idx).tolist()
        want = []
        for row in w.tolist():
            nxt = [j for j in range(i, V) if row[j] > 0]
            want.append(nxt[0] if nxt else max(j for j in range(V) if row[j] > 0))
        assert got == want


def test_categorical_law_by_quadrature():
    """Midpoints of the CDF pieces land on each token with weight = its probability (exact)."""
    w = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0], dtype=torch.float64)
    edges = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w, 0)])
    mids = (edges[1:] + edges[:-1]) / 2
    pos = w > 0
    tok = categorical(w.expand(int(pos.sum()), 6).contiguous(), mids[pos].contiguous())
    assert tok.tolist() == [1, 3, 4]


def test_categorical_unnormalised_weights_and_boundary_u():
    w = torch.tensor([[0.0, 3.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    assert categorical(w, torch.tensor([0.74], dtype=torch.float64)).tolist() == [1]
    assert categorical(w, torch.tensor([0.76], dtype=torch.float64)).tolist() == [3]
    assert categorical(w, torch.tensor([1 - 2**-53], dtype=torch.float64)).tolist() == [3]


def test_categorical_u_near_one_lands_on_the_last_positive_token():
    # sum rounds below 1; u*total can still reach total for u close to 1
    w = torch.tensor([[0.1] * 10 + [0.0, 0.0]], dtype=torch.float64)
    assert math.fsum([0.1] * 10) == 1.0 and float(torch.cumsum(w, -1)[0, -1]) != 1.0
    assert categorical(w, torch.tensor([1 - 2**-53], dtype=torch.float64)).tolist() == [9]


def test_categorical_errors():
    with pytest.raises(NumericsError, match="row 1 is not a distribution"):
        categorical(
            torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64),
            torch.full((2,), 0.5, dtype=torch.float64),
        )
    with pytest.raises(NumericsError, match="row 0 is not a distribution"):
        categorical(
            torch.tensor([[1.0, -0.5]], dtype=torch.float64),
            torch.full((1,), 0.5, dtype=torch.float64),
        )
    with pytest.raises(InputError, match=r"uniform 0 must be strictly inside \(0, 1\), got 1.0"):
        categorical(
            torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.ones(1, dtype=torch.float64)
        )


def test_argmax_tokens_lowest_id():
    p = torch.tensor([[[0.2, 0.4, 0.4]], [[0.5, 0.1, 0.4]]], dtype=torch.float64)
    assert argmax_tokens(p).tolist() == [[1], [0]]
