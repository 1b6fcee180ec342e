"""The shortlist's selection (``sampling/selection.py``): the block path's ids are the ``W``
largest of each row with ties at the ``W``-th value to the lowest ids (a stable descending sort's
first ``W``), ``torch.topk``'s where the ``W``-th value is not tied and on the rows the blocks do
not decide; the laws built on them are the old selection's bit for bit (ids and
probabilities on untied rows; the dense law, the ``None``-ness and every draw on all rows), over
ties at the boundary, flat rows, top-k wider than ``W``, greedy and min-p rows, bfloat16 logits
and ``[B, K+1, V]`` target rows; and the fast loops decode the same tokens, rounds and white-box
columns with either selection.

The block path runs on CPU here by ``SELECTION = "blocks"`` (its default, "auto", takes it on CUDA
only). Inputs are fixed (seeded) and every comparison is exact (``torch.equal``): the claims are
identities, so the false-failure rate is zero."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec
from spectest.engines.fast import plain_decode_fast, speculative_decode_fast
from spectest.errors import InputError
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel
from spectest.sampling import selection
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.shortlist import logits_to_probs_fast, shortlist_probs

EXACT = get_variant("exact")
# filtered rows whose kept sets the shortlist of W = 64 decides on peaked enough rows (top-k <= 50,
# or nuclei / min-p sets at t 0.3): ``shortlist_probs`` gives a law, not None
DECIDED = [
    SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp)
    for t in (0.3, 0.8)
    for k in (1, 20, 50)
    for tp in (1.0, 0.5, 0.95)
    for mp in (0.0, 0.05)
] + [SamplingParams(temperature=0.3, top_p=0.5), SamplingParams(temperature=0.3, min_p=0.3)]
GRID = [
    SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp)
    for t in (0.0, 0.3, 0.8)
    for k in (0, 1, 20, 65)
    for tp in (1.0, 0.5, 0.95)
    for mp in (0.0, 0.05)
]  # t 0: greedy rows; k 65 > W = 64: fallback rows; no filter at all: temperature-only rows


def boundary_ties(x: torch.Tensor, W: int, g: torch.Generator) -> torch.Tensor:
    """``x`` with the values ranked ``W - 4 .. W + 4`` of each row set to the ``W``-th: ties
    across the boundary, placed at random ids."""
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices  # [n, V]
    tie = order[:, W - 5 : W + 4]  # [n, 9]
    kth = x.gather(-1, order[:, W - 1 : W])  # [n, 1]
    y = x.clone()
    y.scatter_(-1, tie, kth.expand_as(tie))
    return y[:, torch.randperm(x.shape[1], generator=g)]


def logit_sets(g: torch.Generator, n: int, V: int, W: int) -> dict[str, torch.Tensor]:
    """``[n, V]`` logits: continuous, bfloat16-valued × 20 (the realistic pair's float32: many
    ties), ties planted across the boundary, small integers, near-flat, the largest packed in the
    last blocks (ascending rows), -inf on a quarter of the ids, all equal; and bfloat16 itself."""
    cont = torch.randn(n, V, generator=g) * 3
    pair = (torch.randn(n, V, generator=g) * 0.5).bfloat16().float() * 20
    masked = cont.clone()
    masked[:, : V // 4] = float("-inf")
    sets = {
        "continuous": cont,
        "pair": pair,
        "boundary_ties": boundary_ties(cont, W, g),
        "pair_boundary_ties": boundary_ties(pair, W, g),
        "integers": torch.randint(-3, 3, (n, V), generator=g).float(),
        "flat": torch.randn(n, V, generator=g) * 0.01,
        "ascending": torch.sort(cont, dim=-1).values,
        "masked": masked,
        "equal": torch.zeros(n, V),
    }
    sets["bf16"] = pair.bfloat16()
    sets["bf16_boundary_ties"] = sets["pair_boundary_ties"].bfloat16()
    return sets


def stable_first(x: torch.Tensor, W: int) -> torch.Tensor:
    """``[n, W]``: a stable descending sort's first ``W`` ids, ascending (ties to the lowest)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :W].sort(-1).values


def untied(x: torch.Tensor, W: int) -> torch.Tensor:
    """``[n]`` bool: the ``W``-th largest value differs from the ``W + 1``-th (one top-W set)."""
    v = torch.topk(x.float(), W + 1, dim=-1).values  # [n, W + 1] descending
    return v[:, W - 1] != v[:, W]


@pytest.fixture
def blocks(monkeypatch):
    monkeypatch.setattr(selection, "SELECTION", "blocks")


