"""Where the fast arms' device time goes, op by op and by input shape (issue 32, P2).

Runs ``spectest bench``'s fast arms (default: fast-spec and fast-plain at 1024 rows, the sampled
drafter, P2's pair in bfloat16) with its ``--profile`` step replaced by one that records input
shapes, and prints per arm the profiled wall and CUDA time, then the ``--top`` ops and kernels by
self CUDA time, grouped by input shape (so a full-vocabulary pass shows its ``[N, V]``). Kernels
replayed inside CUDA graphs appear by name without a launching op.

    PYTHONPATH=. python tools/gpu/spec_profile.py [--rows 1024] [--arms fast-spec,fast-plain]
    (``--device cpu --rows 2``: a smoke test anywhere)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

from spectest import bench


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--arms", default="fast-spec,fast-plain")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    def shaped(fn: Any, device: str, path: Path) -> str:
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True
        ) as prof:
            t = time.perf_counter()
            fn()
            bench._sync(device)
            wall = time.perf_counter() - t
        events = prof.key_averages()
        total = sum(e.self_device_time_total for e in events) / 1e3
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cuda_time_total", row_limit=a.top, max_shapes_column_width=60
        )
        return f"profile of {path.name}: wall {wall:.3f} s (profiled), CUDA {total:.1f} ms\n{table}"

    bench._profile = shaped  # type: ignore[assignment]
    cfg = bench.BenchConfig(
        device=a.device,
        rows=a.rows,
        onehot=False,
        arms=tuple(a.arms.split(",")),
        baseline=False,
        profile="/tmp/spec_profile",
    )
    res = bench.run_bench(cfg, log=print)
    for arm in res.arms:
        print(arm.arm, f"{arm.rows_per_s:.1f} rows/s", arm.wall_s, arm.slowest_row_rounds)


if __name__ == "__main__":
    main()
