"""The tooth-size phase of P1 by variant (issue 32), one variant per process (cuDNN's plan cache
and the allocator start cold, as in a run): every prompt of the plan, each prompt timed, the
total printed, the table saved (``--save``) and compared with another variant's (``--against``:
the largest |d tv| and whether the statuses match).

Variants: ``old`` (forwards of FORWARD_ROWS, cuDNN attention allowed: the tree before issue 32),
``rows`` (batched forwards, cuDNN allowed), ``new`` (the default on CUDA: batched, no cuDNN),
``nocudnn`` (forwards of FORWARD_ROWS, no cuDNN).

    python tools/gpu/tooth_size_variants.py --variant new --set models.device=cuda --set ...
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import spectest.tooth_size as ts
from spectest.generation import load_models
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--variant", choices=["old", "rows", "new", "nocudnn"], default="new")
    ap.add_argument("--save")
    ap.add_argument("--against")
    a = ap.parse_args()
    p = load_protocol(a.config, sets=a.set)
    models = load_models(p, need_draft=True)
    target, draft = models.target, models.draft
    assert target is not None and draft is not None
    prompts = prompt_token_ids(p, target.vocab_size)
    teeth = list(make_plan(p).settings.sized_teeth)
    batched = a.variant in ("rows", "new")
    ts.AVOID_CUDNN_SDPA = a.variant in ("new", "nocudnn")
    if a.variant == "nocudnn":  # the unbatched path with the batched path's attention context
        ts.DEVICE_FORWARD_ROWS = ts.FORWARD_ROWS
        batched = True
    _sync()
    tables, times = [], []
    t0 = time.perf_counter()
    for pid, ids in prompts.items():
        t1 = time.perf_counter()
        tables.append(ts.tooth_sizes(target, draft, {pid: ids}, p.configs, teeth, p.drafter,
                                     p.positions, budget=p.teeth.size_budget,
                                     batched=batched))  # fmt: skip
        _sync()
        times.append(time.perf_counter() - t1)
    wall = time.perf_counter() - t0
    table = pd.concat(tables, ignore_index=True)
    print(f"{a.variant}: tooth sizes {len(prompts)} prompts x {len(p.configs)} configs in "
          f"{wall:.2f} s; per prompt {' '.join(f'{t:.2f}' for t in times)}; "
          f"statuses {table.status.value_counts().to_dict()}; "
          f"max tv {table.tv.max():.4f}")  # fmt: skip
    if a.save:
        table.to_parquet(a.save)
    if a.against:
        old = pd.read_parquet(a.against)
        d = (old["tv"] - table["tv"]).abs().max()
        same = old["status"].equals(table["status"])
        print(f"  vs {a.against}: max |d tv| {d:.3g}, same statuses {same}, "
              f"identical {old.equals(table)}")  # fmt: skip


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
