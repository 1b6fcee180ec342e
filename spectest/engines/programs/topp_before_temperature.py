#!/usr/bin/env python3
"""A *buggy* engine program for spectest's ``command`` engine: plain sampling that applies
top-p to the untempered distribution and temperature afterwards (the filter-order bug class of
SGLang #36173 / fastllm #737: the kept set is computed on the wrong distribution).

Same I/O as ``builtin_engine.py`` (it reuses its ``serve``); only the decode differs. spectest
must report DIFFERENT (exit 1) when this program is the candidate against plain sampling at a
temperature != 1 with top-p < 1.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from builtin_engine import serve


def buggy_decode(job: dict[str, Any], target: Any, draft: Any) -> list[dict[str, Any]]:
    """Plain decoding, no cache (the model is tiny): top-p on softmax(logits), then temperature."""
    import torch

    from spectest.sampling.draw import categorical
    from spectest.seeding import STREAM_PLAIN, row_key, uniforms

    s = job["sampling"]
    seeds, T = job["seeds"], job["max_tokens"]
    keys = torch.tensor(
        [row_key(job["run_key"], job["prompt_id"], job["config_id"], sd) for sd in seeds],
        dtype=torch.int64,
    )  # [B]
    ids = torch.tensor([job["prompt"]] * len(seeds), dtype=torch.int64)  # [B, L]
    with torch.no_grad():
        for t in range(T):
            logits = target.model(ids).logits[:, -1].double()  # [B, V]
            p = torch.softmax(logits, -1)
            sp, order = p.sort(-1, descending=True)
            before = sp.cumsum(-1) - sp  # mass strictly before each token
            keep_sorted = before < s["top_p"]  # BUG: the kept set of the untempered p
            keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
            w = torch.softmax(logits / s["temperature"], -1) * keep  # then temperature
            probs = w / w.sum(-1, keepdim=True)
            u = uniforms(keys, STREAM_PLAIN, t, 1)[:, 0]  # [B]
            nxt = categorical(probs, u)  # [B]
            ids = torch.cat([ids, nxt.view(-1, 1)], dim=1)
    out = ids[:, -T:].tolist()
    return [
        {"type": "result", "id": job["id"], "seed": sd, "tokens": [int(x) for x in out[i]]}
        for i, sd in enumerate(seeds)
    ]


if __name__ == "__main__":
    serve(buggy_decode, "topp-before-temperature-example")
