"""One tree's side of ``tools/gpu/generate_ab.sh`` (issue 32): P1's generate phase for one
prompt-batch, arm by arm, on the tree ``spectest`` is imported from (``PYTHONPATH``).

For each arm (default: reference, candidate) of the openinfer-512 plan at P1's settings (fast
engine, one prompt = 768 rows of 32 positions): a cold run (CUDA-graph captures), two warm runs
(the best wall printed, and whether the two gave equal samples and rounds), then one run under
``torch.profiler`` counting the host's CUDA calls (kernel launches, graph launches, stream syncs,
memcpys). Writes each arm's warm samples (white-box columns included) and rounds to
``OUT/LABEL/ARM.{samples,rounds}.parquet`` for the comparison. Runs on CPU too (tiny, for a
smoke test: ``--set models.device=cpu``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from spectest.generation import EngineSet, generate_shard, run_key
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol

CALLS = ("cudaLaunchKernel", "cudaGraphLaunch", "cudaStreamSynchronize", "cudaMemcpyAsync")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--arms", default="reference,candidate")
    ap.add_argument("--no-profile", action="store_true")
    a = ap.parse_args()
    out = Path(a.out) / a.label
    out.mkdir(parents=True, exist_ok=True)
    p = load_protocol(a.config, sets=a.set)
    plan = make_plan(p)
    arms = [plan.arm(n) for n in a.arms.split(",")]
    t0 = time.perf_counter()
    engines = EngineSet(p, arms, plan, fast=True)
    assert engines.models.target is not None
    pid, ids = next(iter(prompt_token_ids(p, engines.models.target.vocab_size).items()))
    print(f"[{a.label}] load {time.perf_counter() - t0:.1f} s, prompt {pid}", flush=True)

    def run() -> tuple[float, object, object]:
        _sync()
        t = time.perf_counter()
        s, r = generate_shard(p, arm, pid, ids, engines, run_key(p), lambda n: None)
        _sync()
        return time.perf_counter() - t, s, r

    for arm in arms:
        cold, _, _ = run()
        (w1, s, r), (w2, s2, r2) = run(), run()
        same = s.equals(s2) and (r is None or r.equals(r2))  # run-to-run determinism
        s.to_parquet(out / f"{arm.name}.samples.parquet")
        if r is not None:
            r.to_parquet(out / f"{arm.name}.rounds.parquet")
        counts = ""
        if not a.no_profile and torch.cuda.is_available():
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run()
            ev = {e.key: e.count for e in prof.key_averages() if e.key in CALLS}
            counts = "; " + ", ".join(f"{k} {ev.get(k, 0)}" for k in CALLS)
        print(
            f"[{a.label}] {arm.name}: cold {cold:.2f} s, warm {min(w1, w2):.2f} s"
            f" ({w1:.2f}, {w2:.2f}), warm runs equal: {same}{counts}",
            flush=True,
        )
    engines.close()


if __name__ == "__main__":
    main()
