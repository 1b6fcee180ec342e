"""What one forward of the static model launches (issue 32): kernels per decode step, by name.

The floor rows of claim (b) are one-row forwards, latency-bound on their kernels' count (session
12: ~1 650 kernels, 4.3 ms a forward). This loads P1's target (``realistic:qwen3-0.6b`` in
bfloat16 on CUDA, as the fast engine does: ``StaticHFModel`` with its fused norms, rotary and
attention kernel), prefills a ``--prompt``-token prompt (36: P2's) for each ``--rows`` batch and
runs one eager decode step under ``torch.profiler``, then prints per batch size: the kernel
count, the CUDA time, and the kernels grouped by name (count and total µs), most frequent
first. Then the same step as a CUDA-graph replay, timed over ``--repeat`` replays (median ms a
forward), with the attention kernel's shared prompt reads on and off (``static.SHARED_READS``).

    PYTHONPATH=. python tools/gpu/forward_kernels.py [--rows 1,768] [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile

from spectest.models import static
from spectest.models.static import StaticHFModel
from spectest.models.zoo import load_model


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _step(model: StaticHFModel, rows: int, L: int) -> tuple[object, torch.Tensor]:
    prompt = torch.arange(3, 3 + L, device=model.device)
    cache, _ = model.prefill_shared(prompt, rows)
    ids = torch.full((rows, 1), 7, dtype=torch.int64, device=model.device)
    return cache, ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,768")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--target", default="realistic:qwen3-0.6b")
    ap.add_argument("--prompt", type=int, default=36)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    target = load_model(a.target, device=a.device, dtype=a.dtype, seed=0)
    model = StaticHFModel(target, max_slots=64)
    print(
        f"fused norms {model.fused_norms}, rotary {model.fused_rotary}, "
        f"attention kernel {model.decode_kernel}, layers {model._layers}"
    )
    # on CPU (a smoke test) the aten ops stand for kernels, nested ones included
    cuda = torch.cuda.is_available()
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    for rows in (int(r) for r in a.rows.split(",")):
        cache, ids = _step(model, rows, a.prompt)
        model._forward(cache, ids, graphs=False)  # warm: Triton compiles, cuBLAS heuristics
        cache, ids = _step(model, rows, a.prompt)
        _sync()
        with profile(activities=[activity]) as prof:
            model._forward(cache, ids, graphs=False)
            _sync()
        kernels: dict[str, list[float]] = collections.defaultdict(list)
        for e in prof.events():
            if e.device_type == kind and (cuda or e.name.startswith("aten::")):
                kernels[e.name[:90]].append(e.device_time)
        n = sum(len(v) for v in kernels.values())
        us = sum(sum(v) for v in kernels.values())
        print(f"== rows {rows}: {n} kernels ({n / model._layers:.1f} a layer), {us:.0f} µs of CUDA")
        top = sorted(kernels.items(), key=lambda kv: (-len(kv[1]), -sum(kv[1])))[: a.top]
        for name, v in top:
            print(f"{len(v):6d} {sum(v):9.1f} µs  {name}")
        for shared in (True, False):
            static.SHARED_READS = shared
            m = StaticHFModel(target, max_slots=96)
            cache, ids = _step(m, rows, a.prompt)
            m.forward(cache, ids)  # capture
            times = []
            for _ in range(a.repeat):
                cache, ids = _step(m, rows, a.prompt)
                _sync()
                t = time.perf_counter()
                m.forward(cache, ids)
                _sync()
                times.append(time.perf_counter() - t)
            times.sort()
            ms = 1e3 * times[len(times) // 2]
            print(f"   graph replay, shared reads {shared}: median {ms:.3f} ms a forward")
        static.SHARED_READS = True


if __name__ == "__main__":
    main()
