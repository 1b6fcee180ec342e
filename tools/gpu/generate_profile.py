"""Where P1's ``generate`` phase goes (issue 32): arms of the openinfer-512 plan for the first
``--prompts`` prompts on the fast engine (``generation.generate_shard``, as the runner calls it),
each arm run three times (cold: CUDA-graph captures; warm; warm under ``torch.profiler``).

Prints, per arm: cold, warm and profiled wall seconds, rows and tokens per second (warm), the
profiled run's CUDA time and the count of host-device syncs seen by the profiler
(``cudaStreamSynchronize`` / ``cudaMemcpyAsync`` device-to-host calls), then its ``--top``
kernels/ops by self CUDA time and by self CPU time. ``--stacks N``: the profiled run records
Python stacks and shapes, and the CUDA table groups ops by their innermost N frames and input
shapes instead (which call site makes each cast or full-vocabulary product). About 2 min on one
H200 at P1's models with ``--prompts 1``; runs on CPU too.

    PYTHONPATH=. python tools/gpu/generate_profile.py --arms reference,candidate --set \
      models.device=cuda --set batch_size=768 --set models.target=realistic:qwen3-0.6b \
      --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from spectest.generation import EngineSet, generate_shard, run_key
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--arms", default="reference,candidate")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--stacks", type=int, default=0)
    a = ap.parse_args()
    p = load_protocol(a.config, sets=a.set)
    plan = make_plan(p)
    arms = [plan.arm(n) for n in a.arms.split(",")]
    t0 = time.perf_counter()
    engines = EngineSet(p, arms, plan, fast=True)
    print(f"load {time.perf_counter() - t0:.1f} s")
    assert engines.models.target is not None
    prompts = dict(list(prompt_token_ids(p, engines.models.target.vocab_size).items())[: a.prompts])
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    stacks = {}
    if a.stacks:  # verbose: the events keep their Python stacks
        verbose = torch._C._profiler._ExperimentalConfig(verbose=True)
        stacks = {"with_stack": True, "record_shapes": True, "experimental_config": verbose}
    for arm in arms:
        walls = []
        for label in ("cold", "warm", "profiled"):
            prof = profile(activities=activities, **stacks) if label == "profiled" else None
            _sync()
            t0 = time.perf_counter()
            if prof is not None:
                prof.__enter__()
            rows = 0
            for pid, ids in prompts.items():
                s, _ = generate_shard(p, arm, pid, ids, engines, run_key(p), lambda n: None)
                rows += int(s[["config_id", "seed"]].drop_duplicates().shape[0])
            _sync()
            if prof is not None:
                prof.__exit__(None, None, None)
            walls.append(time.perf_counter() - t0)
        ev = prof.key_averages()
        syncs = sum(
            e.count for e in ev if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize")
        )
        d2h = sum(e.count for e in ev if e.key == "cudaMemcpyAsync")
        cuda = sum(getattr(e, "self_device_time_total", 0.0) for e in ev) / 1e6
        print(
            f"== {arm.name}: cold {walls[0]:.2f} s, warm {walls[1]:.2f} s, profiled {walls[2]:.2f}"
            f" s, {rows} rows, {rows * p.positions / walls[1]:.0f} tokens/s warm; CUDA {cuda:.2f} s"
            f" profiled; syncs {syncs},"
            f" cudaMemcpyAsync {d2h}"
        )
        by = (
            prof.key_averages(group_by_input_shape=True, group_by_stack_n=a.stacks)
            if a.stacks
            else ev
        )
        print(by.table(sort_by="self_device_time_total", row_limit=a.top, max_name_column_width=60))
        print(ev.table(sort_by="self_cpu_time_total", row_limit=a.top, max_name_column_width=60))
    engines.close()


if __name__ == "__main__":
    main()
