"""The fast engine (engines/fast.py, models/static.py) against the built-in engine, its reference:
the same tokens and telemetry in float32 on CPU (static cache + fast pipeline), batch invariance,
the static cache's contract (holes, one pool per batch size, a full cache is an error), and on
CUDA the CUDA-graph replay against eager (skipped cleanly without CUDA)."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec, plain_decode, speculative_decode
from spectest.engines.fast import as_fast, plain_decode_fast, speculative_decode_fast
from spectest.errors import ModelError
from spectest.models.derive import first_layers
from spectest.models.hf import HFModel, from_preset
from spectest.models.static import WINDOW_STEP, StaticCache, StaticHFModel
from spectest.models.toy import ToyLM
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams

RUN_KEY = 99
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, top_k=8, top_p=0.9, min_p=0.05),
]
ROWS = [RowSpec(f"cfg{i}", seed, p) for seed in range(3) for i, p in enumerate(PARAMS)]
KW = dict(run_key=RUN_KEY, prompt_id="p")


@pytest.fixture(scope="module")
def hf_pair() -> tuple[HFModel, HFModel]:
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, num_hidden_layers=3)
    return target, first_layers(target, 1)


def test_plain_equals_builtin(hf_pair) -> None:
    target, draft = hf_pair
    req = DecodeRequest([1, 2, 3], ROWS, num_positions=7, batch_size=6, whitebox=True, **KW)
    drafter = DrafterSpec(onehot=True, k=3)
    want = plain_decode(target, req, draft=draft, drafter=drafter)
    fast_d = as_fast(draft, static=True)
    got = plain_decode_fast(as_fast(target, static=True), req, draft=fast_d, drafter=drafter)
    assert np.array_equal(got.tokens, want.tokens)
    assert got.whitebox is not None and want.whitebox is not None
    # NOTE the static cache attends over all its slots (masked), so float32 logits differ from
    # the dynamic cache's in the last bits: the columns agree to float32 rounding, tokens exactly
    pd.testing.assert_frame_equal(got.whitebox, want.whitebox, rtol=1e-5)


@pytest.mark.parametrize("onehot", [True, False], ids=["onehot", "sampled"])
@pytest.mark.parametrize("variant", ["exact", "always_accept", "eps_biased:0.5"])
def test_speculative_equals_builtin(hf_pair, onehot, variant) -> None:
    target, draft = hf_pair
    v, drafter = get_variant(variant), DrafterSpec(onehot=onehot, k=3)
    want = speculative_decode(
        target,
        draft,
        DecodeRequest([1, 2, 3], ROWS, num_positions=9, whitebox=True, **KW),
        drafter=drafter,
        variant=v,
    )
    fast_t, fast_d = as_fast(target, static=True), as_fast(draft, static=True)
    got = speculative_decode_fast(
        fast_t,
        fast_d,
        DecodeRequest([1, 2, 3], ROWS, num_positions=9, whitebox=True, **KW),
        drafter=drafter,
        variant=v,
    )
    assert np.array_equal(got.tokens, want.tokens)
    assert got.whitebox is not None and want.whitebox is not None
    # NOTE the static cache attends over all its slots (masked), so float32 logits differ from
    # the dynamic cache's in the last bits: the columns agree to float32 rounding, tokens exactly
    pd.testing.assert_frame_equal(got.whitebox, want.whitebox, rtol=1e-5)
    assert got.rounds is not None and want.rounds is not None
    assert got.rounds.equals(want.rounds)
    assert float(got.rounds["accepted"].mean()) > 0  # the pair accepts: holes are exercised


def test_attention_window_crossings_equal_builtin(hf_pair) -> None:
    """Rows long enough that forwards attend to 32, 64 and 96 slots (``WINDOW_STEP``): tokens
    still equal the built-in engine's (a window too short would drop a valid slot)."""
    target, draft = hf_pair
    v, drafter = get_variant("exact"), DrafterSpec(onehot=False, k=3)
    rows, prompt = ROWS[:5], list(range(1, 31))  # 30 prompt slots + 40 positions + holes
    want = speculative_decode(
        target,
        draft,
        DecodeRequest(prompt, rows, num_positions=40, **KW),
        drafter=drafter,
        variant=v,
    )
    fast_t = StaticHFModel(target, max_slots=8, cuda_graphs=False)  # reserve() grows it
    got = speculative_decode_fast(
        fast_t,
        as_fast(draft, static=True),
        DecodeRequest(prompt, rows, num_positions=40, **KW),
        drafter=drafter,
        variant=v,
    )
    assert fast_t.max_slots > 2 * WINDOW_STEP
    assert np.array_equal(got.tokens, want.tokens)
    plain = plain_decode(target, DecodeRequest(prompt, rows, num_positions=40, **KW))
    got_plain = plain_decode_fast(fast_t, DecodeRequest(prompt, rows, num_positions=40, **KW))
    assert np.array_equal(got_plain.tokens, plain.tokens)


