"""P1's two slow analysis phases (issue 32), old path against new, side by side in ONE process on
the same models and the same matched arm: ``numerics`` (``generation.matched_drift``, as the
runner times it) with the floor rows one at a time (old: ``numerics.alone.FLOOR_STREAMS = 1``)
and ``--streams`` (default 8) at once (new), and ``tooth sizes``
(``generation.protocol_tooth_sizes``) one prompt at a time (old: ``tooth_size.PROMPT_THREADS =
1``) and ``PROMPT_THREADS`` at once (new). Each phase runs old, new, old, new (the first pair
includes CUDA-graph captures and cuDNN plans, the second is warm); every table must equal the
first old one (``DataFrame.equals``), else the script exits 1.

Prints: the device, load and matched-arm generation times, then one line per phase run —
``numerics old|new: S s (N rows, floor rows F, identical)`` and ``tooth sizes old|new: S s (N
rows, identical)`` — and a summary line per phase with the warm old/new ratio. About 3 min on one
H200 at P1 (seed 001's bf16 plan, 8 prompts, batch 768); runs on CPU too (slowly).
``--streams N`` / ``--threads N``: the new path's floor rows / prompts at once (defaults: 8 / the
package's); ``--only numerics|tooth``: one phase.

    PYTHONPATH=. python tools/gpu/issue32_phases.py --set models.device=cuda \
      --set batch_size=768 --set models.target=realistic:qwen3-0.6b \
      --set "models.draft=derived:first_layers,layers=4" --set models.dtype=bfloat16
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from spectest import tooth_size
from spectest.generation import (
    EngineSet,
    generate_shard,
    matched_drift,
    protocol_tooth_sizes,
    run_key,
)
from spectest.numerics import alone
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Callable[[], pd.DataFrame]) -> tuple[float, pd.DataFrame]:
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def _phase(name: str, fn: Callable[[], pd.DataFrame], set_old: Callable[[bool], None]) -> bool:
    """old, new, old, new; prints each and the warm ratio; True when every table is the same."""
    first: pd.DataFrame | None = None
    times: dict[str, list[float]] = {"old": [], "new": []}
    same = True
    for label in ("old", "new", "old", "new"):
        set_old(label == "old")
        sec, table = _timed(fn)
        first = table if first is None else first
        equal = bool(table.equals(first))
        same &= equal
        times[label].append(sec)
        extra = ""
        if "floor_tv" in table.columns:
            extra = f", floor values {int(table['floor_tv'].notna().sum())}"
        verdict = "identical" if equal else "DIFFERENT from the first old table"
        print(f"{name} {label}: {sec:.2f} s ({len(table)} rows{extra}, {verdict})", flush=True)
    old, new = times["old"][-1], times["new"][-1]
    print(f"== {name}: warm old {old:.2f} s -> new {new:.2f} s ({old / new:.2f}x); "
          f"cold {times['old'][0]:.2f} -> {times['new'][0]:.2f}; "
          f"tables {'IDENTICAL' if same else 'DIFFER'}", flush=True)  # fmt: skip
    return same


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--streams", type=int, default=8, help="new: floor rows at once")
    ap.add_argument("--threads", type=int, default=tooth_size.PROMPT_THREADS, help="new: prompts")
    ap.add_argument("--only", choices=("numerics", "tooth"), default=None)
    a = ap.parse_args()
    if torch.cuda.is_available():
        print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    p = load_protocol(a.config, sets=a.set)
    plan = make_plan(p)
    matched = plan.arm("matched")
    t0 = time.perf_counter()
    engines = EngineSet(p, [matched], plan, fast=True)
    models: Any = engines.models
    print(f"load {time.perf_counter() - t0:.1f} s", flush=True)
    prompts = prompt_token_ids(p, models.target.vocab_size, (models.target, models.draft))
    t0 = time.perf_counter()
    parts = [
        generate_shard(p, matched, pid, ids, engines, run_key(p), lambda n: None)
        for pid, ids in prompts.items()
    ]
    print(f"matched arm, {len(prompts)} prompts: {time.perf_counter() - t0:.1f} s", flush=True)
    samples = pd.concat([s for s, _ in parts], ignore_index=True)
    rounds = pd.concat([r for _, r in parts if r is not None], ignore_index=True)
    streams, threads = a.streams, a.threads

    def floor_streams(old: bool) -> None:
        alone.FLOOR_STREAMS = 1 if old else streams

    def prompt_threads(old: bool) -> None:
        tooth_size.PROMPT_THREADS = 1 if old else threads

    print(f"new: FLOOR_STREAMS {streams}, PROMPT_THREADS {threads}", flush=True)
    teeth = list(plan.settings.sized_teeth)
    ok = True
    if a.only != "tooth":
        drift = lambda: matched_drift(p, samples, rounds, models, fast=True)  # noqa: E731
        ok &= _phase("numerics", drift, floor_streams)
    if a.only != "numerics":
        sizes = lambda: protocol_tooth_sizes(p, teeth, models)  # noqa: E731
        ok &= _phase("tooth sizes", sizes, prompt_threads)
    engines.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
