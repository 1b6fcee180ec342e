"""White-box tests by token role (issue 22): false-alarm rate under H0 of every new test and of
the white-box family, and the kill rate of the catalogue's mutants with the role-stratified
family beside the pooled one, on real speculative runs of spectest's own sampler.

Each replication generates ``--seeds`` sequences per config (disjoint seed ranges: independent
replications, an exact binomial count) with ``builtin.speculative_decode`` and white-box
columns recorded at generation time, then runs ``stats.whitebox.whitebox_tests`` on them.
Decisions at ``--alpha`` (default 0.05): each test alone, the white-box family with the pooled
split only (``whitebox.WHITEBOX_WEIGHTS``, the split before issue 22, role tests ignored) and
with the role tests (``whitebox.WHITEBOX_ROLE_WEIGHTS``), both weighted Bonferroni. In a real
run the family gets a share of α (``stats.battery``).

Pairs: ``toy`` (``ToyLM(10, 3, 1.5, seed=4)`` and its 0.8-perturbed draft; fast on CPU, for
volume) and ``bundled`` (the bundled byte-level pair; GPU: tools/gpu/whitebox_roles.sh). Two
configs (T = 1; T = 0.9, top-k 6 on toy / T = 0.8, top-p 0.95 on bundled), 12 positions,
K = 3, one prompt.

    OMP_NUM_THREADS=1 python benchmarks/whitebox_roles.py h0 --reps 200 --seeds 256
    OMP_NUM_THREADS=1 python benchmarks/whitebox_roles.py power --reps 40 --seeds 256
    # either with --drafter onehot, --pair bundled --device cuda, --md F (append a table)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.engines.base import DecodeRequest, rounds_frame, samples_frame
from spectest.engines.builtin import DrafterSpec, RowSpec, speculative_decode
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.stats import whitebox

MUTANTS = (
    "bonus_reuse_accept_uniform",
    "reuse_accept_uniform",
    "residual_from_p",
    "bonus_wrong_row",
    "eps_biased:0.1",
    "raw_q",
    "swapped_filter_order",
)
NEW_TESTS = (
    "acceptance_slots",
    "role_pit_accepted",
    "role_pit_recovered",
    "reuse_recovered",
    "role_pit_bonus",
    "reuse_bonus",
)
ARM = "candidate"


def _pair(name: str, device: str):
    if name == "toy":
        from spectest.models.toy import ToyLM

        target = ToyLM(10, 3, 1.5, seed=4)
        return target, target.perturbed(0.8, seed=5), [1, 2, 3], [
            SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, top_k=6)
        ]  # fmt: skip
    from spectest.models import bytetok
    from spectest.models.zoo import load_pair

    target, draft = load_pair("bundled:target", "bundled:draft", device=device)
    prompt = bytetok.encode("The quick brown fox jumps over the lazy dog. ")
    return target, draft, prompt, [
        SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.95)
    ]  # fmt: skip


def replication(models, variant: str, rep: int, seeds: int, onehot: bool) -> dict[str, float]:
    """p-values of every white-box test of one replication (seeds ``rep·seeds ..``)."""
    target, draft, prompt, params = models
    rows = [
        RowSpec(f"c{i}", rep * seeds + s, p) for s in range(seeds) for i, p in enumerate(params)
    ]
    out = speculative_decode(
        target,
        draft,
        DecodeRequest(
            prompt,
            rows,
            whitebox=True,
            num_positions=12,
            run_key=22_2026,
            prompt_id="p",
            batch_size=len(rows),
        ),
        drafter=DrafterSpec(onehot=onehot, k=3),
        variant=get_variant(variant),
    )
    samples = samples_frame(out.tokens, "p", rows, ARM, out.whitebox)
    rounds = rounds_frame(out.rounds, "p", rows, ARM)
    wb = whitebox.whitebox_tests(samples, [ARM], np.random.default_rng(rep), rounds=rounds)
    return {str(t): float(p) for t, p in zip(wb["test"], wb["pvalue"], strict=True)}


def decisions(pv: dict[str, float], alpha: float) -> dict[str, bool]:
    """Each test alone at α, and the family under the pooled and the role-stratified splits."""
    out = {t: bool(p <= alpha) for t, p in pv.items() if t != "support"}
    support = pv.get("support", 1.0) == 0.0
    for name, weights in (("family_pooled", whitebox.WHITEBOX_WEIGHTS),
                          ("family_roles", whitebox.exact_weights(list(pv)))):  # fmt: skip
        tests = [t for t in pv if t in weights]
        p_adj, _ = whitebox.weighted_bonferroni(tests, np.array([pv[t] for t in tests]), weights)
        out[name] = support or bool((p_adj <= alpha).any())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["h0", "power"])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=256)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--pair", choices=["toy", "bundled"], default="toy")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--drafter", choices=["sampled", "onehot"], default="sampled")
    ap.add_argument("--mutants", default=",".join(MUTANTS))
    ap.add_argument("--md", type=Path, default=None, help="append the table to this file")
    ap.add_argument("--jsonl", type=Path, default=None, help="one line per replication")
    a = ap.parse_args(argv)
    models = _pair(a.pair, a.device)
    onehot = a.drafter == "onehot"
    arms = ["exact"] if a.mode == "h0" else a.mutants.split(",")
    t0 = time.perf_counter()
    rows = []
    for arm in arms:
        for rep in range(a.reps):
            pv = replication(models, arm, rep, a.seeds, onehot)
            d = decisions(pv, a.alpha)
            rows.append({"arm": arm, "rep": rep, **{f"p:{k}": v for k, v in pv.items()}, **d})
            if a.jsonl is not None:
                with a.jsonl.open("a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    df = pd.DataFrame(rows)
    secs = time.perf_counter() - t0
    cols = [c for c in ("family_pooled", "family_roles", *NEW_TESTS) if c in df.columns]
    table = df.groupby("arm", sort=False)[cols].mean()
    head = (
        f"\n### whitebox_roles {a.mode}: pair {a.pair}, {a.drafter} drafter K = 3, {a.seeds} "
        f"seeds x 2 configs x 12 positions per replication, {a.reps} replications, "
        f"alpha {a.alpha} ({secs:.0f} s)\n\n"
    )
    md = head + "| arm | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n"
    for arm, r in table.iterrows():
        md += f"| {arm} | " + " | ".join(f"{float(v):.3f}" for v in r) + " |\n"
    print(md)
    if a.md is not None:
        with a.md.open("a") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
