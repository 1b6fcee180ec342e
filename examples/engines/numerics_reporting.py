#!/usr/bin/env python3
"""A foreign engine with its own numerics that reports probabilities: a user's program
(``spectest-jsonl/1``, docs/engines-command.md) for the numerics-sized bug of issue 31.

It decodes ``--batch`` rows per forward (the run's arms use ``batch_size``), so with the toy's
numerics knob (``--target "toy:...,numerics=σ"``) its logits differ from every other arm's, as a
bf16 GPU engine's do. ``--speculative --variant V`` runs spectest's speculative loop with the
variant ``V`` (``exact``, or a mutant such as ``eps_biased:0.1``, about 0.01 TV per token: the
size of vLLM #54282); without ``--speculative``, plain decode. Every result carries ``probs``,
what a server's logprobs are: the target's processed p of each emitted token *as this engine
computed it* (its own verify or decode forward, recorded while decoding) and the mass ranked
before the token (spectest's teacher, clamped to 1 − p). A mutant reports the law it should have
sampled from, as a server does whose sampler has a bug: the PIT conditional on that law
(exact at any numerics) sees the bug that the tokens alone cannot tell from numerics.

Run it with ``examples/engines/numerics-reporting.yaml`` (and ``-mutant``), from the checkout's
root; results/LOG.md has the measured verdicts.
"""

from __future__ import annotations

import sys
from typing import Any

from spectest.engines.command import programs_dir

sys.path.insert(0, str(programs_dir()))

from builtin_engine import answer, arguments, drafter, job_request
from reporting_engine import teacher_probs


def decode(job: dict[str, Any], target: Any, draft: Any, variant: str, batch: int) -> list:
    """One result per seed with its ``probs``, the job's rows decoded ``batch`` at a time."""
    from spectest import schema
    from spectest.engines import builtin
    from spectest.engines.base import RowSpec
    from spectest.sampling.mutants import get_variant
    from spectest.sampling.params import SamplingParams

    s, seeds = job["sampling"], job["seeds"]
    params = SamplingParams(s["temperature"], s["top_k"], s["top_p"], s["min_p"])
    results = []
    for lo in range(0, len(seeds), batch):
        rows = [RowSpec(job["config_id"], seed, params) for seed in seeds[lo : lo + batch]]
        req = job_request(job, rows, whitebox=True)
        if draft is None:
            out = builtin.plain_decode(target, req)
        else:
            v = get_variant(variant)
            out = builtin.speculative_decode(target, draft, req, drafter=drafter(job), variant=v)
        tokens = out.tokens.tolist()  # [b][T]: the built-in loops fill every row to T tokens
        T = len(tokens[0])
        wb_p = out.whitebox[schema.WB_P].to_numpy().reshape(-1, T)  # [b, T] this engine's p
        ranked = teacher_probs(job, target, tokens)  # [b][T] (p, cdf_lo), the teacher's
        for i, row in enumerate(rows):
            probs = [
                {"p": float(p), "cdf_lo": min(lo_t, 1.0 - float(p))}
                for p, (_, lo_t) in zip(wb_p[i], ranked[i], strict=True)
            ]
            res = {"type": "result", "id": job["id"], "seed": row.seed, "tokens": tokens[i]}
            results.append({**res, "probs": probs})
    return results


def load(args: Any) -> tuple[Any, Any]:
    """The target and (``--speculative``) the draft on ``--device`` in ``--dtype``."""
    import torch

    from spectest.models.zoo import load_model, load_pair

    torch.set_num_threads(1)
    where = {"device": args.device, "dtype": args.dtype}
    if args.speculative:
        return load_pair(args.target, args.draft, **where)
    return load_model(args.target, **where), None


def main(argv: list[str] | None = None) -> None:
    ap = arguments(__doc__)  # --draft: only with --speculative
    ap.add_argument("--variant", default="exact")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    args = ap.parse_args(argv)
    target, draft = load(args)
    mode = args.variant if args.speculative else "plain"
    hello = {"engine": "numerics-reporting-example", "version": f"{mode} batch {args.batch}"}
    answer(lambda job: decode(job, target, draft, args.variant, args.batch), hello)


if __name__ == "__main__":
    main()
