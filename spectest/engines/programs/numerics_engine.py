#!/usr/bin/env python3
"""A command-engine program (``spectest-jsonl/1``) for claim (b)'s proofs (issue 31): spectest's
own built-in decode in a batch shape of its own, so its numerics differ from the run's arms.

``--batch N`` decodes each job's rows N at a time (the run's arms use ``batch_size``); with the
toy's numerics knob (``--target "toy:...,numerics=σ"``) the logits depend on the forward's
width and batch size, as bf16's do. ``--speculative`` runs the speculative loop with
``--variant`` (default ``exact``: a numerics-only perturbation of plain decode; a mutant such as
``eps_biased:0.05`` is a sampler bug of a chosen size). Without it, plain decode. The I/O is
``builtin_engine.py``'s (``spectest/engines/command.py`` documents the protocol).
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from builtin_engine import answer, arguments, drafter, job_request, load


def decode(job: dict[str, Any], target: Any, draft: Any, variant: str, batch: int) -> list:
    """One result per seed, the job's rows decoded ``batch`` at a time."""
    from spectest.engines import builtin
    from spectest.engines.base import RowSpec
    from spectest.sampling.mutants import get_variant
    from spectest.sampling.params import SamplingParams

    s = job["sampling"]
    params = SamplingParams(s["temperature"], s["top_k"], s["top_p"], s["min_p"])
    results = []
    seeds = job["seeds"]
    for lo in range(0, len(seeds), batch):
        rows = [RowSpec(job["config_id"], seed, params) for seed in seeds[lo : lo + batch]]
        req = job_request(job, rows)
        if draft is None:
            out = builtin.plain_decode(target, req)
        else:
            v = get_variant(variant)
            out = builtin.speculative_decode(target, draft, req, drafter=drafter(job), variant=v)
        tokens = out.tokens
        for i, row in enumerate(rows):
            toks = [int(t) for t in tokens[i].tolist() if int(t) >= 0]
            results.append({"type": "result", "id": job["id"], "seed": row.seed, "tokens": toks})
    return results


def main(argv: list[str] | None = None) -> None:
    ap = arguments(__doc__, required=True)
    ap.add_argument("--variant", default="exact")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)
    target, draft = load(args)
    mode = args.variant if args.speculative else "plain"
    hello = {"engine": "spectest-numerics-example", "version": f"{mode} batch {args.batch}"}
    answer(lambda job: decode(job, target, draft, args.variant, args.batch), hello)


if __name__ == "__main__":
    main()
