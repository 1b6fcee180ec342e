"""The tooth-size phase's fast path (spectest.tooth_size: the prompt prefilled once per model and
prompt, the completion's dense work on the model's device, the merge by a column sort) against
its slow reference (``tooth_sizes(..., reference=True)``: the implementation before issue 24's
speed work) on real models: the bundled pair with the main job's prompts and a realistic tiny
Qwen3 pair, one-hot and sampled drafters. On CPU the two are equal bit for bit (the same float64
operations in the same order), so every test is exact; no randomness beyond fixed seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectest.engines.base import DrafterSpec
from spectest.models.base import LanguageModel
from spectest.models.zoo import load_pair
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol
from spectest.sampling.params import SamplingParams
from spectest.tooth_size import tooth_sizes
from spectest.tooth_size.completion import _merge, _merge_fast

CONFIGS = [
    ("t0.8-p0.95", SamplingParams(temperature=0.8, top_p=0.95)),
    ("t1.0-k50", SamplingParams(temperature=1.0, top_k=50)),
    ("t0.7-k20-p0.9", SamplingParams(temperature=0.7, top_k=20, top_p=0.9)),
]
TEETH = [("eps", "eps_biased:0.5"), ("aa", "always_accept"), ("rp", "residual_from_p")]


def both(
    target: LanguageModel, draft: LanguageModel, prompts: dict[str, list[int]],
    drafter: DrafterSpec, budget: int, monkeypatch: pytest.MonkeyPatch,
    configs: list[tuple[str, SamplingParams]] = CONFIGS,
) -> tuple[pd.DataFrame, pd.DataFrame, int, int]:  # fmt: skip
    """(reference table, fast table, prompt forwards of each: a forward of more than 8 tokens,
    the contexts here having at most K + 1 = 5)."""
    calls = [0]
    fwd = type(target).forward

    def counting(self, cache, ids):  # type: ignore[no-untyped-def]
        calls[0] += int(ids.shape[1]) > 8  # a prompt (the contexts here are <= K + 1 tokens)
        return fwd(self, cache, ids)

    monkeypatch.setattr(type(target), "forward", counting)
    args = (target, draft, prompts, configs, TEETH, drafter, 6)
    ref = tooth_sizes(*args, budget=budget, reference=True)
    n_ref, calls[0] = calls[0], 0
    fast = tooth_sizes(*args, budget=budget)
    return ref, fast, n_ref, calls[0]


@pytest.mark.parametrize("onehot", [True, False])
def test_fast_equals_reference_on_the_bundled_pair(
    onehot: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main job's pair and prompts (protocols/top_p.yaml), two configs, three teeth: the
    fast table equals the reference's exactly (every tv and slack to the last bit), and the fast
    path runs the prompt once per model and prompt where the reference runs it per batch."""
    p = load_protocol("protocols/top_p.yaml")
    target, draft = load_pair("bundled:target", "bundled:draft")
    prompts = prompt_token_ids(p, target.vocab_size)
    drafter = DrafterSpec(onehot=onehot, q_mode="processed", k=4)
    ref, fast, n_ref, n_fast = both(target, draft, prompts, drafter, 300, monkeypatch,
                                    configs=CONFIGS[::2])  # fmt: skip
    pd.testing.assert_frame_equal(ref, fast, check_exact=True)
    assert (fast["tv"] > 0).any() and n_fast <= 2 * len(prompts) < n_ref, (n_fast, n_ref)


