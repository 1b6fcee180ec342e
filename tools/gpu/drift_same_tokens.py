"""Claim (b) of a stored matched-mode run, recomputed by this tree on the run's own tokens
(issue 32): separates what a kernel does to the drift from what it does to the tokens.

A kernel change moves a run's tokens, so two runs measure their drift on different sequences.
Here the numerics table is recomputed (``generation.matched_drift``, the run's own models and
settings) along the stored run's matched arm, so trees (or ``SPECTEST_NO_KERNELS=1``) compare on
identical sequences. Session 19 found Qwen3-8B's claim (b) moved from within (drift 0.0301,
floor 0.0356) to unresolved (0.0334, 0.0318) by session 18's attention-kernel change
(results/LOG.md "lead (session 19)"); this is the next step's instrument.

Prints the stored claim (b) (drift, floor, D and its interval, decision), the recomputed one,
whether the recomputed table equals the stored one bit for bit (it must, run by the tree that
wrote the run), and the seconds taken; ``--out FILE`` writes the recomputed table (Parquet).

    PYTHONPATH=TREE python tools/gpu/drift_same_tokens.py RUN_DIR [--out FILE]
    SPECTEST_NO_KERNELS=1 PYTHONPATH=. python tools/gpu/drift_same_tokens.py RUN_DIR   # SDPA
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from spectest.decision.claims import run_claim_b
from spectest.generation import load_models, matched_drift
from spectest.plan import make_plan
from spectest.protocol import load_protocol
from spectest.store import NUMERICS, ROUNDS, SAMPLES
from spectest.stored import load_run


def _line(name: str, r: Any) -> str:
    if r is None:
        return f"{name}: no claim (b)"
    return (
        f"{name}: drift {r.drift:.5f} (UCB {r.drift_ucb:.5f}), floor {r.floor:.5f}, D "
        f"{r.statistic:+.5f} in [{r.lcb:+.5f}, {r.ucb:+.5f}], margin {r.margin}: {r.decision}; "
        f"{r.n_sequences} sequences, {r.n_floor} floor, flips {r.flips:.4f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    stored = load_run(a.run_dir)
    protocol = load_protocol(a.run_dir / "protocol.yaml")
    plan = make_plan(protocol)
    samples, rounds = stored.table(SAMPLES), stored.table(ROUNDS)
    if samples is None or rounds is None or not plan.settings.matched:
        print(f"{a.run_dir}: not a matched-mode run with rounds", file=sys.stderr)
        return 2
    table0 = stored.table(NUMERICS)
    claim0 = run_claim_b(plan, samples, table0)
    print(_line("stored", None if claim0 is None else claim0.result()), flush=True)
    t0 = time.perf_counter()
    models = load_models(protocol, need_draft=False)
    table = matched_drift(protocol, samples, rounds, models, fast=True)
    took = time.perf_counter() - t0
    claim = run_claim_b(plan, samples, table)
    print(_line("recomputed", None if claim is None else claim.result()), flush=True)
    same = table0 is not None and table.equals(table0)
    print(f"recomputed table equals the stored one: {same}; {took:.1f} s (load and replay)")
    if a.out is not None:
        table.to_parquet(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
