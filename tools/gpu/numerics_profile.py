"""Where P1's ``numerics`` phase goes (issue 32): the matched arm of the openinfer-512 plan for the
first ``--prompts`` prompts generated on the fast engine, then ``numerics.drift_table`` on it
(``--fast`` replay) twice — cold (CUDA-graph captures included) and warm — with each step timed
(device-synchronised wall time of the verify replay, the batch decode, the floor decodes, the TVs)
and the warm pass's top functions by own time (cProfile). Prints those tables, and any CUDA-graph
capture that fails, with its traceback; runs on CPU too.
``--streams 1``: the floor rows one at a time (timed as ``decode_logits (alone)``); by default
on CUDA a prompt's floor rows run as the branches of one CUDA graph per step
(``numerics.alone.FloorBranches``), inside ``measure_drift``'s time; ``--no-branches``: one at a
time, or ``--streams N`` (> 1) at once on streams.
``--no-beside``: a batch's floor rows after its batch decode, not beside it
(``numerics.decode.FLOOR_BESIDE_BATCH``; ``_decode_beside_alone`` times the two together).
``--kept``: the matched arm keeps claim (b)'s rows at generation (``EngineSet(capture=True)``, as
a run does) and the table reads them: ``_verify_logits`` then does not appear.
``--row-profile N``: then N floor rows of the first prompt decoded alone on the replay model, the
wall per one-row forward and the same rows under ``torch.profiler`` (device time per forward, top
kernels): host-bound or device-bound (session 20: 2.5 ms wall, 2.2 ms device at 0.6B).

    python tools/gpu/numerics_profile.py --prompts 2 --set models.device=cuda --set ...
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from spectest.generation import EngineSet, generate_shard, run_key
from spectest.numerics import decode
from spectest.numerics import table as numerics
from spectest.numerics.alone import FloorBranches
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol

TIMES: dict[str, float] = defaultdict(float)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        key = f"{name} (alone)" if name == "decode_logits" and a[2].shape[0] == 1 else name
        _sync()
        t0 = time.perf_counter()
        out = fn(*a, **k)
        _sync()
        TIMES[key] += time.perf_counter() - t0
        return out

    return wrapper


def _free() -> None:
    """Free the last pass's replay model before the next makes its own, and return its pools
    (~22 GB at P1) to the device: on an H100 the warm pass ran out of memory without this
    (results/LOG.md "lead (session 26)", when the model's own worker list kept it in a cycle;
    session 27 removed the cycle). Not yet run on the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _log_graph_errors() -> None:
    """Print every failed CUDA-graph capture with its traceback (``StaticHFModel._graph`` turns
    graphs off silently, keeping the reason in ``graph_error``). Session 11 suspected a failed
    capture behind the 8-stream floor's stall; session 13 saw none (results/LOG.md)."""
    import traceback

    from spectest.models import static

    init = static._Graph.__init__

    def logged(self: Any, model: Any, B: int, S: int, W: int) -> None:
        try:
            init(self, model, B, S, W)
        except Exception:
            print(f"GRAPH CAPTURE FAILED (B={B}, S={S}, W={W}):", flush=True)
            traceback.print_exc()
            raise

    static._Graph.__init__ = logged  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--streams", type=int, default=None, help="floor rows at once (None: default)")
    ap.add_argument("--no-branches", action="store_true", help="floor rows not as graph branches")
    ap.add_argument("--row-profile", type=int, default=0, help="N floor rows profiled")
    ap.add_argument("--kept", action="store_true", help="the verify logits kept at generation")
    ap.add_argument("--no-beside", action="store_true", help="floor rows after the batch decode")
    a = ap.parse_args()
    _log_graph_errors()
    decode.FLOOR_BESIDE_BATCH = not a.no_beside
    p = load_protocol(a.config, sets=a.set)
    plan = make_plan(p)
    matched = plan.arm("matched")
    t0 = time.perf_counter()
    engines = EngineSet(p, [matched], plan, fast=True, capture=a.kept)
    print(f"load {time.perf_counter() - t0:.1f} s")
    target = engines.models.target
    assert target is not None
    prompts = dict(list(prompt_token_ids(p, target.vocab_size).items())[: a.prompts])
    t0 = time.perf_counter()
    parts = [
        generate_shard(p, matched, pid, ids, engines, run_key(p), lambda n: None)
        for pid, ids in prompts.items()
    ]
    engines.close()
    print(f"matched arm, {len(prompts)} prompt(s): {time.perf_counter() - t0:.1f} s")
    samples = pd.concat([s for s, _ in parts], ignore_index=True)
    rounds = pd.concat([r for _, r in parts if r is not None], ignore_index=True)
    print("rounds per row: max", int(rounds.groupby(["config_id", "seed"]).size().max()))
    for name in ("_verify_logits", "_tvs", "_tv", "_flip", "measure_drift"):
        setattr(numerics, name, _timed(name, getattr(numerics, name)))
    for name in ("decode_logits", "_decode_beside_alone"):
        setattr(decode, name, _timed(name, getattr(decode, name)))
    FloorBranches.__call__ = _timed("floor branches", FloorBranches.__call__)  # type: ignore
    kw = dict(arm="matched", K=p.drafter.k, batch_size=p.batch_size, positions=p.positions)
    for label in ("cold", "warm"):
        TIMES.clear()
        _free()
        prof = cProfile.Profile()
        _sync()
        t0 = time.perf_counter()
        prof.enable()
        at_once = dict(streams=a.streams, branches=False if a.no_branches else None)
        table = numerics.drift_table(target, samples, rounds, prompts, p.configs, fast=True,
                                     verify=engines.verify, **at_once, **kw)  # type: ignore[arg-type]  # fmt: skip
        prof.disable()
        _sync()
        wall = time.perf_counter() - t0
        steps = ", ".join(f"{k} {v:.2f}" for k, v in TIMES.items())
        print(f"drift_table {label}: {wall:.2f} s for {len(table)} tokens; {steps}")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(20)
    print("\n".join(s.getvalue().splitlines()[:42]))
    if a.row_profile:
        pid = next(iter(prompts))
        row = samples[(samples["prompt_id"] == pid) & (samples["arm"] == "matched")]
        _row_profile(target, prompts[pid], row, a.row_profile)


