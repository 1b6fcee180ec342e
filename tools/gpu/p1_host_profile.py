"""Where P1's load and numerics phases spend their wall time (issue 32): the run's own calls,
each under cProfile (host) and, for numerics, torch.profiler (device), in one process.

Prints: the device; import times (torch, transformers, spectest); CUDA start; ``load`` (the
run's ``EngineSet`` at P1: model init, the fast engines) with its cProfile top 35 by cumulative
time; the matched arm's generation time; ``numerics`` (``generation.matched_drift``, as the run
times it) cold then warm, each with its cProfile top 35 / 20. ``--out DIR`` also writes the full
pstats files there. ``--cuda-table``: the warm pass under torch.profiler too, with its top 25
kernels by self CUDA time (at P1 that did not finish in 240 s: results/LOG.md "lead (session
18)"; use it on fewer prompts). ``--load-only``: stop after the load.

    PYTHONPATH=. python tools/gpu/p1_host_profile.py --out $OUT/prof --set models.device=cuda \
      --set batch_size=768 --set models.target=realistic:qwen3-0.6b \
      --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

t_start = time.perf_counter()
import torch  # noqa: E402

t_torch = time.perf_counter()
import transformers  # noqa: E402, F401

t_tf = time.perf_counter()
import pandas as pd  # noqa: E402

from spectest.generation import (  # noqa: E402
    EngineSet,
    generate_shard,
    matched_drift,
    run_key,
)
from spectest.plan import make_plan  # noqa: E402
from spectest.prompts import prompt_token_ids  # noqa: E402
from spectest.protocol.load import load_protocol  # noqa: E402

t_spec = time.perf_counter()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _profiled(name: str, fn: Any, out: Path | None, top: int = 35) -> Any:
    """``fn()`` under cProfile, timed (synchronised); prints the top ``top`` by cumulative."""
    prof = cProfile.Profile()
    _sync()
    t0 = time.perf_counter()
    prof.enable()
    result = fn()
    _sync()
    prof.disable()
    print(f"== {name}: {time.perf_counter() - t0:.2f} s", flush=True)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top)
    print(s.getvalue(), flush=True)
    if out is not None:
        prof.dump_stats(str(out / f"{name.replace(' ', '_')}.pstats"))
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cuda-table", action="store_true", help="torch.profiler on the warm pass")
    ap.add_argument("--load-only", action="store_true", help="stop after the load's profile")
    a = ap.parse_args()
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
    print(f"imports: torch {t_torch - t_start:.2f} s, transformers {t_tf - t_torch:.2f} s, "
          f"spectest {t_spec - t_tf:.2f} s", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")
        print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    print(f"CUDA start: {time.perf_counter() - t0:.2f} s", flush=True)
    p = load_protocol(a.config, sets=a.set)
    plan = make_plan(p)
    arms = list(plan.arms)
    engines = _profiled("load", lambda: EngineSet(p, arms, plan, fast=True), a.out)
    if a.load_only:
        engines.close()
        return 0
    models: Any = engines.models
    prompts = prompt_token_ids(p, models.target.vocab_size, (models.target, models.draft))
    matched = plan.arm("matched")
    t0 = time.perf_counter()
    parts = [
        generate_shard(p, matched, pid, ids, engines, run_key(p), lambda n: None)
        for pid, ids in prompts.items()
    ]
    _sync()
    print(f"== matched arm, {len(prompts)} prompts: {time.perf_counter() - t0:.1f} s", flush=True)
    samples = pd.concat([s for s, _ in parts], ignore_index=True)
    rounds = pd.concat([r for _, r in parts if r is not None], ignore_index=True)

    def drift() -> pd.DataFrame:
        return matched_drift(p, samples, rounds, models, fast=True)

    cold = _profiled("numerics cold", drift, a.out)
    if not a.cuda_table:
        warm = _profiled("numerics warm", drift, a.out, top=20)
    else:
        from torch.profiler import ProfilerActivity, profile

        cuda = torch.cuda.is_available()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as tp:
            warm = _profiled("numerics warm", drift, a.out, top=20)
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(tp.key_averages().table(sort_by=key, row_limit=25), flush=True)
    print("warm table equals cold:", bool(warm.equals(cold)), flush=True)
    engines.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