@pytest.mark.parametrize("block,per_token", [(8, 2), (16, 1), (4, 2)])
@pytest.mark.parametrize("W", [16, 64])
def test_block_ids_are_the_w_largest_ties_to_the_lowest_ids(
    blocks, monkeypatch, block, per_token, W
):
    """Decided rows: a stable descending sort's first W; the rest: ``topk_ids``. With 2·W blocks
    every row is decided but those whose W-th value is the smallest kept block maximum
    (small integers, all equal); one W of blocks (16 tokens each) leaves rows undecided."""
    monkeypatch.setattr(selection, "BLOCK", block)
    monkeypatch.setattr(selection, "BLOCKS_PER_TOKEN", per_token)
    g = torch.Generator().manual_seed(3)
    n, V = 24, 4096
    for name, x in logit_sets(g, n, V, W).items():
        assert selection.uses_blocks(x, W)
        ids, bad = selection.select_blocks(x, W, selection.block_max(x)[1])
        ok, one = ~bad, untied(x, W)  # [n] each
        assert torch.equal(ids[ok], stable_first(x[ok], W)), name
        got = selection.select_shortlist(x, W)
        assert torch.equal(got[ok], ids[ok]), name
        assert torch.equal(got[bad], selection.topk_ids(x[bad], W)), name
        assert torch.equal(got[one], selection.topk_ids(x, W)[one]), name
        if name in ("integers", "equal"):
            assert bool(bad.all()), name  # W-th value == the smallest kept block maximum
        elif per_token == 2:
            assert not bool(bad.any()), name  # the block path decides every other row
        if per_token == 2 and "boundary_ties" in name:
            assert not bool(one.any()), name  # every row decided with a tie across the boundary


def test_block_path_applies_by_device_and_shape(monkeypatch):
    x = torch.zeros(2, 4096)
    assert not selection.uses_blocks(x, 64)  # "auto": CUDA only
    monkeypatch.setattr(selection, "SELECTION", "blocks")
    assert selection.uses_blocks(x, 64) and selection.uses_blocks(x, 128)
    assert not selection.uses_blocks(x, 129)  # candidates beyond half a row
    assert not selection.uses_blocks(torch.zeros(2, 4100), 16)  # V not a multiple of BLOCK
    monkeypatch.setattr(selection, "SELECTION", "topk")
    assert not selection.uses_blocks(x, 64)
    monkeypatch.setattr(selection, "SELECTION", "block")
    with pytest.raises(InputError, match="SELECTION must be auto, blocks or topk, got 'block'"):
        selection.uses_blocks(x, 64)


def laws_by_selection(monkeypatch, logits, params, W, check):
    """``(logits_to_probs_fast, shortlist_probs)`` under SELECTION "topk", then "blocks"."""
    out = []
    for mode in ("topk", "blocks"):
        monkeypatch.setattr(selection, "SELECTION", mode)
        out.append(
            (
                logits_to_probs_fast(logits, params, width=W, check=check),
                shortlist_probs(logits, params, width=W, check=check),
            )
        )
    return out


@pytest.mark.parametrize("S", [1, 5])
def test_laws_and_draws_equal_the_topk_selections(monkeypatch, S):
    g = torch.Generator().manual_seed(7)
    W, V = 64, 4096
    filtered = [p for p in GRID if p.temperature > 0 and (p.top_k or p.top_p < 1 or p.min_p)]
    for name, x in logit_sets(g, len(GRID) * S, V, W).items():
        for grid in (GRID, filtered, DECIDED):
            n = len(grid)
            logits = x[: n * S].reshape(n, S, V) if S > 1 else x[:n]
            params = SamplingTensors.from_params(grid)
            (dense_a, law_a), (dense_b, law_b) = laws_by_selection(
                monkeypatch, logits, params, W, check=name != "masked"
            )  # -inf logits: unchecked, as the fast loops call it
            assert torch.equal(dense_a, dense_b), name
            assert (law_a is None) == (law_b is None), name
            if grid is DECIDED and name not in ("integers", "flat", "equal"):
                assert law_b is not None, name  # the comparisons below run
            if law_a is None or law_b is None:
                continue
            assert torch.equal(law_a.dense(), law_b.dense()), name
            for _ in range(10):
                u = torch.rand(logits.shape[:-1], generator=g, dtype=torch.float64)
                u = u.clamp(1e-12, 1 - 1e-12)
                assert torch.equal(law_a.draw(u), law_b.draw(u)), name
            flat = logits.reshape(-1, V)
            one = untied(flat, W)  # rows with one top-W set: the same ids and probabilities
            a, b = law_a.flat(), law_b.flat()
            assert torch.equal(a.ids[one], b.ids[one]) and torch.equal(a.probs[one], b.probs[one])
            _, bad = selection.select_blocks(flat, W, selection.block_max(flat)[1])
            assert torch.equal(b.ids[~bad], stable_first(flat[~bad], W)), name
    monkeypatch.setattr(selection, "SELECTION", "auto")


@pytest.fixture(scope="module")
def wide_pair() -> tuple[StaticHFModel, StaticHFModel]:
    # V = 32768: the block path's smallest vocabulary at the default width 1024; logit scale 20 as
    # the realistic pair (float32 logits, peaked: the rounds run on shortlist laws)
    target = from_preset(
        "qwen3-tiny", seed=5, num_hidden_layers=2, vocab_size=32768, logit_scale=20.0
    )
    return StaticHFModel(target, cuda_graphs=False), StaticHFModel(
        first_layers(target, 1), cuda_graphs=False
    )


