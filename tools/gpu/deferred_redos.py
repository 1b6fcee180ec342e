"""How often the deferred shortlist reads redo a chunk at P1's sampling configs (issue 32).

Seed 001's plan (protocols/openinfer-512.yaml: one-hot drafter, K = 4, 32 positions, its three
configs) at P1's pair in bfloat16 on the fast engine: per config, the reference arm (plain) and
the exact candidate (speculative), ``--rows`` rows in one batch with white-box columns, each
timed with the reads deferred (the default on CUDA) and read at once, side by side; prints the
chunks run deferred and redone (docs/internals.md "Deferred shortlist reads") and both walls.

    PYTHONPATH=. python tools/gpu/deferred_redos.py [--rows 768]
    (``--device cpu --rows 2 --positions 4``: a smoke test; nothing defers on CPU)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from spectest import bench
from spectest.engines import builtin
from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec
from spectest.engines.fast import FastEngine
from spectest.models.zoo import load_pair
from spectest.sampling import pipeline as pipeline_mod
from spectest.sampling.params import SamplingParams

CONFIGS = {
    "t0.8-p0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "t1.0-k50": SamplingParams(temperature=1.0, top_k=50),
    "t0.7-k20-p0.9": SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
}
RUNS: list[bool] = []  # per chunk run: deferred or not


def _counting(inner: Any) -> Any:
    def run(pipeline: Any, device: Any, defer: bool, fn: Any) -> Any:
        def counted(pipe: Any) -> Any:
            RUNS.append(pipe.deferred is not None)
            return fn(pipe)

        return inner(pipeline, device, defer, counted)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=768)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    builtin.deferred_first = _counting(builtin.deferred_first)  # type: ignore[assignment]
    dtype = "bfloat16" if a.device.startswith("cuda") else None
    target, draft = load_pair(
        "realistic:qwen3-0.6b", "derived:first_layers,layers=4", device=a.device, dtype=dtype
    )
    engine = FastEngine(None, Models(target, draft))
    cfg = bench.BenchConfig(device=a.device)
    prompt, _ = bench.bench_prompt(cfg, target.vocab_size)
    on = pipeline_mod.DEFER_ON
    for name, params in CONFIGS.items():
        rows = tuple(RowSpec(name, s, params) for s in range(a.rows))
        for variant in (None, "exact"):
            job = ArmJob(
                "arm", "candidate" if variant else "reference", variant, "p", prompt, rows,
                a.positions, 1, a.rows, DrafterSpec(onehot=True, k=4), True,
            )  # fmt: skip
            engine.generate(job)  # warm: graphs at this batch
            walls: dict[str, list[str]] = {}
            deferred_runs: list[bool] = []
            for mode in ("deferred", "sync", "deferred", "sync"):
                pipeline_mod.DEFER_ON = on if mode == "deferred" else frozenset()
                RUNS.clear()
                bench._sync(a.device)
                t = time.perf_counter()
                engine.generate(job)
                bench._sync(a.device)
                walls.setdefault(mode, []).append(f"{time.perf_counter() - t:.3f}")
                if mode == "deferred":
                    deferred_runs = list(RUNS)
            pipeline_mod.DEFER_ON = on
            print(
                f"{name} {'spec' if variant else 'plain'}: chunk runs (True: deferred) "
                f"{deferred_runs}; walls s: deferred {walls['deferred']}, sync {walls['sync']}"
            )


if __name__ == "__main__":
    main()
