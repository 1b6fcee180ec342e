"""Benchmark of ``spectest.stats.battery`` on ~10 million sampled tokens.

Workload (issue 3): 16 prompt-config cells × 32 positions × S seeds per arm × 2 arms, tokens iid
from a Zipf(1.5) law over 50 000 ids (entropy ≈ 3.2 nats, as in docs/statistics.md), both arms
from the same law. Default S = 10 000, i.e. 20 000 sequences per cell and 10.24 M tokens in total.
Included: encoding and validation of the samples table, per cell-position pooled χ², BH, TV
with its permutation null (B permutations), permutation p-values, the trie (depth 2, node χ² +
chain-rule G² under the same permutations). Excluded: white-box tests, building the DataFrame.
Records wall and CPU time to results/bench/stats_analyze.json (appends one record per run).

    OMP_NUM_THREADS=1 python benchmarks/bench_stats.py [--seeds 10000] [--perms 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.stats import AnalysisOptions, analyze
from spectest.stats.battery import MULTIPLICITY


def make_samples(
    n_seeds: int, n_cells: int = 16, n_pos: int = 32, vocab: int = 50_000, seed: int = 0
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, vocab + 1) ** 1.5
    cdf = np.cumsum(w / w.sum())
    n_seq = n_cells * 2 * n_seeds
    tokens = np.minimum(np.searchsorted(cdf, rng.random(n_seq * n_pos)), vocab - 1)  # [n_seq*T]
    seq = np.repeat(np.arange(n_seq), n_pos)
    cell = seq // (2 * n_seeds)
    arm = seq // n_seeds % 2
    prompts = np.array([f"prompt{c // 4}" for c in range(n_cells)], dtype=object)
    configs = np.array([f"config{c % 4}" for c in range(n_cells)], dtype=object)
    return pd.DataFrame(
        {
            "prompt_id": pd.array(prompts[cell], dtype="str"),
            "config_id": pd.array(configs[cell], dtype="str"),
            "arm": pd.array(np.array(["reference", "candidate"], dtype=object)[arm], dtype="str"),
            "seed": (seq % n_seeds).astype(np.int64),
            "position": np.tile(np.arange(n_pos, dtype=np.int32), n_seq),
            "token_id": tokens.astype(np.int64),
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10_000, help="seeds per arm per cell")
    ap.add_argument("--perms", type=int, default=200)
    ap.add_argument("--multiplicity", default="bh", choices=MULTIPLICITY)
    ap.add_argument("--trie-depth", type=int, default=2)
    ap.add_argument("--out", default="results/bench/stats_analyze.json")
    ap.add_argument("--machine", default="2-core CPU dev box")
    args = ap.parse_args()
    samples = make_samples(args.seeds)
    opts = AnalysisOptions(
        null_permutations=args.perms,
        multiplicity=args.multiplicity,
        trie_depth=args.trie_depth,
        whitebox=False,
        permutation_pvalues=False,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    res = analyze(samples, reference="reference", candidate="candidate", options=opts, rng_seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        sha = ""
    record = {
        "date": date.today().isoformat(),
        "bench": "stats.battery",
        "machine": args.machine,
        "cpu_count": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "python": platform.python_version(),
        "git": sha,
        "tokens": len(samples),
        "cells": 16,
        "positions": 32,
        "seeds_per_arm": args.seeds,
        "null_permutations": args.perms,
        "multiplicity": args.multiplicity,
        "trie_depth": args.trie_depth,
        "whitebox": False,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "target_s": 10.0,
        "met": wall <= 10.0,
        "n_tested": res.n_tested,
        "rejected": res.rejected,
        "load_avg_1m": os.getloadavg()[0],
    }
    print(json.dumps(record, indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = json.loads(out.read_text()) if out.exists() else []
    records.append(record)
    out.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
