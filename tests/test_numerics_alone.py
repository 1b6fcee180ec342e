"""Issue 32: the batch floor's rows decoded alone several at once (``spectest.numerics.alone``).

Exact checks: every row's logits from the interleaved workers (streams) or the graph branches
(``FloorBranches``) equal the one-at-a-time decode bit for bit, and the drift table's floor
column is the same either way — on CPU (the workers' steps interleaved, no streams; the
branches' forwards eager) and, ``-m gpu`` (skipped without CUDA), on CUDA in bfloat16 with CUDA
graphs, one stream per worker or one graph per step, where the rows really run at once."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pandas as pd
import pytest
import torch

from spectest import schema
from spectest.models.hf import HFModel, from_preset
from spectest.models.streams import POOL_STREAMS, capture_stream
from spectest.numerics import decode
from spectest.numerics.alone import FloorBranches, alone_logits, concurrent
from spectest.numerics.decode import _decode_beside_alone, beside_batch, decode_logits
from spectest.numerics.replay import ReplayStaticModel, replay_model
from spectest.numerics.table import drift_table
from spectest.sampling.params import SamplingParams

PROMPT = [1, 2, 3, 4, 5]
T = 9
PARAMS = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, top_k=50)]


def _replay(target: HFModel) -> ReplayStaticModel:
    model = replay_model(target, fast=True, static=True)
    assert isinstance(model, ReplayStaticModel) and concurrent(model)
    return model


def _one_at_a_time(model: ReplayStaticModel, rows: torch.Tensor) -> list[torch.Tensor]:
    prompt = torch.tensor(PROMPT, device=model.device)
    keep = torch.zeros(1, dtype=torch.int64, device=model.device)
    return [decode_logits(model, prompt, rows[r : r + 1], keep)[0] for r in range(len(rows))]


def _at_once(model: ReplayStaticModel, rows: torch.Tensor, streams: int) -> list[torch.Tensor]:
    prompt = torch.tensor(PROMPT, device=model.device)
    parts = [rows[r : r + 1] for r in range(len(rows))]
    return list(alone_logits(model, prompt, PROMPT, parts, streams))


def _rows(vocab: int, n: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, vocab, (n, T), generator=g).to(device)


def _check_rows(target: HFModel, device: str, streams: int) -> ReplayStaticModel:
    """7 rows, ``streams`` at a time (a short last group): equal to one at a time, bit for bit,
    and the workers share the model's one kept prefill."""
    model = _replay(target)
    rows = _rows(model.vocab_size, 7, device)
    want = _one_at_a_time(model, rows)
    got = _at_once(model, rows, streams)
    assert len(got) == len(want) == 7
    for g, w in zip(got, want, strict=True):
        assert g.shape == (T, model.vocab_size) and torch.equal(g, w)
    workers = model.workers(streams)
    assert len(workers) == streams and workers[0] is model
    assert all(w._prefills is model._prefills for w in workers)
    assert list(model._prefills) == [tuple(PROMPT)]
    return model