def _row_profile(target: Any, prompt_ids: list[int], ps: pd.DataFrame, n: int) -> None:
    """One floor row decoded alone (``decode.decode_logits`` at batch 1 on the replay model),
    ``n`` rows: the wall per one-row forward, then the same rows under ``torch.profiler``: device
    time per forward and the top kernels. Tells a host-bound floor from a device-bound one."""
    from torch.profiler import ProfilerActivity, profile

    from spectest.numerics.replay import replay_model

    model = replay_model(target, fast=True)
    dev = model.device
    wide = ps.pivot_table(index=["config_id", "seed"], columns="position", values="token_id")
    toks = torch.tensor(wide.to_numpy()[: n + 2], dtype=torch.int64, device=dev)
    prompt = torch.tensor(prompt_ids, dtype=torch.int64, device=dev)
    keep = torch.zeros(1, dtype=torch.int64, device=dev)
    T = int(toks.shape[1])

    def rows(lo: int, hi: int) -> None:
        for r in range(lo, hi):
            decode.decode_logits(model, prompt, toks[r : r + 1], keep)

    rows(0, 2)  # captures
    _sync()
    t0 = time.perf_counter()
    rows(2, n + 2)
    _sync()
    wall = time.perf_counter() - t0
    print(f"floor rows alone: {n} rows, {wall:.3f} s, {1e3 * wall / (n * (T - 1)):.3f} ms/forward")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        rows(2, n + 2)
        _sync()
    ev = prof.key_averages()
    dev_us = sum(e.self_device_time_total for e in ev)
    print(f"profiled: device {dev_us / 1e3:.1f} ms = {dev_us / 1e3 / (n * (T - 1)):.3f} ms/forward")
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(ev.table(sort_by=key, row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
