"""The decode loops' host work (issue 32): each chunk's uniforms drawn in one table
(``seeding.uniform_table``) instead of one Philox call per step, and the speculative loop's
"any row still active?" sync skipped for the rounds in which every row must be active. Tokens,
rounds and white-box columns bit-equal to the per-step path (``seeding.TABLE_ELEMENTS = 0``) on
the built-in and fast pipelines; the Philox calls and the loop's syncs counted; the one-read
``argmax_tokens`` and the one-hot ``prob_of`` equal to the formulas they replace. Exact
comparisons: no false failures."""

from __future__ import annotations

import math
import traceback
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spectest import seeding
from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec, plain_decode, speculative_decode
from spectest.engines.fast import as_fast, plain_decode_fast, speculative_decode_fast
from spectest.models.derive import first_layers
from spectest.models.hf import HFModel, from_preset
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams

PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0),
]
ROWS = [RowSpec(f"c{i}", s, p) for s in range(3) for i, p in enumerate(PARAMS)]


@pytest.fixture(scope="module")
def pair() -> tuple[HFModel, HFModel]:
    target = from_preset("qwen3-tiny", seed=5, logit_scale=4.0, num_hidden_layers=2)
    return target, first_layers(target, 1)


def _req(T: int, whitebox: bool = True) -> DecodeRequest:
    return DecodeRequest(
        [1, 2, 3], ROWS, num_positions=T, batch_size=8, whitebox=whitebox, run_key=3, prompt_id="p"
    )


def _runs(pair: tuple[HFModel, HFModel], fast: bool, onehot: bool, T: int) -> list[Any]:
    target, draft = pair
    if fast:
        target, draft = as_fast(target, static=True), as_fast(draft, static=True)
    drafter = DrafterSpec(onehot=onehot, k=3)
    plain = plain_decode_fast if fast else plain_decode
    spec = speculative_decode_fast if fast else speculative_decode
    return [
        plain(target, _req(T), draft=draft, drafter=drafter),
        spec(target, draft, _req(T), drafter=drafter, variant=get_variant("exact")),
    ]


@pytest.mark.parametrize("fast", [False, True], ids=["builtin", "fast"])
@pytest.mark.parametrize("onehot", [True, False], ids=["onehot", "sampled"])
def test_uniform_tables_give_the_per_step_tokens(pair, monkeypatch, fast, onehot) -> None:
    """One table per chunk, tables of 3 steps (plain: blocks), and no table: the same tokens,
    rounds and white-box columns, bit for bit."""
    outs = []
    for cap in (seeding.TABLE_ELEMENTS, 3 * 8, 0):
        monkeypatch.setattr(seeding, "TABLE_ELEMENTS", cap)
        outs.append(_runs(pair, fast, onehot, T=10))
    for got in outs[1:]:
        for a, b in zip(got, outs[0], strict=True):
            assert (a.tokens == b.tokens).all()
            assert (a.rounds is None) == (b.rounds is None)
            assert a.rounds is None or a.rounds.equals(b.rounds)
            assert a.whitebox.equals(b.whitebox)


def test_one_philox_call_per_chunk(pair, monkeypatch) -> None:
    """Plain and speculative decode draw a chunk's uniforms in one Philox call (per-step calls
    before: one per position / round)."""
    calls = []
    inner = seeding.philox4x32

    def counted(*a: Any) -> Any:
        calls.append(1)
        return inner(*a)

    monkeypatch.setattr(seeding, "philox4x32", counted)
    target, draft = pair
    chunks = math.ceil(len(ROWS) / 8)
    plain_decode(target, _req(12, whitebox=False))
    assert len(calls) == chunks
    calls.clear()
    drafter = DrafterSpec(onehot=False, k=3)
    out = speculative_decode(
        target, draft, _req(12, whitebox=False), drafter=drafter, variant=get_variant("exact")
    )
    assert out.rounds is not None and int(out.rounds["round"].max()) >= 3
    assert len(calls) == chunks


