"""The fast pipeline's sampling work per step, dense laws vs shortlist laws (h11), same tokens.

- plain step: ``logits_to_probs_fast`` + ``categorical`` on ``[B, V]`` float64, vs
  ``shortlist_probs`` + ``ShortlistLaw.draw`` on ``[B, W]``;
- speculative round (sampled drafter, K draft laws + the K+1 target rows): dense q's stacked to
  ``[B, K, V]``, ``logits_to_probs_fast`` on ``[B, K+1, V]``, ``rejection_sample``, vs shortlist
  laws through the same ``rejection_sample`` (record keys ``*_candidates_ms``: the h11 names).
Tokens asserted equal; best-of-``reps`` ms per call; logits ``N(0, 12²)`` like the realistic pair,
t 0.8, top-p 0.95. No model forwards.

    python benchmarks/bench_round.py [--rows 64] [--vocab 151936] [--k 4] [--device cpu]
        [--out results/bench/round.jsonl]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from spectest.sampling.draw import categorical
from spectest.sampling.laws import stack_laws
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.rejection import rejection_sample
from spectest.sampling.shortlist import logits_to_probs_fast, shortlist_probs


def _best(fn: Callable[[], Any], reps: int, dev: torch.device) -> tuple[float, Any]:
    out = fn()
    best = float("inf")
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev, B, V, K = torch.device(a.device), a.rows, a.vocab, a.k
    g = torch.Generator(device=dev).manual_seed(0)
    params = SamplingTensors.from_params([SamplingParams(0.8, 0, 0.95)] * B, device=dev)
    t_logits = torch.randn((B, K + 1, V), generator=g, device=dev) * 12  # [B, K+1, V] float32
    d_logits = t_logits[:, :K] + torch.randn((B, K, V), generator=g, device=dev) * 3  # [B, K, V]
    u = torch.rand((B, 2 * K + 1), generator=g, device=dev, dtype=torch.float64)  # [B, 2K+1]

    def plain_dense() -> torch.Tensor:
        return categorical(logits_to_probs_fast(t_logits[:, 0], params), u[:, 0], check=False)

    def plain_cand() -> torch.Tensor:
        law = shortlist_probs(t_logits[:, 0], params)
        assert law is not None
        return law.draw(u[:, 0])

    def round_dense() -> torch.Tensor:
        qs = [logits_to_probs_fast(d_logits[:, i], params) for i in range(K)]  # K x [B, V]
        x = torch.stack([categorical(q, u[:, i], check=False) for i, q in enumerate(qs)], 1)
        p = logits_to_probs_fast(t_logits, params)  # [B, K+1, V]
        res = rejection_sample(p, torch.stack(qs, 1), x, u[:, K : 2 * K], u[:, 2 * K])
        return res.emitted

    def round_cand() -> torch.Tensor:
        laws = [shortlist_probs(d_logits[:, i], params) for i in range(K)]
        assert all(q is not None for q in laws)
        qs = [q for q in laws if q is not None]
        x = torch.stack([q.draw(u[:, i]) for i, q in enumerate(qs)], 1)  # [B, K]
        p = shortlist_probs(t_logits, params)
        assert p is not None
        res = rejection_sample(p, stack_laws(qs), x, u[:, K : 2 * K], u[:, 2 * K])
        return res.emitted

    rec: dict[str, Any] = {"bench": "sampling_round", "rows": B, "vocab": V, "k": K}
    pairs = (("plain", plain_dense, plain_cand), ("round", round_dense, round_cand))
    for name, dense, cand in pairs:
        t_d, out_d = _best(dense, a.reps, dev)
        t_c, out_c = _best(cand, a.reps, dev)
        assert torch.equal(out_d, out_c), name
        rec |= {f"{name}_dense_ms": round(t_d, 1), f"{name}_candidates_ms": round(t_c, 1)}
        rec[f"{name}_speedup"] = round(t_d / t_c, 2)
    rec |= {"device": str(dev), "threads": torch.get_num_threads(), "torch": torch.__version__}
    rec["tokens_equal"] = True
    print(json.dumps(rec))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
