"""The fast sampling pipeline vs the exact one at Qwen3's vocabulary: ms per call, 64 rows,
the three seed-001 configs, logits with the realistic pair's spread (std 12), one CPU thread.

    python benchmarks/bench_sampling_fast.py
"""

import time

import torch

from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.shortlist import logits_to_probs_fast
from spectest.sampling.transforms import logits_to_probs

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
V, B = 151936, 64
x = (
    torch.randn(B, V, generator=g) * 12.0
).float()  # std of the realistic pair (0.6 x logit scale 20)
for p in (SamplingParams(0.8, 0, 0.95), SamplingParams(1.0, 50), SamplingParams(0.7, 20, 0.9)):
    st = SamplingTensors.from_params([p] * B)
    for name, f in (("exact", logits_to_probs), ("fast", logits_to_probs_fast)):
        f(x, st)
        t = time.perf_counter()
        [f(x, st) for _ in range(3)]
        dt = (time.perf_counter() - t) / 3
        print(p, name, round(dt * 1000), "ms")