def test_toy_model_runs_unwrapped_and_equal() -> None:
    toy = ToyLM(12, 2, 2.0, seed=1)
    assert as_fast(toy) is toy
    tiny = from_preset("qwen3-tiny")
    assert as_fast(tiny) is tiny  # on CPU the static cache is opt-in
    assert isinstance(as_fast(tiny, static=True), StaticHFModel)
    drafter = DrafterSpec(onehot=False, k=2)
    v = get_variant("exact")
    draft = toy.perturbed(0.5, seed=2)
    want = speculative_decode(
        toy, draft, DecodeRequest([1], ROWS, num_positions=6, **KW), drafter=drafter, variant=v
    )
    got = speculative_decode_fast(
        toy, draft, DecodeRequest([1], ROWS, num_positions=6, **KW), drafter=drafter, variant=v
    )
    assert np.array_equal(got.tokens, want.tokens)


def test_batch_invariance(hf_pair) -> None:
    """A row's tokens alone == inside a shuffled batch of another size (one pool per size)."""
    target, draft = as_fast(hf_pair[0], static=True), as_fast(hf_pair[1], static=True)
    drafter, v = DrafterSpec(onehot=True, k=3), get_variant("exact")
    shuffled = ROWS[:]
    random.Random(0).shuffle(shuffled)
    full = speculative_decode_fast(
        target,
        draft,
        DecodeRequest([4, 5], shuffled, num_positions=8, **KW),
        drafter=drafter,
        variant=v,
    )
    for i in (0, 7):
        alone = speculative_decode_fast(
            target,
            draft,
            DecodeRequest([4, 5], [shuffled[i]], num_positions=8, **KW),
            drafter=drafter,
            variant=v,
        )
        assert np.array_equal(alone.tokens[0], full.tokens[i])


