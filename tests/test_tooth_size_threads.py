"""Issue 32: the tooth-size phase's prompts on threads (``tooth_sizes(..., threads=N)``, the
default on an accelerator): the table equals the one-prompt-at-a-time table bit for bit, in the
same row order, and the prompts really ran on several threads — on CPU with a realistic tiny
Qwen3 pair and, ``-m gpu`` (skipped without CUDA), on CUDA in bfloat16 on the batched path. Exact
checks; no randomness beyond fixed seeds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
import torch

from spectest.engines.base import DrafterSpec
from spectest.models.zoo import load_pair
from spectest.sampling.params import SamplingParams
from spectest.tooth_size import tooth_sizes

CONFIGS = [
    ("t0.8-p0.95", SamplingParams(temperature=0.8, top_p=0.95)),
    ("t1.0-k50", SamplingParams(temperature=1.0, top_k=50)),
]
PROMPTS = {
    "a": [5, 17, 99, 3, 250, 41, 7, 300, 12],
    "b": [8, 1, 44, 2, 90],
    "c": [301, 7, 7, 9, 120, 33, 4],
}


def _on_threads(target: Any, run: Callable[[], Any]) -> tuple[Any, set[int]]:
    """``run()``'s result and the threads the target's forwards ran on meanwhile."""
    seen: set[int] = set()
    fwd = type(target).forward

    def recording(self, cache, ids):  # type: ignore[no-untyped-def]
        seen.add(threading.get_ident())
        return fwd(self, cache, ids)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(target), "forward", recording)
        return run(), seen


def _check(device: str, dtype: str, threads: int) -> None:
    target, draft = load_pair(
        "realistic:qwen3-tiny,draft_layers=1,logit_scale=20.0",
        "derived:first_layers,layers=1",
        device=device,
        dtype=dtype,
    )
    drafter = DrafterSpec(onehot=True, q_mode="processed", k=4)
    args = (target, draft, PROMPTS, CONFIGS, [("eps", "eps_biased:0.5")], drafter, 6)
    one = tooth_sizes(*args, threads=1)
    many, seen = _on_threads(target, lambda: tooth_sizes(*args, threads=threads))
    assert len(seen) > 1  # the prompts ran on several threads
    pd.testing.assert_frame_equal(many, one, check_exact=True)
    assert list(many["prompt_id"].unique()) == list(PROMPTS)
    assert (one["tv"] > 0).any() and len(one) == len(PROMPTS) * len(CONFIGS) * 5


def test_prompts_on_threads_equal_one_at_a_time_on_cpu() -> None:
    _check("cpu", "float32", 3)


def test_cpu_default_is_one_prompt_at_a_time() -> None:
    """On CPU the default keeps the main job's path: every forward on the calling thread."""
    target, draft = load_pair(
        "realistic:qwen3-tiny,draft_layers=1", "derived:first_layers,layers=1"
    )
    drafter = DrafterSpec(onehot=True, q_mode="processed", k=2)
    eps = [("eps", "eps_biased:0.5")]
    _, seen = _on_threads(
        target,
        lambda: tooth_sizes(target, draft, PROMPTS, CONFIGS[:1], eps, drafter, 3, budget=64),
    )
    assert seen == {threading.get_ident()}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_prompts_on_threads_are_bit_identical() -> None:
    _check("cuda", "bfloat16", 4)
