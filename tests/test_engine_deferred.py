"""The shortlist's host reads deferred (issue 32, P2; ``shortlist.Deferred``,
``pipeline.deferred_first``): the fast loops' shortlist calls make no host sync, the plain loop
reads their flag after its first step, every ``DEFERRED_EVERY`` steps and at its end, the
speculative loop after its first round and with its own "any row active?" read; a failed flag
redoes the chunk with the reads made. On CUDA by default (``DEFER_ON``); here forced on CPU.

Tokens, rounds and white-box columns are compared bit for bit with the synced loops, where every
call decides (no redo) and where some do not (a shortlist of 32 of 512 tokens under top-p: the
redo is counted); the syncs are counted; non-finite logits raise the synced loop's error. Exact
comparisons and counts: no false failures."""

from __future__ import annotations

import copy
import dataclasses
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spectest.engines import builtin
from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec, plain_decode, speculative_decode
from spectest.engines.fast import as_fast
from spectest.errors import NumericsError
from spectest.models.derive import first_layers
from spectest.models.hf import HFModel, from_preset
from spectest.sampling import pipeline as pipeline_mod
from spectest.sampling.draw import categorical
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.pipeline import DEFERRED_EVERY, FAST, Pipeline
from spectest.sampling.shortlist import Deferred, Undecided, logits_to_probs_fast, shortlist_probs

TOP_K = [SamplingParams(temperature=1.0, top_k=20), SamplingParams(temperature=0.7, top_k=8)]
TOP_P = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, top_p=0.9)]


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    target = from_preset("qwen3-tiny", seed=5, logit_scale=4.0, num_hidden_layers=2)
    draft = first_layers(target, 1)
    return as_fast(target, static=True), as_fast(draft, static=True)


def _narrow(width: int) -> Pipeline:
    """The fast pipeline on a shortlist of ``width`` of the tiny model's 512 tokens."""
    return dataclasses.replace(
        FAST,
        probs=partial(logits_to_probs_fast, width=width),
        shortlist=partial(shortlist_probs, width=width),
    )


def _req(params: list[SamplingParams], T: int, whitebox: bool, batch: int = 4) -> DecodeRequest:
    rows = [RowSpec(f"c{i}", s, p) for s in range(3) for i, p in enumerate(params)]
    return DecodeRequest(
        [1, 2, 3], rows, num_positions=T, batch_size=batch, whitebox=whitebox, run_key=3,
        prompt_id="p",
    )  # fmt: skip


def _both(pair: Any, pipe: Pipeline, req: DecodeRequest, spec: bool, onehot: bool) -> Any:
    target, draft = pair
    drafter = DrafterSpec(onehot=onehot, k=3)
    if spec:
        v = get_variant("exact")
        return speculative_decode(target, draft, req, drafter=drafter, variant=v, pipeline=pipe)
    wb = {"draft": draft, "drafter": drafter} if req.whitebox else {}
    return plain_decode(target, req, pipeline=pipe, **wb)


def _counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[bool]:
    """Wrap ``builtin.<name>`` (a chunk's run) to record whether each call was deferred."""
    calls: list[bool] = []
    inner = getattr(builtin, name)

    def run(*args: Any) -> Any:
        calls.append(args[-1].deferred is not None)
        return inner(*args)

    monkeypatch.setattr(builtin, name, run)
    return calls


@pytest.mark.parametrize("whitebox", [False, True], ids=["tokens", "whitebox"])
@pytest.mark.parametrize(
    ("spec", "onehot"),
    [(False, False), (True, False), (True, True)],
    ids=["plain", "sampled", "onehot"],
)
@pytest.mark.parametrize("case", ["decided", "undecided"])
def test_deferred_reads_give_the_synced_outputs(pair, monkeypatch, spec, onehot, whitebox, case):
    """Tokens, rounds and white-box columns equal the synced loop's bit for bit. Where every call
    decides (top-k rows) each chunk runs once, deferred; where top-p rows leave calls undecided on
    32 shortlisted tokens, a chunk is redone with the reads made and the call's later chunks read
    at once (the redo and the switch counted)."""
    params, width = (TOP_K, 64) if case == "decided" else (TOP_P, 32)
    req = partial(_req, params, 13, whitebox)
    want = _both(pair, _narrow(width), req(), spec, onehot)
    monkeypatch.setattr(pipeline_mod, "DEFER_ON", frozenset({"cpu"}))
    calls = _counted(monkeypatch, "_spec_run" if spec else "_plain_chunk")
    got = _both(pair, _narrow(width), req(), spec, onehot)
    assert np.array_equal(got.tokens, want.tokens)
    assert (got.rounds is None) == (want.rounds is None)
    assert got.rounds is None or got.rounds.equals(want.rounds)
    if whitebox:
        pd.testing.assert_frame_equal(got.whitebox, want.whitebox, check_exact=True)
    chunks = 2  # 6 rows in chunks of 4
    if case == "decided":
        assert calls == [True] * chunks
    else:  # the first chunk deferred, then redone; the second read at once
        assert calls == [True, False, False]


