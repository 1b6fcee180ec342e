"""Time ``power.cross_fitted_top_counts`` (the cells family's testability counts, all positions
at once) against its one-position-at-a-time reference ``cross_fitted_top_counts_loop`` on every
cell of a stored run (its reference vs its candidate arm), in one process, alternating; their
outputs are asserted equal first. Appends one JSON line (ms for all the cells of one comparison,
per rep) to ``--out``.

    python tools/bench_cross_fitted.py RUN_DIR [--reps 5] [--out results/bench/FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from spectest.stats import power
from spectest.store import SAMPLES
from spectest.stored import load_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    s = load_run(args.run_dir).table(SAMPLES)
    assert s is not None, "no samples"
    s = s[s["arm"].isin(["reference", "candidate"])]
    cells = []
    for _, g in s.groupby(["prompt_id", "config_id"]):
        w = g.pivot_table(
            index=["arm", "seed"], columns="position", values="token_id", aggfunc="first"
        )
        w = w.fillna(-1).astype(np.int64)  # [seeds of both arms, T]; -1 = no token
        cells.append((w.loc["reference"].to_numpy(), w.loc["candidate"].to_numpy()))
    fns = {"loop": power.cross_fitted_top_counts_loop, "vectorized": power.cross_fitted_top_counts}
    for r, c in cells:
        for x, y in zip(fns["loop"](r, c), fns["vectorized"](r, c), strict=True):
            assert np.array_equal(x, y)
    ms: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            for r, c in cells:
                fn(r, c)
            ms[name].append(round((time.perf_counter() - t) * 1e3, 2))
    rec = {"bench": "cross_fitted_top_counts", "run": str(args.run_dir), "cells": len(cells)}
    rec |= {"cell_shape": list(cells[0][0].shape), "ms_per_comparison": ms}
    print(json.dumps(rec))
    if args.out:
        with Path(args.out).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
