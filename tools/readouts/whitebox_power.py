"""Power of the white-box family, exact and teacher mode, in the teacher-mode simulator (issue 12).

Runs ``tests/test_stats_whitebox_weights.family_pvalues`` (top-k 20 Markov engine, V = 40,
teacher logits + N(0, 0.05²); one candidate arm of ``--n`` sequences × 8 tokens under the
alternative ``--alt`` and a reference of m × as many plain sequences for each ``--mults``) for
``--reps`` replications with seeds ``--seed`` + r, writes {test: [p per replication]} as JSON to
``--out`` and prints each test's rejection rate at α = 0.05 and the family's at the shipped
weights (``whitebox.WHITEBOX_WEIGHTS``, ``whitebox_two_sample.TEACHER_WEIGHTS``) beside the equal
split.

Usage: ``PYTHONPATH=$PWD python tools/readouts/whitebox_power.py --alt eps --reps 200 --out F``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from test_stats_whitebox_weights import (
    EXACT_TESTS,
    family_pvalues,
    family_rejects,
)

from spectest.stats.whitebox import WHITEBOX_WEIGHTS
from spectest.stats.whitebox_two_sample import TEACHER_WEIGHTS, TWO_SAMPLE_TESTS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--alt", choices=("eps", "temp", "qtemp", "null"), default="eps")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--B", type=int, default=399)
    ap.add_argument("--mults", default="1,2,4,8,16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    mults = tuple(int(x) for x in args.mults.split(","))
    draws: list[dict[str, float]] = []
    t0 = time.time()
    for r in range(args.reps):
        draws.append(family_pvalues(args.alt, args.n, args.seed + r, mults, args.B))
        if r % 20 == 0:
            print(r, f"{time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    res = {k: [d[k] for d in draws] for k in draws[0]}
    Path(args.out).write_text(json.dumps({"args": vars(args), "p": res}))
    for k, v in res.items():
        print(f"{k:24s} {np.mean(np.asarray(v) <= 0.05):.3f}")
    for label, tests, weights, suffixes in (
        ("exact", EXACT_TESTS, WHITEBOX_WEIGHTS, [""]),
        ("teacher", TWO_SAMPLE_TESTS, TEACHER_WEIGHTS, [f"_m{m}" for m in mults]),
    ):
        for s in suffixes:
            shipped = np.mean([family_rejects(d, tests, weights, s) for d in draws])
            equal = np.mean([family_rejects(d, tests, dict.fromkeys(tests, 1.0), s) for d in draws])
            print(f"family {label}{s}: weighted {shipped:.3f}, equal split {equal:.3f}")


if __name__ == "__main__":
    main()