def test_static_cache_contract(hf_pair) -> None:
    target = hf_pair[0]
    fast = StaticHFModel(target, max_slots=8, cuda_graphs=False)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    cache, _ = fast.prefill_shared(ids[0, :2], 2)
    got = fast.forward(cache, ids[:, 2:].expand(2, -1))  # [2, 3, V]
    assert torch.allclose(got, target.logits_full(ids)[:, 2:].expand(2, -1, -1), atol=1e-5)
    hole = torch.zeros((2, 5), dtype=torch.bool)
    hole[:, 3:] = True  # drop the last two slots (a rejected draft): the next sees 3, 1, 4
    cache.invalidate(hole)
    nxt = fast.forward(cache, torch.tensor([[9], [9]]))[:, -1]  # [2, V]
    want = target.logits_full(torch.tensor([[3, 1, 4, 9]]))[:, -1]
    assert torch.allclose(nxt, want.expand(2, -1), atol=1e-5)
    with pytest.raises(ModelError, match="static cache full"):
        fast.forward(cache, torch.tensor([[1, 2, 3], [1, 2, 3]]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_equal_eager_on_cuda() -> None:
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, device="cuda", dtype="float32")
    draft = first_layers(target, 1)
    drafter, v = DrafterSpec(onehot=True, k=3), get_variant("exact")
    outs = []
    for graphs in (False, True):
        t = StaticHFModel(target, cuda_graphs=graphs)
        d = StaticHFModel(draft, cuda_graphs=graphs)
        outs.append(
            speculative_decode_fast(
                t,
                d,
                DecodeRequest([1, 2, 3], ROWS, num_positions=70, **KW),
                drafter=drafter,
                variant=v,
            )  # 70 positions: graphs of three attention windows (WINDOW_STEP 32)
        )
        assert t.graph_error is None, t.graph_error
        if graphs:
            # one memory pool for every capture; one logits buffer per (B, S) outside it
            gs = list(t._graphs.items())
            assert len({k[2] for k, _ in gs}) >= 3  # three attention windows
            assert len({g.graph.pool() for _, g in gs}) == 1
            for (B, S, _W), g in gs:
                assert g.out.data_ptr() == t._out_buffer(B, S, g.out.dtype).data_ptr()
            assert t.packed_gqa  # qwen3-tiny: 4 query heads on 2 KV heads
    assert np.array_equal(outs[0].tokens, outs[1].tokens)


def test_prefill_graphs_kept_for_the_most_recent_lengths(hf_pair, monkeypatch) -> None:
    """The prefill graphs' bookkeeping (the graphs themselves need CUDA: the test above): a
    prefill of at most ``PREFILL_GRAPH_TOKENS`` tokens asks for a graph; past
    ``PREFILL_GRAPH_LENGTHS`` lengths the least recently used one's graphs and logits buffer go,
    other batch sizes' stay; a model without graphs (CPU) never asks."""
    from spectest.models import static

    monkeypatch.setattr(static, "PREFILL_GRAPH_LENGTHS", 2)
    model = StaticHFModel(hf_pair[0])
    assert not model.cuda_graphs and not model._prefill_graph(3)
    model.cuda_graphs = True  # the bookkeeping alone: no forward runs here
    for L in (3, 7, 3):
        assert model._prefill_graph(L)
        model._graphs[(1, L, 32)] = model._graphs[(2, L, 32)] = object()  # type: ignore[assignment]
        model._outs[(1, L)] = model._outs[(2, L)] = torch.empty(0)
    assert model._prefill_graph(40) and not model._prefill_graph(static.PREFILL_GRAPH_TOKENS + 1)
    assert list(model._prefill_lengths) == [3, 40]  # 7 was the least recently used
    assert set(model._graphs) == {(1, 3, 32), (2, 3, 32), (2, 7, 32)}
    assert set(model._outs) == {(1, 3), (2, 3), (2, 7)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_graphs_equal_eager_prefills_on_cuda(dtype, monkeypatch) -> None:
    """``prefill_shared`` through a CUDA graph (captured, then replayed) gives the eager prefill's
    logits, keys, values and validity bit for bit, and so the decode steps after it (bfloat16
    under a logit scale: native ``ScaledLogits``); at most ``PREFILL_GRAPH_LENGTHS`` lengths keep
    their graphs and logits buffer; a prompt over ``PREFILL_GRAPH_TOKENS`` tokens stays eager."""
    from spectest.models import static
    from spectest.sampling.scaled import parts

    monkeypatch.setattr(static, "PREFILL_GRAPH_LENGTHS", 2)
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, device="cuda", dtype=dtype)
    eager, graphed = StaticHFModel(target, cuda_graphs=False), StaticHFModel(target)
    g = torch.Generator().manual_seed(3)
    for L in (3, 7, 3, 40, static.PREFILL_GRAPH_TOKENS + 1):
        prompt = torch.randint(0, target.vocab_size, (L,), generator=g).cuda()
        (ce, le), (cg, lg) = eager.prefill_shared(prompt, 4), graphed.prefill_shared(prompt, 4)
        assert torch.equal(parts(le)[0], parts(lg)[0]) and torch.equal(ce.valid, cg.valid)
        for a, b in zip(ce.kv.keys + ce.kv.values, cg.kv.keys + cg.kv.values, strict=True):
            assert torch.equal(a[:, :, :L], b[:, :, :L])
        tok = torch.randint(0, target.vocab_size, (4, 1), generator=g).cuda()
        for _ in range(3):
            step_e, step_g = eager.forward(ce, tok), graphed.forward(cg, tok)
            assert torch.equal(parts(step_e)[0], parts(step_g)[0])
            tok = parts(step_g)[0][:, -1].float().argmax(-1, keepdim=True)
        prefills = {k[1] for k in graphed._graphs if k[0] == 1}
        assert (L in prefills) == (L <= static.PREFILL_GRAPH_TOKENS)
    assert graphed.graph_error is None
    assert prefills == {3, 40} and {k for k in graphed._outs if k[0] == 1} == {(1, 3), (1, 40)}


def test_shared_slots_are_the_prompt_a_prefill_copied_to_every_row(hf_pair) -> None:
    """The pool's ``shared`` count (the attention kernel reads those slots from row 0): a fresh
    cache shares nothing, ``prefill_shared`` (and the replay model's restored prefill) shares
    the prompt's L slots, and every row then holds row 0's keys and values there; the next
    cache of that batch size shares nothing again."""
    from spectest.numerics.replay import ReplayStaticModel

    for model in (StaticHFModel(hf_pair[0]), ReplayStaticModel(hf_pair[0])):
        assert int(model.new_cache(3).kv.shared) == 0
        prompt = torch.tensor([5, 1, 4, 1, 5, 9, 2])
        cache, _ = model.prefill_shared(prompt, 3)
        assert isinstance(cache, StaticCache) and int(cache.kv.shared) == 7
        for x in cache.kv.keys + cache.kv.values:
            assert torch.equal(x[:, :, :7], x[:1, :, :7].expand(3, -1, -1, -1))
        model.forward(cache, torch.tensor([[3], [1], [4]]))
        assert int(cache.kv.shared) == 7  # a decode writes past the prompt only
        assert int(model.new_cache(3).kv.shared) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_shared_prompt_reads_equal_each_rows_own_on_cuda(monkeypatch) -> None:
    """bfloat16 on CUDA, the attention kernel on: a model reading the prompt's slots from row 0
    (``SHARED_READS``) gives the logits of one reading each row's own, bit for bit, through a
    37-token prompt (a tile and a part), decode steps, a verify of 5 with rejected slots and a
    second prompt in the same pool, eager and as CUDA graphs."""
    from spectest.models import static

    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, device="cuda", dtype="bfloat16")
    models = []
    for on, graphs in ((True, True), (False, True), (True, False)):
        monkeypatch.setattr(static, "SHARED_READS", on)
        models.append(StaticHFModel(target, cuda_graphs=graphs))
    assert all(m.decode_kernel for m in models) and models[0].shared_reads
    assert not models[1].shared_reads
    g = torch.Generator().manual_seed(4)
    outs: list[list[torch.Tensor]] = [[] for _ in models]
    for L in (37, 20):
        prompt = torch.randint(0, target.vocab_size, (L,), generator=g).cuda()
        steps = [
            torch.randint(0, target.vocab_size, (4, s), generator=g).cuda() for s in (1, 1, 5, 1)
        ]
        for model, out in zip(models, outs, strict=True):
            cache, first = model.prefill_shared(prompt, 4)
            assert int(cache.kv.shared) == L
            out.append(first.float())
            for ids in steps:
                out.append(model.forward(cache, ids).float())
                if ids.shape[1] == 5:  # rows 1 and 3 rejected the last 3 of the 5
                    hole = torch.zeros_like(cache.valid)
                    hole[1::2, -3:] = True
                    cache.invalidate(hole)
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other, strict=True))
    assert models[0].graph_error is None and len(models[0]._graphs) > 0


