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

import argparse
import json
import sys
from typing import Any

PROTOCOL = "spectest-jsonl/1"


def decode(job: dict[str, Any], target: Any, draft: Any, variant: str, batch: int) -> list:
    """One result per seed, the job's rows decoded ``batch`` at a time."""
    from spectest.engines import builtin
    from spectest.engines.base import DrafterSpec, RowSpec
    from spectest.sampling.mutants import get_variant
    from spectest.sampling.params import SamplingParams

    s = job["sampling"]
    params = SamplingParams(s["temperature"], s["top_k"], s["top_p"], s["min_p"])
    d = job["drafter"]
    drafter = DrafterSpec(onehot=d["kind"] == "onehot", q_mode=d["q"], k=d["k"])
    kw: dict[str, Any] = dict(
        num_positions=job["max_tokens"], run_key=job["run_key"], prompt_id=job["prompt_id"]
    )
    results = []
    seeds = job["seeds"]
    for lo in range(0, len(seeds), batch):
        rows = [RowSpec(job["config_id"], seed, params) for seed in seeds[lo : lo + batch]]
        if draft is None:
            out = builtin.plain_decode(target, job["prompt"], rows, **kw)
        else:
            out = builtin.speculative_decode(
                target, draft, job["prompt"], rows, drafter=drafter,
                variant=get_variant(variant), **kw,
            )  # fmt: skip
        tokens = out.tokens
        for i, row in enumerate(rows):
            toks = [int(t) for t in tokens[i].tolist() if int(t) >= 0]
            results.append({"type": "result", "id": job["id"], "seed": row.seed, "tokens": toks})
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--speculative", action="store_true")
    ap.add_argument("--variant", default="exact")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)
    import torch

    from spectest.models.zoo import load_model, load_pair

    torch.set_num_threads(1)
    if args.speculative:
        target, draft = load_pair(args.target, args.draft)
    else:
        target, draft = load_model(args.target), None
    mode = args.variant if args.speculative else "plain"
    hello = {"type": "hello", "protocol": PROTOCOL, "engine": "spectest-numerics-example",
             "version": f"{mode} batch {args.batch}"}  # fmt: skip
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            results = decode(job, target, draft, args.variant, args.batch)
        except Exception as err:  # report, do not crash: spectest prints the message
            print(json.dumps({"type": "error", "id": job.get("id"), "message": str(err)}))
        else:
            for res in results:
                print(json.dumps(res))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
