"""Time one protocol in this process, then on a pool of 1 and of N persistent worker processes,
each cold and again on the kept pool (the N pool once more with ``analysis_procs=N``); check
every run's tables equal the in-process run's; print one JSON line per run (wall, phase times, each
worker's start / load / generate / wall).

    python tools/bench_pool.py protocols/ci.yaml --devices cpu,cpu --set prompts.limit=2 \
        --out results/bench/pool_cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from spectest.protocol import load_protocol
from spectest.runner import RunOptions, run_protocol
from spectest.scaleout import ProcessPool


def tables(run_dir: Path) -> dict[str, pd.DataFrame]:
    return {
        n: pd.read_parquet(run_dir / f"{n}.parquet") for n in ("samples", "rounds", "histograms")
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--devices", default="cpu,cpu")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fast", action="store_true", help="RunOptions(fast=True) for every run")
    a = ap.parse_args()
    devices = a.devices.split(",")
    protocol = load_protocol(a.config, sets=a.set)
    records = []
    with tempfile.TemporaryDirectory() as tmp:

        def timed(label: str, **kw: object) -> None:
            t0 = time.perf_counter()
            res = run_protocol(protocol, out=Path(tmp) / label, **kw)  # type: ignore[arg-type]
            wall = time.perf_counter() - t0
            same = label == "in-process" or all(
                t.equals(tables(res.run_dir)[n]) for n, t in base.items()
            )
            rec = {
                "run": label, "wall_s": round(wall, 2), "identical": same,
                "timings": res.summary["timings"], "shards": res.shards_generated,
            }  # fmt: skip
            records.append(rec)
            print(json.dumps(rec), flush=True)

        timed("in-process", options=RunOptions(fast=a.fast))
        base = tables(Path(tmp) / "in-process")
        for n in (1, len(devices)):
            with ProcessPool(devices[:n]) as pool:
                opts = RunOptions(fast=a.fast)
                timed(f"pool-{n}", pool=pool, options=opts)  # cold: spawn, imports, model load
                timed(f"pool-{n}-kept", pool=pool, options=opts)  # warm: same workers, models
                if n > 1:
                    opts = RunOptions(fast=a.fast, analysis_procs=n)
                    timed(f"pool-{n}-kept-analysis-procs", pool=pool, options=opts)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with a.out.open("a") as f:
            for r in records:
                f.write(json.dumps({"config": a.config, "sets": a.set, **r}) + "\n")


if __name__ == "__main__":
    main()
