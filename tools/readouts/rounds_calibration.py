"""H0 false-alarm rate and power of the round-aware family (issue 22 item 2) on the toy pair.

Two arms of spectest's exact speculative sampler (the same drafter, disjoint seeds) are the
null; a mutant candidate against an exact reference is the power side. Each replication is one
``stats.rounds.round_tests`` at level ``--alpha`` (the family alone, its whole α) on B sequence
relabelings, and for the power side also the full ``analyze`` (cells, trie, sequence, rounds).

    python tools/readouts/rounds_calibration.py --reps 200 --seeds 40
    python tools/readouts/rounds_calibration.py --reps 20 --seeds 120 --mutant bonus_wrong_row
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd

from spectest.engines.base import DecodeRequest, rounds_frame, samples_frame
from spectest.engines.builtin import DrafterSpec, RowSpec, speculative_decode
from spectest.models.toy import ToyLM
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.stats.battery import AnalysisOptions, analyze
from spectest.stats.families import relabelings
from spectest.stats.histograms import encode_samples
from spectest.stats.rounds import round_tests

PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, top_k=6)]


def spec_arm(variant: str, arm: str, seeds: range, T: int = 12, k: int = 3):
    """One arm of the toy pair (ToyLM(10, 3, 1.5, seed=4) and its 0.8-perturbed draft)."""
    target = ToyLM(10, 3, 1.5, seed=4)
    draft = target.perturbed(0.8, seed=5)
    rows = [RowSpec(f"c{i}", s, p) for s in seeds for i, p in enumerate(PARAMS)]
    req = DecodeRequest(
        [1, 2, 3], rows, num_positions=T, run_key=22, prompt_id="p", batch_size=min(len(rows), 2048)
    )
    out = speculative_decode(
        target, draft, req, drafter=DrafterSpec(onehot=False, k=k), variant=get_variant(variant)
    )
    return samples_frame(out.tokens, "p", rows, arm), rounds_frame(out.rounds, "p", rows, arm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--B", type=int, default=200)
    ap.add_argument("--mutant", default="")
    a = ap.parse_args()
    n, R = a.seeds, a.reps
    ref_s, ref_r = spec_arm("exact", "reference", range(n * R))
    cand = a.mutant or "exact"
    cand_s, cand_r = spec_arm(cand, "candidate", range(10**7, 10**7 + n * R))
    rng = np.random.default_rng(2026)
    hits, full, token = 0, 0, 0
    for i in range(R):
        lo, hi = i * n, (i + 1) * n
        s = pd.concat([ref_s[ref_s.seed.between(lo, hi - 1)],
                       cand_s[cand_s.seed.between(10**7 + lo, 10**7 + hi - 1)]])  # fmt: skip
        r = pd.concat([ref_r[ref_r.seed.between(lo, hi - 1)],
                       cand_r[cand_r.seed.between(10**7 + lo, 10**7 + hi - 1)]])  # fmt: skip
        enc = encode_samples(s, ("reference", "candidate"))
        df = round_tests(enc, r, relabelings(enc, a.B, rng), a.alpha)
        hits += bool(df["reject"].any())
        if a.mutant:
            an = analyze(s, reference="reference", candidate="candidate", rounds=r,
                         options=AnalysisOptions(sequence=True), rng_seed=i)  # fmt: skip
            full += an.rejected
            token += any(f.rejected for k, f in an.families.items() if k != "rounds")
    se = math.sqrt(max(hits / R * (1 - hits / R), 1e-12) / R)
    print(f"candidate={cand} reps={R} seeds/arm={n} alpha={a.alpha} B={a.B}: "
          f"round-aware family rejects {hits}/{R} = {hits / R:.3f} (se {se:.3f})")  # fmt: skip
    if a.mutant:
        print(f"  full analyze (α split over active families) rejects {full}/{R}; "
              f"token families alone {token}/{R}")  # fmt: skip


if __name__ == "__main__":
    main()