@pytest.mark.parametrize("onehot", [False, True], ids=["sampled", "onehot"])
def test_fast_loops_decode_the_same_with_either_selection(monkeypatch, wide_pair, onehot):
    """Both drafters, top-p / top-k / min-p rows and a greedy row: the same tokens, rounds and
    white-box columns with SELECTION "topk" and "blocks" (the block path counted)."""
    t, d = wide_pair
    params = [
        SamplingParams(0.8, 0, 0.95),
        SamplingParams(0.8, 50),
        SamplingParams(1.0, 8, 0.9, 0.05),
    ]
    rows = [RowSpec(f"c{i}", s, p) for s in range(3) for i, p in enumerate(params)]
    drafter = DrafterSpec(onehot=onehot, k=3)
    calls = []
    real = selection.select_blocks

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(selection, "select_blocks", counted)
    import spectest.sampling.shortlist as shortlist

    monkeypatch.setattr(shortlist, "select_blocks", counted)
    for rs in (rows, [*rows, RowSpec("greedy", 0, SamplingParams(0.0))]):
        req = DecodeRequest([1, 2, 3], rs, num_positions=8, run_key=7, prompt_id="p",
                            whitebox=True, batch_size=5)  # fmt: skip
        outs = []
        for mode in ("topk", "blocks"):
            monkeypatch.setattr(selection, "SELECTION", mode)
            spec = speculative_decode_fast(t, d, req, drafter=drafter, variant=EXACT)
            plain = plain_decode_fast(t, req, draft=d, drafter=drafter)
            outs.append((spec, plain))
        (sa, pa), (sb, pb) = outs
        assert np.array_equal(sa.tokens, sb.tokens) and sa.rounds is not None
        assert sa.rounds.equals(sb.rounds) and sa.whitebox is not None
        assert sa.whitebox.equals(sb.whitebox)
        assert np.array_equal(pa.tokens, pb.tokens) and pa.whitebox is not None
        assert pa.whitebox.equals(pb.whitebox)
    assert len(calls) >= 20


@pytest.mark.gpu
def test_on_cuda_the_block_ids_are_torch_topks(monkeypatch):
    """On CUDA (``SELECTION = "auto"``: the block path) the ids are ``torch.topk``'s bit for bit,
    ties included (CUDA's top-k takes the first-seen ties: the lowest ids), at P2's vocabulary on
    bf16 × 20 logits (the realistic pair's float32: ties at every boundary) and their bf16
    rounding; so ``shortlist_probs`` gives the same ids, probabilities and draws, and the fast
    loops the same tokens and rounds. False-failure rate 0 on these inputs (a difference needs
    signed zeros tied at the W-th value, which these logits do not hold)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    g = torch.Generator(device="cuda").manual_seed(0)
    pair = (torch.randn(640, 151_936, device="cuda", generator=g) * 0.5).bfloat16().float() * 20
    params = SamplingTensors.from_params([SamplingParams(0.8, 0, 0.95)] * 128, device="cuda")
    u = torch.rand(128, 5, generator=g, device="cuda", dtype=torch.float64).clamp(1e-12, 0.999)
    for x in (pair, pair.bfloat16()):
        assert selection.uses_blocks(x, 1024)
        assert torch.equal(selection.select_shortlist(x, 1024), selection.topk_ids(x, 1024))
        laws = []
        for mode in ("topk", "auto"):
            monkeypatch.setattr(selection, "SELECTION", mode)
            laws.append(shortlist_probs(x.reshape(128, 5, -1), params, check=False))
        a, b = laws
        assert a is not None and b is not None
        assert torch.equal(a.ids, b.ids) and torch.equal(a.probs, b.probs)
        assert torch.equal(a.draw(u, check=False), b.draw(u, check=False))
    target = from_preset(
        "qwen3-tiny", seed=5, num_hidden_layers=2, vocab_size=32768, logit_scale=20.0,
        device="cuda", dtype=torch.bfloat16,
    )  # fmt: skip
    t, d = StaticHFModel(target), StaticHFModel(first_layers(target, 1))
    rows = [RowSpec("c", s, SamplingParams(0.8, 0, 0.95)) for s in range(64)]
    req = DecodeRequest([1, 2, 3], rows, num_positions=24, run_key=7, prompt_id="p")
    drafter = DrafterSpec(onehot=False, k=4)
    outs = []
    for mode in ("topk", "auto"):
        monkeypatch.setattr(selection, "SELECTION", mode)
        outs.append(speculative_decode_fast(t, d, req, drafter=drafter, variant=EXACT))
    assert np.array_equal(outs[0].tokens, outs[1].tokens) and outs[0].rounds is not None
    assert outs[0].rounds.equals(outs[1].rounds)