class _Syncs(TorchDispatchMode):
    """Counts host syncs: ``bool``/``int``/``item`` (``_local_scalar_dense``), ``tolist`` and
    ``nonzero`` (its output's size is read on the host: a sync on CUDA)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.n = 0
        tolist = torch.Tensor.tolist

        def counted(t: torch.Tensor) -> Any:
            self.n += 1
            return tolist(t)

        monkeypatch.setattr(torch.Tensor, "tolist", counted)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.n += func in (
            torch.ops.aten._local_scalar_dense.default,
            torch.ops.aten.nonzero.default,
        )
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            ],
        ),
    ],
)
def test_a_deferred_call_over_mixed_rows_makes_no_host_sync(monkeypatch, device) -> None:
    """A deferred ``shortlist_probs`` call whose rows mix top-p alone with top-k (seed 001's
    configs in one batch: the general path, the full-vocabulary sum for the top-p rows only)
    makes no host sync once its parameters' host flags are read (the first call): the top-p rows'
    ids come from the host's count (``nonzero_static``), not from ``nonzero``. Its law equals the
    synced call's, and the general path is the one taken (rows of both kinds, no min-p)."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn((6, 512), generator=g, dtype=torch.float64).float() * 6).to(device)
    params = SamplingTensors.from_params([TOP_K[0], TOP_P[0], TOP_K[1]] * 2, device=device)
    want = shortlist_probs(x, params, width=128)
    assert want is not None
    shortlist_probs(x, params, width=128, defer=Deferred())  # reads the host flags once
    assert params.host and next(iter(params.host.values()))[2] == 2  # two top-p-alone rows
    defer = Deferred()
    with _Syncs(monkeypatch) as count:
        got = shortlist_probs(x, params, width=128, defer=defer)
    assert count.n == 0
    assert got is not None and defer.check() == []
    assert torch.equal(got.ids, want.ids) and torch.equal(got.probs, want.probs)

    def missing(*a: Any, **k: Any) -> Any:  # CUDA before torch 2.6 has no nonzero_static
        raise NotImplementedError("Could not run 'aten::nonzero_static' with arguments from CUDA")

    monkeypatch.setattr(torch, "nonzero_static", missing)
    old = shortlist_probs(x, params, width=128, defer=Deferred())  # ``nonzero``: the same law
    assert old is not None and torch.equal(old.probs, want.probs)


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "speculative"])
def test_deferred_reads_replace_the_calls_syncs(pair, monkeypatch, spec) -> None:
    """Per chunk of T = 13 steps, the plain loop makes T shortlist syncs fewer and one per
    deferred read more (after steps 0, 8 and 12); the speculative loop K + 1 fewer per round and
    one more (after round 0: the later reads ride on the loop's own). Every call decides."""
    req = _req(TOP_K, 13, False, batch=6)
    pipe = _narrow(64)
    with _Syncs(monkeypatch) as count:
        want = _both(pair, pipe, req, spec, onehot=False)
    synced = count.n
    monkeypatch.setattr(pipeline_mod, "DEFER_ON", frozenset({"cpu"}))
    with _Syncs(monkeypatch) as count:
        got = _both(pair, pipe, req, spec, onehot=False)
    deferred = count.n
    assert np.array_equal(got.tokens, want.tokens)
    if spec:
        rounds = int(want.rounds["round"].max()) + 1
        assert deferred == synced - (3 + 1) * rounds + 1
    else:
        reads = len({*range(0, 13, DEFERRED_EVERY), 12})
        assert deferred == synced - 13 + reads


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "speculative"])
def test_non_finite_logits_raise_the_synced_error(pair, monkeypatch, spec) -> None:
    """A target whose logit of token 7 is NaN: the deferred call flags it, the chunk is redone
    with the reads made, and that raises the synced loop's ``NumericsError``."""
    target, draft = pair
    bad = copy.deepcopy(target.base)  # the HFModel under the static cache
    assert isinstance(bad, HFModel)
    with torch.no_grad():
        bad.model.lm_head.weight[7] = float("nan")
    monkeypatch.setattr(pipeline_mod, "DEFER_ON", frozenset({"cpu"}))
    calls = _counted(monkeypatch, "_spec_run" if spec else "_plain_chunk")
    with pytest.raises(NumericsError, match="non-finite"):
        _both((as_fast(bad, static=True), draft), _narrow(64), _req(TOP_K, 5, False), spec, False)
    assert calls == [True, False]


