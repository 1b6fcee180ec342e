#!/usr/bin/env python3
"""An engine program that reports, beside its tokens, each token's probability and its rounds.

Protocol ``spectest-jsonl/1`` (docs/engines-command.md) with ``probs`` (docs/engines-reported-p.md)
and, with ``--speculative``, ``rounds``. ``--lie none|correct|sampled`` picks what it samples and
what it reports: docs/internals-engines.md "spectest/engines/programs/reporting_engine.py".
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from builtin_engine import correct_decode, serve

LIES = ("none", "correct", "sampled")


def teacher_probs(job: dict[str, Any], target: Any, tokens: list[list[int]]) -> list[Any]:
    """[B][T] (p, cdf_lo) of the correct law along ``tokens`` (spectest's teacher)."""
    import numpy as np

    from spectest import schema
    from spectest.engines.teacher import teacher_force
    from spectest.sampling.params import SamplingParams

    s = job["sampling"]
    params = [SamplingParams(s["temperature"], s["top_k"], s["top_p"], s["min_p"])] * len(tokens)
    wb = teacher_force(target, job["prompt"], params, np.array(tokens, dtype=np.int64))
    pairs = list(zip(wb[schema.WB_P].tolist(), wb[schema.WB_CDF_LO].tolist(), strict=True))
    T = len(tokens[0])
    return [pairs[i * T : (i + 1) * T] for i in range(len(tokens))]


def buggy_sample(job: dict[str, Any], target: Any) -> tuple[list[list[int]], list[Any]]:
    """Top-p on softmax(logits), then temperature (no cache: the model is tiny); the tokens and
    the (p, cdf_lo) of the law each was drawn from."""
    import torch

    from spectest.sampling.draw import categorical
    from spectest.seeding import STREAM_PLAIN, row_key, uniforms

    s, seeds, T = job["sampling"], job["seeds"], job["max_tokens"]
    keys = torch.tensor(
        [row_key(job["run_key"], job["prompt_id"], job["config_id"], sd) for sd in seeds],
        dtype=torch.int64,
    )  # [B]
    ids = torch.tensor([job["prompt"]] * len(seeds), dtype=torch.int64)  # [B, L]
    laws = []
    with torch.no_grad():
        for t in range(T):
            logits = target.model(ids).logits[:, -1].double()  # [B, V]
            sp, order = torch.softmax(logits, -1).sort(-1, descending=True)
            keep_sorted = (sp.cumsum(-1) - sp) < s["top_p"]  # BUG: the untempered kept set
            keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
            w = torch.softmax(logits / s["temperature"], -1) * keep
            probs = w / w.sum(-1, keepdim=True)  # [B, V]
            nxt = categorical(probs, uniforms(keys, STREAM_PLAIN, t, 1)[:, 0])  # [B]
            p = probs.gather(-1, nxt.view(-1, 1))  # [B, 1]
            vid = torch.arange(probs.shape[-1]).view(1, -1)  # [1, V]
            ahead = (probs > p) | ((probs == p) & (vid < nxt.view(-1, 1)))  # ranked before x
            lo = (probs * ahead).sum(-1)  # [B]
            laws.append(list(zip(p[:, 0].tolist(), lo.tolist(), strict=True)))
            ids = torch.cat([ids, nxt.view(-1, 1)], dim=1)
    tokens = ids[:, -T:].tolist()
    return tokens, [[laws[t][b] for t in range(T)] for b in range(len(seeds))]


def decode_with(lie: str) -> Any:
    def decode(job: dict[str, Any], target: Any, draft: Any) -> list[dict[str, Any]]:
        if lie == "none":
            results, sampled_p = correct_decode(job, target, draft, whitebox=True)
            ranked = teacher_probs(job, target, [r["tokens"] for r in results])
            probs = [
                [(p, min(lo, 1.0 - p)) for p, (_, lo) in zip(ps, rk, strict=True)]
                for ps, rk in zip(sampled_p, ranked, strict=True)
            ]
        else:
            tokens, sampled = buggy_sample(job, target)
            probs = sampled if lie == "sampled" else teacher_probs(job, target, tokens)
            results = [
                {"type": "result", "id": job["id"], "seed": sd, "tokens": tokens[i]}
                for i, sd in enumerate(job["seeds"])
            ]
        for res, pr in zip(results, probs, strict=True):
            res["probs"] = [{"p": p, "cdf_lo": lo} for p, lo in pr[: len(res["tokens"])]]
        return results

    return decode


def main(argv: list[str]) -> None:
    lie = "none"
    if "--lie" in argv:
        i = argv.index("--lie")
        lie = argv[i + 1] if i + 1 < len(argv) else ""
        argv = argv[:i] + argv[i + 2 :]
    if lie not in LIES:
        raise SystemExit(f"--lie: expected one of {', '.join(LIES)}, got {lie!r}")
    serve(decode_with(lie), f"reporting-engine-example (lie: {lie})", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
