"""Micro-benchmark (issue 24): the full-vocabulary steps of the fast pipeline at Qwen3's V.

Times, on CUDA at [N, 151936] float32 logits (N = 1024 draft rows, 5120 verify rows):
``torch.topk(x, 1024)`` (the shortlist), a two-stage chunked top-k (per-chunk top-W, then top-W of
the candidates: the same top-W set as values, ties aside), and the top-p normaliser as the torch
expression (``kernels.weight_sum_reference``) vs the fused kernel (``kernels.weight_sum``),
asserting the sums equal to 1e-12 relative and the chunked top-k's values equal torch.topk's.

    python tools/gpu/sampling_kernels_bench.py    # on the GPU machine, from the repository root
"""

from __future__ import annotations

import functools
import json

import torch

from spectest.sampling import kernels


def timed(fn, reps: int = 10) -> float:  # type: ignore[no-untyped-def]
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps  # ms


def chunked_topk(x: torch.Tensor, W: int, chunks: int) -> torch.Tensor:
    N, V = x.shape
    c = -(-V // chunks)
    pad = torch.full((N, c * chunks - V), float("-inf"), device=x.device, dtype=x.dtype)
    xs = torch.cat([x, pad], -1).view(N, chunks, c)
    v, i = torch.topk(xs, W, dim=-1, sorted=False)  # [N, C, W]
    i = i + (torch.arange(chunks, device=x.device) * c)[None, :, None]
    _, j = torch.topk(v.reshape(N, -1), W, dim=-1, sorted=False)
    return i.reshape(N, -1).gather(-1, j)


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    V, W = 151_936, 1024
    for N in (1024, 5120):
        x = torch.randn(N, V, device="cuda", generator=g) * 3
        t = torch.full((N,), 0.8, dtype=torch.float64, device="cuda")
        mx = x.amax(-1, keepdim=True).to(torch.float64)
        ref = kernels.weight_sum_reference(x, t, mx)
        got = kernels.weight_sum(x, t, mx)
        rel = float(((got - ref) / ref).abs().max())
        a = torch.topk(x, W, dim=-1).values.sort(-1).values
        rec = {"N": N, "V": V, "weight_sum_rel_err": rel}
        rec["topk_ms"] = timed(functools.partial(torch.topk, x, W, dim=-1, sorted=False))
        for C in (8, 16, 32):
            ids = chunked_topk(x, W, C)
            same = torch.equal(x.gather(-1, ids).sort(-1).values, a)
            rec[f"chunked_topk_{C}_ms"] = timed(functools.partial(chunked_topk, x, W, C))
            rec[f"chunked_topk_{C}_same_values"] = same
        ref_fn = functools.partial(kernels.weight_sum_reference, x, t, mx)
        rec["weight_sum_reference_ms"] = timed(ref_fn)
        rec["weight_sum_kernel_ms"] = timed(functools.partial(kernels.weight_sum, x, t, mx))
        print(json.dumps(rec))
        assert rel <= 1e-12


if __name__ == "__main__":
    main()