@pytest.mark.parametrize(
    ("onehot", "scale", "budget"), [(True, 20.0, 2048), (False, 3.0, 200)]
)  # fmt: skip
def test_fast_equals_reference_at_a_realistic_tiny_shape(
    onehot: bool, scale: float, budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``realistic:qwen3-tiny`` (Qwen3 layers, V = 512) with a first-layer draft: equal to the
    last bit. One-hot: its peaked logits, three configs, the default budget. Sampled: broader
    logits (``logit_scale=3``) at top-k 20 / top-p 0.9 and a budget of 200 contexts, so that
    the completion is cut and sizes are bounds (the budget and slack paths)."""
    target, draft = load_pair(f"realistic:qwen3-tiny,draft_layers=1,logit_scale={scale}",
                              "derived:first_layers,layers=1")  # fmt: skip
    prompts = {"a": [5, 17, 99, 3, 250, 41, 7, 300, 12], "b": [400, 2, 2, 81, 9, 133, 60, 5, 11]}
    if not onehot:
        prompts = {"a": prompts["a"]}
    configs = CONFIGS if onehot else CONFIGS[2:]
    drafter = DrafterSpec(onehot=onehot, q_mode="processed", k=4)
    ref, fast, n_ref, n_fast = both(target, draft, prompts, drafter, budget, monkeypatch,
                                    configs=configs)  # fmt: skip
    pd.testing.assert_frame_equal(ref, fast, check_exact=True)
    assert (fast["tv"] > 0).any() and n_fast < n_ref
    assert onehot or (fast["status"] == "bound").any()


def test_merge_by_column_sort_equals_unique() -> None:
    """``_merge_fast`` = ``_merge`` bit for bit (rows, order, summed weights) on seeded random
    sequences with many repeats and cancelling weights, and the stable sort by weight it feeds
    gives the reference's ``lexsort`` order."""
    rng = np.random.default_rng(0)
    for trial in range(300):
        n, length = int(rng.integers(0, 300)), int(rng.integers(1, 5))
        seqs = rng.integers(0, int(rng.integers(1, 6)), size=(n, length)).astype(np.int64)
        w = rng.standard_normal(n) * 10.0 ** rng.integers(-20, 1, size=n)
        if trial % 3 == 0:  # exact cancellations: rows whose weights sum to zero are dropped
            seqs = np.concatenate([seqs, seqs[::-1]])
            w = np.concatenate([w, -w[::-1]])
        (s_a, w_a), (s_b, w_b) = _merge(seqs, w), _merge_fast(seqs, w)
        assert s_a.shape == s_b.shape and (s_a == s_b).all() and (w_a == w_b).all(), trial
        order_a = np.lexsort((*s_a.T[::-1], -np.abs(w_a)))
        assert (order_a == np.argsort(-np.abs(w_b), kind="stable")).all(), trial


def test_batched_forwards_give_the_same_sizes_in_fewer_forwards() -> None:
    """The batched path (``batched=True``, the default on an accelerator: forwards of
    ``DEVICE_FORWARD_ROWS`` contexts, a completion length fetched at once) on CPU: the same
    statuses and sizes as the unbatched path to 1e-12 (another grouping of rows per forward
    moves float32 logits by a last bit on CPU, 3e-16 in TV measured, hence not the CPU default),
    in fewer forwards; and the CPU default is the unbatched path, bit for bit."""
    target, draft = load_pair("realistic:qwen3-tiny,draft_layers=1,logit_scale=20.0",
                              "derived:first_layers,layers=1")  # fmt: skip
    prompts = {"a": [5, 17, 99, 3, 250, 41, 7, 300, 12]}
    calls = [0]
    fwd = type(target).forward

    def counting(self, cache, ids):
        calls[0] += 1
        return fwd(self, cache, ids)

    drafter = DrafterSpec(onehot=True, q_mode="processed", k=4)
    args = (target, draft, prompts, CONFIGS[:2], TEETH[:1], drafter, 6)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(target), "forward", counting)
        plain = tooth_sizes(*args, batched=False)
        n_plain, calls[0] = calls[0], 0
        batched = tooth_sizes(*args, batched=True)
        n_batched = calls[0]
    default = tooth_sizes(*args)
    pd.testing.assert_frame_equal(default, plain, check_exact=True)
    pd.testing.assert_frame_equal(batched, plain, check_exact=False, rtol=0, atol=1e-12)
    assert (plain["tv"] > 0).any() and n_batched < n_plain, (n_batched, n_plain)