@pytest.mark.parametrize("whitebox", [False, True], ids=["tokens", "whitebox"])
@pytest.mark.parametrize("onehot", [True, False], ids=["onehot", "sampled"])
def test_shortlist_laws_equal_builtin(hf_pair, onehot, whitebox) -> None:
    """The fast pipeline's draws and rounds on shortlist laws (no dense [B, K+1, V] rows; width
    32 < V = 512 so that they run here) give the built-in engine's tokens and rounds, plain and
    speculative, float32 on CPU, and with white-box recording its columns (rtol 1e-5, as the
    other equality tests); the shortlist path is really taken (counted)."""
    import dataclasses
    from functools import partial

    from spectest.sampling.pipeline import FAST
    from spectest.sampling.shortlist import logits_to_probs_fast, shortlist_probs

    target, draft = hf_pair
    taken: list[bool] = []

    def shortlist(logits, params):  # type: ignore[no-untyped-def]
        law = shortlist_probs(logits, params, width=32)
        taken.append(law is not None)
        return law

    narrow = dataclasses.replace(
        FAST, probs=partial(logits_to_probs_fast, width=32), shortlist=shortlist
    )
    rows = [r for r in ROWS if r.params.temperature > 0 and r.params.temperature != 1.0]
    rows += [RowSpec("k8", s, PARAMS[4]) for s in range(3)]
    v, drafter = get_variant("exact"), DrafterSpec(onehot=onehot, k=3)
    fast_t, fast_d = as_fast(target, static=True), as_fast(draft, static=True)
    want = speculative_decode(
        target,
        draft,
        DecodeRequest([1, 2, 3], rows, num_positions=12, whitebox=whitebox, **KW),
        drafter=drafter,
        variant=v,
    )
    got = speculative_decode(
        fast_t,
        fast_d,
        DecodeRequest([1, 2, 3], rows, num_positions=12, whitebox=whitebox, **KW),
        drafter=drafter,
        variant=v,
        pipeline=narrow,
    )
    assert np.array_equal(got.tokens, want.tokens)
    assert got.rounds is not None and want.rounds is not None
    assert got.rounds.equals(want.rounds)
    if whitebox:
        assert got.whitebox is not None and want.whitebox is not None
        pd.testing.assert_frame_equal(got.whitebox, want.whitebox, rtol=1e-5)
    assert sum(taken) >= len(taken) // 2 > 0  # most calls decided on the shortlist
    taken.clear()
    req = DecodeRequest([1, 2, 3], rows, num_positions=12, whitebox=whitebox, **KW)
    wb = dict(drafter=drafter) if whitebox else {}
    plain = plain_decode(target, req, **{**wb, "draft": draft} if wb else {})
    got_plain = plain_decode(fast_t, req, pipeline=narrow, **{**wb, "draft": fast_d} if wb else {})
    assert np.array_equal(got_plain.tokens, plain.tokens)
    if whitebox:
        assert got_plain.whitebox is not None and plain.whitebox is not None
        pd.testing.assert_frame_equal(got_plain.whitebox, plain.whitebox, rtol=1e-5)
    assert sum(taken) >= len(taken) // 2 > 0


