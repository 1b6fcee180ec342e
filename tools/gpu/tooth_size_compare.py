"""The tooth-size phase, the fast path against its slow reference (issue 24), side by side in
one process: ``tooth_sizes(..., reference=True)`` then the fast one (or alternately, ``--rounds``),
for a protocol's plan at any shape (``--set`` overrides); prints each wall time, the speed-up,
and the largest difference of ``tv`` / ``slack`` and whether the tables are identical. Exit 1
when the statuses differ, or when the TVs differ beyond ``--tol`` (0: bit for bit).

    python tools/gpu/tooth_size_compare.py --config protocols/top_p.yaml
"""

from __future__ import annotations

import argparse
import sys
import time

from spectest.generation import load_models
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol
from spectest.tooth_size import tooth_sizes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/top_p.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--prompts", type=int, default=0, help="first n prompts (0: all)")
    ap.add_argument("--rounds", type=int, default=1, help="reference/fast pairs, alternately")
    ap.add_argument("--tol", type=float, default=0.0)
    a = ap.parse_args()
    p = load_protocol(a.config, sets=a.set)
    t0 = time.perf_counter()
    models = load_models(p, need_draft=True)
    target, draft = models.target, models.draft
    print(f"load {time.perf_counter() - t0:.1f} s; target {target.name}; device {target.device}")
    prompts = prompt_token_ids(p, target.vocab_size)
    if a.prompts:
        prompts = dict(list(prompts.items())[: a.prompts])
    teeth = list(make_plan(p).settings.sized_teeth)
    walls: dict[bool, list[float]] = {True: [], False: []}
    tables = {}
    for _ in range(a.rounds):
        for ref in (True, False):
            _sync(target)
            t0 = time.perf_counter()
            tables[ref] = tooth_sizes(target, draft, prompts, p.configs, teeth, p.drafter,
                                      p.positions, budget=p.teeth.size_budget,
                                      reference=ref)  # fmt: skip
            _sync(target)
            walls[ref].append(time.perf_counter() - t0)
    old, new = tables[True], tables[False]
    d_tv = (old["tv"] - new["tv"]).abs().max()
    d_sl = (old["slack"] - new["slack"]).abs().max()
    same = old.equals(new)
    w_old, w_new = min(walls[True]), min(walls[False])
    print(f"tooth sizes: {len(prompts)} prompts x {len(p.configs)} configs x {len(teeth)} teeth, "
          f"{len(new)} rows; reference {_fmt(walls[True])} s, fast {_fmt(walls[False])} s; "
          f"best {w_old:.2f} / {w_new:.2f} s = {w_old / w_new:.2f}x")  # fmt: skip
    print(f"identical tables: {same}; max |d tv| {d_tv:.3g}, max |d slack| {d_sl:.3g}; "
          f"statuses {new.status.value_counts().to_dict()}")  # fmt: skip
    bad = not old["status"].equals(new["status"]) or not (d_tv <= a.tol)
    return 1 if bad else 0


def _fmt(xs: list[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in xs)


def _sync(model: object) -> None:
    import torch

    if torch.device(model.device).type == "cuda":  # type: ignore[attr-defined]
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