def _samples(vocab: int, per_config: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A matched arm's samples and rounds (K + 1 tokens per round), tokens from a fixed seed."""
    g = np.random.default_rng(11)
    srows, rrows = [], []
    for c in range(len(PARAMS)):
        for s in range(per_config):
            for t, tok in enumerate(g.integers(0, vocab, T)):
                srows.append({schema.ARM: "matched", schema.PROMPT_ID: "p0",
                              schema.CONFIG_ID: f"c{c}", schema.SEED: s, schema.POSITION: t,
                              schema.TOKEN_ID: int(tok)})  # fmt: skip
            for rd in range(-(-T // 3)):
                rrows.append({schema.ARM: "matched", schema.PROMPT_ID: "p0",
                              schema.CONFIG_ID: f"c{c}", schema.SEED: s, "round": rd,
                              "accepted": 2})  # fmt: skip
    return pd.DataFrame(srows), pd.DataFrame(rrows)


def _check_branches(target: HFModel, device: str) -> FloorBranches:
    """7 rows, then 3 (another graph), then 7 after the pools were replaced: as branches, equal
    to one at a time, bit for bit."""
    model = _replay(target)
    prompt = torch.tensor(PROMPT, device=model.device)
    branches = FloorBranches(model)
    for n, grow in ((7, False), (3, False), (7, True)):
        if grow:  # a longer prompt's reserve: new pools, so the graphs are captured again
            model.reserve(model.max_slots + 32)
            model.workers(7)
        rows = _rows(model.vocab_size, n, device)
        want = _one_at_a_time(model, rows)
        got = branches(prompt, PROMPT, rows)
        assert len(got) == n and branches.graph_error is None
        for g, w in zip(got, want, strict=True):
            assert g.shape == (T, model.vocab_size) and torch.equal(g, w)
    return branches


def _check_beside(target: HFModel, device: str) -> tuple[ReplayStaticModel, FloorBranches]:
    """A batch of 12 rows decoded (5 measured) with 3 of its rows decoded alone as branches,
    their steps interleaved (on CUDA the branches on a stream of their own): the batch's logits
    and each row's alone equal one after the other, bit for bit, in the capturing pass and in
    the replaying one."""
    model = _replay(target)
    toks = _rows(model.vocab_size, 12, device)
    prompt = torch.tensor(PROMPT, device=model.device)
    keep = torch.tensor([0, 2, 5, 7, 11], device=model.device)
    alone = [2, 5, 11]
    want = decode_logits(model, prompt, toks, keep)
    want_alone = _one_at_a_time(model, toks[alone])
    branches = FloorBranches(model)
    assert beside_batch(model, branches, len(PROMPT) + T)
    assert not beside_batch(model, None, len(PROMPT) + T)
    assert not beside_batch(model, branches, model.max_slots + 1)  # the reserve would grow
    for _ in range(2):
        dec, got = _decode_beside_alone(model, prompt, PROMPT, toks, keep, alone, branches)
        assert torch.equal(dec, want) and len(got) == len(alone)
        for g, w in zip(got, want_alone, strict=True):
            assert torch.equal(g, w)
    assert branches.graph_error is None
    assert (branches.stream is not None) == (device == "cuda")
    return model, branches


def _check_table(target: HFModel, streams: int, branches: bool = False) -> None:
    """The drift table with ``streams`` floor rows at once, or the rows as ``branches``, equals
    the one-at-a-time table."""
    samples, rounds = _samples(target.vocab_size, 6)
    cfg = [(f"c{i}", p) for i, p in enumerate(PARAMS)]
    kw = dict(arm="matched", K=2, batch_size=12, positions=T, rows_per_cell=4,
              floor_rows_per_cell=3, fast=True)  # fmt: skip
    one = _replay(target)
    slow = drift_table(one, samples, rounds, {"p0": PROMPT}, cfg, streams=1, branches=False, **kw)
    assert one.workers_made == 0  # one at a time: no workers
    many = _replay(target)
    fast = drift_table(
        many, samples, rounds, {"p0": PROMPT}, cfg, streams=streams, branches=branches, **kw
    )
    # ... at once: the workers ran the floor rows (a batch of 12 rows holds 3 + 3 floor rows)
    assert many.workers_made == (6 if branches else streams)
    assert fast["floor_tv"].notna().sum() == 2 * 3 * T
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)


@pytest.fixture(scope="module")
def tiny() -> HFModel:
    return from_preset("qwen3-tiny", seed=5, logit_scale=12.0, num_hidden_layers=3)


def test_rows_at_once_equal_one_at_a_time_on_cpu(tiny) -> None:
    _check_rows(tiny, "cpu", 3)


def test_drift_table_floor_at_once_equals_one_at_a_time_on_cpu(tiny) -> None:
    _check_table(tiny, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_branches_equal_one_at_a_time_on_cpu(dtype) -> None:
    """The branches' bookkeeping (masks, positions, slots, the scaled logits) without graphs:
    float32 (logits scaled in float32) and bfloat16 (``ScaledLogits``)."""
    target = from_preset("qwen3-tiny", seed=5, dtype=dtype, logit_scale=12.0, num_hidden_layers=3)
    branches = _check_branches(target, "cpu")
    assert not branches.capture and branches._graphs == {}


def test_floor_beside_the_batch_decode_equals_one_after_the_other_on_cpu(tiny) -> None:
    _check_beside(tiny, "cpu")


def test_drift_table_runs_the_floor_beside_the_batch_decode(tiny, monkeypatch) -> None:
    """The drift table takes the interleaved path wherever its floor rows run as branches (and
    the one-after-the-other table is the same: ``_check_table``); switched off, it does not."""
    calls = []
    real = decode._decode_beside_alone
    monkeypatch.setattr(decode, "_decode_beside_alone", lambda *a: calls.append(1) or real(*a))
    _check_table(tiny, 1, branches=True)
    assert len(calls) == 1  # one prompt, one batch
    monkeypatch.setattr(decode, "FLOOR_BESIDE_BATCH", False)
    _check_table(tiny, 1, branches=True)
    assert len(calls) == 1


def test_branches_make_room_for_their_steps(tiny) -> None:
    """A replay model with fewer slots than the prompt and the rows need (5 + 9 > 8): the
    branches reserve them first, and their logits equal one row at a time."""
    model = ReplayStaticModel(tiny, max_slots=8, cuda_graphs=False)
    rows = _rows(model.vocab_size, 2)
    got = FloorBranches(model)(torch.tensor(PROMPT), PROMPT, rows)
    assert model.max_slots >= len(PROMPT) + T
    for g, w in zip(got, _one_at_a_time(model, rows), strict=True):
        assert torch.equal(g, w)


def test_drift_table_floor_as_branches_equals_one_at_a_time_on_cpu(tiny) -> None:
    _check_table(tiny, 1, branches=True)


def test_replay_model_with_workers_is_freed_without_the_collector(tiny) -> None:
    """A replay model that made workers holds no reference cycle: dropping it frees it (and its
    pools, ~22 GB at P1) at once, not at the garbage collector's next pass."""
    model = _replay(tiny)
    assert len(model.workers(3)) == 3 and model.workers_made == 3
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()


def test_cpu_drift_table_keeps_one_at_a_time() -> None:
    """On CPU ``drift_table`` runs on the loaded model (not a replay model): no concurrency."""
    tiny = from_preset("qwen3-tiny")
    assert not concurrent(replay_model(tiny, fast=True))
    assert not concurrent(tiny)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_rows_at_once_are_bit_identical() -> None:
    """On CUDA in bfloat16 with CUDA graphs, 8 workers on 8 streams: every floor row's logits
    and the drift table's floor column equal the one-at-a-time decode bit for bit."""
    target = from_preset("qwen3-tiny", seed=5, device="cuda", dtype=torch.bfloat16,
                         logit_scale=12.0, num_hidden_layers=3)  # fmt: skip
    model = _check_rows(target, "cuda", 8)
    assert all(w.cuda_graphs and w.stream is not None for w in model.workers(8))
    _check_table(target, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_branches_are_bit_identical() -> None:
    """On CUDA in bfloat16: the floor rows as the branches of one captured graph per step equal
    one at a time bit for bit (7 rows, 3 rows, 7 rows after new pools), and the drift table
    uses them by default and gives the one-at-a-time table."""
    target = from_preset("qwen3-tiny", seed=5, device="cuda", dtype=torch.bfloat16,
                         logit_scale=12.0, num_hidden_layers=3)  # fmt: skip
    branches = _check_branches(target, "cuda")
    assert branches.capture and {r for r, _ in branches._graphs} == {3, 7}
    _check_beside(target, "cuda")
    _check_table(target, 1, branches=True)
    samples, rounds = _samples(target.vocab_size, 6)
    model = _replay(target)
    cfg = [(f"c{i}", p) for i, p in enumerate(PARAMS)]
    drift_table(model, samples, rounds, {"p0": PROMPT}, cfg, arm="matched", K=2, batch_size=12,
                positions=T, rows_per_cell=4, floor_rows_per_cell=3, fast=True)  # fmt: skip
    assert model.workers_made == 6  # the default on CUDA: branches


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_branches_beside_the_batch_hold_workspaces_of_their_own() -> None:
    """At every position of torch's round-robin stream pool, the branches' stream and the
    workers' streams are pairwise distinct and none is the graph-capture stream, whose cuBLAS
    workspace the batch decode's graphs keep (``ReplayStaticModel.streams_apart``; a fresh P1
    run stalled with the GPU at 100 % when a branch drew it: results/LOG.md "lead (session
    27)"); then the interleaved batch and floor rows are bit-identical, each branch captured on
    a stream apart too."""
    target = from_preset("qwen3-tiny", seed=5, device="cuda", dtype=torch.bfloat16,
                         logit_scale=12.0, num_hidden_layers=3)  # fmt: skip
    cap = int(capture_stream().cuda_stream)

    def apart(streams: list[torch.cuda.Stream | None], n: int) -> None:
        handles = [int(s.cuda_stream) for s in streams if s is not None]
        assert len(handles) == n and len(set(handles)) == n and cap not in handles

    for k in range(POOL_STREAMS):
        for _ in range(k):
            torch.cuda.Stream()
        model = _replay(target)
        branches = FloorBranches(model)
        apart([branches.stream, *(w.stream for w in model.workers(4))], 1 + 4)
    model, branches = _check_beside(target, "cuda")
    apart([branches.stream, *branches._branches, *(w.stream for w in model.workers(3))], 7)