@pytest.mark.parametrize(
    ("onehot", "q_mode", "variant"),
    [
        (True, "processed", "exact"),
        (False, "processed", "exact"),
        (False, "temperature", "exact"),
        (False, "processed", "residual_from_p"),
        (True, "processed", "residual_from_p"),
        (True, "processed", "onehot_softmax_q"),
    ],
    ids=["onehot", "processed", "temperature-q", "mutant", "onehot-mutant", "lying-q"],
)
def test_whitebox_on_shortlist_equals_dense(hf_pair, monkeypatch, onehot, q_mode, variant) -> None:
    """The white-box columns computed on shortlist laws (``whitebox_columns_shortlist``, width
    32 < V = 512) equal the dense ``whitebox_columns`` of the same decode to float64 summation
    order (rtol 1e-12, ``wb_in_a`` exact): the same fast pipeline with ``shortlist`` off draws
    the same tokens (``ShortlistLaw.draw`` NOTE, CPU) from the bit-equal dense laws and records
    densely. One-hot q (W = 1), processed q on the shortlist, a temperature-only q (dense q
    beside a shortlist p), mutants' dense rounds (p put on the shortlist for the white-box only;
    a lying q: the teacher q from the draft logits), speculative and plain; the shortlist path is
    really taken (counted)."""
    import dataclasses
    from functools import partial

    from spectest.engines import teacher
    from spectest.sampling.pipeline import FAST
    from spectest.sampling.shortlist import logits_to_probs_fast, shortlist_probs

    target, draft = hf_pair
    calls: list[int] = []
    real = teacher.whitebox_columns_shortlist

    def counted(p, q, tokens, **kw):  # type: ignore[no-untyped-def]
        calls.append(int(tokens.shape[0]))
        return real(p, q, tokens, **kw)

    monkeypatch.setattr(teacher, "whitebox_columns_shortlist", counted)
    narrow = dataclasses.replace(
        FAST,
        probs=partial(logits_to_probs_fast, width=32),
        shortlist=partial(shortlist_probs, width=32),
    )
    dense = dataclasses.replace(narrow, shortlist=None)
    rows = [r for r in ROWS if r.params.temperature > 0 and r.params.temperature != 1.0]
    rows += [RowSpec("k8", s, PARAMS[4]) for s in range(3)]
    drafter = DrafterSpec(onehot=onehot, k=3, q_mode=q_mode)
    req = DecodeRequest([1, 2, 3], rows, num_positions=12, whitebox=True, **KW)
    v = get_variant(variant)
    got = speculative_decode(target, draft, req, drafter=drafter, variant=v, pipeline=narrow)
    assert calls, "the shortlist white-box path was not taken"
    calls.clear()
    want = speculative_decode(target, draft, req, drafter=drafter, variant=v, pipeline=dense)
    assert not calls
    assert np.array_equal(got.tokens, want.tokens)
    assert got.whitebox is not None and want.whitebox is not None
    pd.testing.assert_frame_equal(got.whitebox, want.whitebox, rtol=1e-12)
    got_p = plain_decode(target, req, draft=draft, drafter=drafter, pipeline=narrow)
    assert calls
    want_p = plain_decode(target, req, draft=draft, drafter=drafter, pipeline=dense)
    assert np.array_equal(got_p.tokens, want_p.tokens)
    assert got_p.whitebox is not None and want_p.whitebox is not None
    pd.testing.assert_frame_equal(got_p.whitebox, want_p.whitebox, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_gqa_equals_hf_attention_on_cuda() -> None:
    """float32 on CUDA, CUDA graphs on: the static model with packed GQA attention gives the
    tokens of the same model on transformers' own sdpa path. The two attention calls may round
    differently in the last float32 bits, so a token could flip when a uniform lies within ~1e-6
    of a CDF step: ~1e-3 chance over this test's ~1 000 draws (fixed keys: it passes or fails
    the same way every time on one platform)."""
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, device="cuda", dtype="float32")
    draft = first_layers(target, 1)
    drafter, v = DrafterSpec(onehot=False, k=3), get_variant("exact")
    outs = []
    for packed in (True, False):
        t = StaticHFModel(target, packed_gqa=packed)
        d = StaticHFModel(draft, packed_gqa=packed)
        assert t.packed_gqa == packed
        outs.append(
            speculative_decode_fast(
                t,
                d,
                DecodeRequest([1, 2, 3], ROWS, num_positions=40, **KW),
                drafter=drafter,
                variant=v,
            )
        )
        assert t.graph_error is None and len(t._graphs) > 0, t.graph_error
    assert np.array_equal(outs[0].tokens, outs[1].tokens)
    assert outs[0].rounds is not None and outs[0].rounds.equals(outs[1].rounds)