class _LoopSyncs(TorchDispatchMode):
    """Counts host syncs (``item``/``bool``) made by ``builtin._spec_chunk``'s loop condition
    (``_more_rounds``)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            inner = [f for f in traceback.extract_stack() if "/spectest/" in f.filename][-1]
            self.n += inner.name == "_more_rounds"
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("T", [7, 12])
def test_speculative_loop_skips_syncs_while_every_row_is_active(pair, T) -> None:
    """The loop's condition syncs only from round ceil(T / (K + 1)) on (no row can finish
    earlier): ``rounds + 1 - ceil(T / (K + 1))`` syncs per chunk instead of ``rounds + 1``."""
    target, draft = pair
    K = 3
    req = DecodeRequest([1, 2], ROWS[:8], num_positions=T, run_key=3, prompt_id="p")
    with _LoopSyncs() as count:
        out = speculative_decode(
            target, draft, req, drafter=DrafterSpec(onehot=True, k=K), variant=get_variant("exact")
        )
    assert out.rounds is not None
    rounds = int(out.rounds["round"].max()) + 1
    assert rounds >= math.ceil(T / (K + 1))
    assert count.n == rounds + 1 - math.ceil(T / (K + 1))


def test_onehot_prob_of_equals_the_dense_law() -> None:
    """A one-hot law's ``prob_of`` (no search: ``probs_at`` at width 1) equals its dense law's
    gather, at hits and misses, with leading dimensions."""
    from spectest.sampling.laws import onehot_law

    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 7, (5, 3), generator=g)  # [B, J]
    law = onehot_law(x, 7)  # [B, J, 1]
    tok = torch.randint(0, 7, (5, 3, 4), generator=g)  # [B, J, 4]
    tok[:, :, 0] = x  # a hit in every row
    got = law.prob_of(tok)
    assert torch.equal(got, law.dense().gather(-1, tok))
    assert got.dtype == torch.float64 and got.shape == (5, 3, 4) and bool((got[..., 0] == 1).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_uniform_tables_give_the_per_step_tokens_on_cuda(monkeypatch) -> None:
    """On CUDA (static cache, CUDA graphs, the fast pipeline): one table per chunk and no table
    give the same tokens, rounds and white-box columns, bit for bit."""
    target = from_preset("qwen3-tiny", seed=5, logit_scale=4.0, device="cuda", dtype="float32")
    pair = (target, first_layers(target, 1))
    outs = []
    for cap in (seeding.TABLE_ELEMENTS, 0):
        monkeypatch.setattr(seeding, "TABLE_ELEMENTS", cap)
        outs.append(_runs(pair, True, False, T=40))
    for a, b in zip(outs[1], outs[0], strict=True):
        assert (a.tokens == b.tokens).all()
        assert a.rounds is None or a.rounds.equals(b.rounds)
        assert a.whitebox.equals(b.whitebox)


def _argmax_by_formula(x: torch.Tensor) -> torch.Tensor:
    """``argmax_tokens``' former rule: the lowest id among the maxima (V for a row with NaN)."""
    V = int(x.shape[-1])
    ar = torch.arange(V, device=x.device)
    return torch.where(x == x.amax(-1, keepdim=True), ar, V).amin(-1)


def _argmax_cases(device: str) -> list[torch.Tensor]:
    """Rows with many ties (small integers), ±inf, NaN, all -inf, in every dtype the loops use."""
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 3, (64, 3, 2000), generator=g).double()  # ties at the max in most rows
    x[0, 0, 7] = float("inf")
    x[1, 1, :] = float("-inf")
    x[2, 2, 11] = float("nan")
    x[3, 0, 1999] = 5.0  # the last id
    return [x.to(device=device, dtype=d) for d in (torch.float64, torch.float32, torch.bfloat16)]


def test_argmax_tokens_is_the_lowest_maximal_id() -> None:
    from spectest.sampling.draw import argmax_tokens

    for x in _argmax_cases("cpu"):
        got = argmax_tokens(x)
        assert torch.equal(got, _argmax_by_formula(x))
        assert got[2, 2] == 2000 and got[0, 0] == 7 and got[1, 1] == 0 and got[3, 0] == 1999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_argmax_tokens_is_the_lowest_maximal_id_on_cuda() -> None:
    from spectest.sampling.draw import argmax_tokens

    for x in _argmax_cases("cuda"):
        assert torch.equal(argmax_tokens(x).cpu(), _argmax_by_formula(x.cpu()))
