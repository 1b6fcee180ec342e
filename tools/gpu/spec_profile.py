"""Where the fast arms' device time goes, by the Python line that launched it (issue 32, P2).

Runs ``spectest bench``'s fast arms (default: fast-spec and fast-plain at 1024 rows, the sampled
drafter, P2's pair in bfloat16) with its ``--profile`` step replaced by a profile with Python
stacks, and prints per arm: the profiled wall and CUDA time, the CUDA time inside CUDA-graph
replays (the model forwards) against the rest (sampling, commits, caches), and the ``--top`` ops
by self CUDA time grouped by their innermost ``--frames`` Python frames, so a kernel outside the
graphs is named by the code that launched it.

    PYTHONPATH=. python tools/gpu/spec_profile.py [--rows 1024] [--arms fast-spec,fast-plain]
    (``--device cpu --rows 2``: a smoke test anywhere)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from spectest import bench


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--arms", default="fast-spec,fast-plain")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    def stacked(fn: Any, device: str, path: Path) -> str:
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True
        ) as prof:
            t = time.perf_counter()
            fn()
            bench._sync(device)
            wall = time.perf_counter() - t
        events = prof.key_averages()
        total = sum(e.self_device_time_total for e in events) / 1e3
        graphs = sum(
            e.device_time_total for e in events if e.key == "cudaGraphLaunch"
        ) / 1e3  # fmt: skip
        table = prof.key_averages(group_by_stack_n=a.frames).table(
            sort_by="self_cuda_time_total", row_limit=a.top, max_src_column_width=140
        )
        return (
            f"profile of {path.name}: wall {wall:.3f} s (profiled), CUDA {total:.1f} ms, of which "
            f"in graph replays {graphs:.1f} ms\n{table}"
        )

    bench._profile = stacked  # type: ignore[assignment]
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