def test_deferred_check_reads_the_flag_with_the_callers_values() -> None:
    """``check`` with no call made reads only the caller's values; while every row added is ok
    it returns them; after one row that is not, it raises ``Undecided``, whatever the values."""
    d = Deferred()
    assert d.check() == []
    assert d.check(torch.tensor(True)) == [True]
    d.add(torch.tensor([True, True]))
    assert d.check(torch.tensor(False), torch.tensor(True)) == [False, True]
    d.add(torch.tensor([True, False]))
    d.add(torch.tensor([True, True]))  # ANDed: stays failed
    with pytest.raises(Undecided):
        d.check(torch.tensor(True))


def test_void_rows_draw_ids_in_range() -> None:
    """A deferred call's void rows (NaN logits, undecided) still draw ids in range before the
    read: an all-NaN or all-zero row draws id 0 (``_next_positive``), never -1, which indexes out
    of range (a device-side assert on CUDA)."""
    probs = torch.tensor([[float("nan")] * 4, [0.0] * 4, [0.1, 0.0, 0.9, 0.0]], dtype=torch.float64)
    u = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)
    assert categorical(probs, u, check=False).tolist() == [0, 0, 2]
    params = SamplingParams(temperature=0.8, top_p=0.95)
    x = torch.randn(3, 512)
    x[1] = float("nan")
    d = Deferred()
    law = shortlist_probs(x, SamplingTensors.from_params([params] * 3), width=32, defer=d)
    assert law is not None
    tok = law.draw(torch.full((3,), 0.5, dtype=torch.float64), check=False)
    assert bool(((tok >= 0) & (tok < 512)).all())
    with pytest.raises(Undecided):
        d.check()


def test_pipelines_defer_only_on_listed_devices_and_with_a_shortlist() -> None:
    """``deferring``: CUDA by default; the reference pipeline (no shortlist) never; each call a
    fresh ``Deferred``."""
    from spectest.sampling.pipeline import REFERENCE

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert FAST.deferring(cpu) is FAST and REFERENCE.deferring(cuda) is REFERENCE
    a, b = FAST.deferring(cuda), FAST.deferring(cuda)
    assert a.deferred is not None and b.deferred is not None and a.deferred is not b.deferred
    assert FAST.deferred is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deferred_reads_on_cuda(monkeypatch, dtype) -> None:
    """On CUDA the loops defer by default (CUDA graphs, bfloat16 included): the outputs equal the
    loops that read at once, where calls decide (each chunk run once, deferred) and where they do
    not (the first chunk redone); NaN logits raise the synced error with the device still usable
    (no out-of-range index before the read)."""
    target = from_preset("qwen3-tiny", seed=5, logit_scale=4.0, device="cuda", dtype=dtype)
    pair = as_fast(target, static=True), as_fast(first_layers(target, 1), static=True)
    for params, width, runs in ((TOP_K, 64, [True, True]), (TOP_P, 32, [True, False, False])):
        for spec, onehot in ((False, False), (True, False), (True, True)):
            req = partial(_req, params, 13, True)
            with monkeypatch.context() as mp:
                calls = _counted(mp, "_spec_run" if spec else "_plain_chunk")
                got = _both(pair, _narrow(width), req(), spec, onehot)  # DEFER_ON: cuda
            assert calls == runs
            with monkeypatch.context() as mp:
                mp.setattr(pipeline_mod, "DEFER_ON", frozenset())
                want = _both(pair, _narrow(width), req(), spec, onehot)
            assert np.array_equal(got.tokens, want.tokens)
            assert got.rounds is None or got.rounds.equals(want.rounds)
            pd.testing.assert_frame_equal(got.whitebox, want.whitebox, check_exact=True)
    bad = copy.deepcopy(target)
    with torch.no_grad():
        bad.model.lm_head.weight[7] = float("nan")
    bad_pair = as_fast(bad, static=True), pair[1]
    for spec in (False, True):
        with pytest.raises(NumericsError, match="non-finite"):
            _both(bad_pair, _narrow(64), _req(TOP_K, 5, False), spec, False)
    torch.cuda.synchronize()  # the context survived: no device-side assert
