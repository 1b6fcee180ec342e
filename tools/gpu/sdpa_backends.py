"""Which SDPA backend the fast engine's static model should run (issue 32): the static model's
attention call, ``models.attention.packed_gqa_sdpa`` (query heads packed onto their key/value
head, mask expanded, output transposed), at the shapes P1 and P2 run, timed per backend (cuDNN,
memory-efficient, math, and torch's own choice) with CUDA events, and beside them the Triton
kernel of ``models/decode_attention.py`` (``triton``: ``packed_gqa_sdpa`` under
``attention.decode_kernel``, where it applies), with ``--tune`` also at other launch settings
(``triton bN wW``: ``block_n`` N, ``num_warps`` W).

Prints one line per (shape, backend): microseconds per call (median of ``--reps`` after a warm-up)
and the largest absolute difference from ``attention.repeat_kv_sdpa`` in float64. Shapes
(Qwen3-0.6B: 16 query heads on 8 key/value heads, head_dim 128, bfloat16, a boolean mask): the
batch-768 decode step (S = 1) and verify (K + 1 = 5) at 32 and 96 attended slots, the one-row floor
step, and a one-row 36-token prompt prefill. About 20 s on one H200; CUDA only. Session 13's answer
(results/LOG.md "lead (session 13)", measured before this tool called ``packed_gqa_sdpa``: bare
SDPA on inputs already in the packed layout): cuDNN and memory-efficient alike per call; the
static model on the efficient kernel measured 0.87x on P2's fast-spec, so it stays on torch's
choice.

    python tools/gpu/sdpa_backends.py [--reps 100] [--tune]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from spectest.models import decode_attention
from spectest.models.attention import decode_kernel, packed_gqa_sdpa, repeat_kv_sdpa

SHAPES = {  # name: (B, S, W)
    "decode B768 W32": (768, 1, 32),
    "decode B768 W96": (768, 1, 96),
    "verify B768 W96": (768, 5, 96),
    "floor B1 W64": (1, 1, 64),
    "prefill B1 L36": (1, 36, 64),
}
BACKENDS = {
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "math": [SDPBackend.MATH],
    "default": None,
}  # and "triton": packed_gqa_sdpa under decode_kernel(), where the kernel applies
TUNE = [(32, 4), (32, 8), (64, 4), (64, 8), (16, 4)]  # (block_n, num_warps) besides (32, 2)


def _inputs(B: int, S: int, W: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn((B, h, n, 128), generator=g, device="cuda").to(torch.bfloat16)
        for h, n in ((16, S), (8, W), (8, W))
    )  # [B, Hq, S, D], [B, Hkv, W, D] twice
    valid = torch.rand((B, 1, 1, W), generator=g, device="cuda") < 0.8
    valid[..., 0] = True  # every query sees at least one slot
    return q, k, v, valid.expand(B, 1, S, W)  # [B, 1, S, W]


def _time(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--tune", action="store_true")
    a = ap.parse_args()
    print("torch", torch.__version__, torch.cuda.get_device_name())
    module = torch.nn.Module()  # neither function reads it
    for name, (B, S, W) in SHAPES.items():
        q, k, v, m = _inputs(B, S, W)
        ref, _ = repeat_kv_sdpa(module, q.double(), k.double(), v.double(), m)
        calls: dict[str, tuple[contextlib.AbstractContextManager[object], Callable[[], object]]]
        calls = {}
        call = functools.partial(packed_gqa_sdpa, module, q, k, v, m)
        for label, backends in BACKENDS.items():
            calls[label] = (sdpa_kernel(backends) if backends else contextlib.nullcontext(), call)
        if decode_attention.applies(q, k, v, m):
            calls["triton"] = (decode_kernel(), call)
        if a.tune and decode_attention.applies(q, k, v, m):
            for bn, nw in TUNE:
                fn = functools.partial(
                    decode_attention.gqa_decode, q, k, v, m, 128**-0.5, block_n=bn, num_warps=nw
                )
                calls[f"triton b{bn} w{nw}"] = (contextlib.nullcontext(), lambda f=fn: (f(), None))
        for label, (ctx, call) in calls.items():
            try:
                with ctx, torch.no_grad():
                    for _ in range(3):
                        out, _ = call()
                    us = _time(call, a.reps)
                err = float((out.double() - ref).abs().max())
                print(f"{name:18s} {label:15s} {us:9.1f} us/call  max|err| {err:.2e}")
            except RuntimeError as e:
                print(f"{name:18s} {label:15s} n/a ({str(e).splitlines()[0][:80]})")


if __name__ == "__main__":
    main()
