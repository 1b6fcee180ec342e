"""``draw.categorical`` before and after the fix-up change (h11): the old version computed the
"next positive-weight id" over every ``[N, V]`` row (flip / cummin / flip); the new one only on
rows whose found index has zero weight. Same tokens (asserted); ms per call, one run.

    python benchmarks/bench_categorical.py [--rows 1024] [--vocab 151936] [--device cpu]
        [--out results/bench/categorical.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from spectest.sampling.draw import _check, categorical


def categorical_old(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The pre-h11 body of ``categorical`` (check on), kept here as the baseline."""
    V = int(probs.shape[-1])
    w = probs.reshape(-1, V)  # [N, V]
    uf = u.reshape(-1)  # [N]
    cdf = torch.cumsum(w, dim=-1)  # [N, V]
    total = cdf[:, -1]  # [N]
    _check(w, total, uf, torch.zeros_like(uf, dtype=torch.bool))
    target = (uf * total)[:, None].contiguous()  # [N, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=V - 1)  # [N]
    ar = torch.arange(V, device=w.device).expand_as(w)  # [N, V]
    positive = w > 0  # [N, V]
    next_pos = torch.where(positive, ar, V).flip(-1).cummin(-1).values.flip(-1)  # [N, V]
    last_pos = torch.where(positive, ar, -1).amax(-1)  # [N]
    tok = next_pos.gather(-1, idx[:, None]).squeeze(-1)  # [N]
    return torch.where(tok == V, last_pos, tok).reshape(u.shape)


def _time(fn, *args, reps: int, dev: torch.device) -> float:  # type: ignore[no-untyped-def]
    fn(*args)
    best = float("inf")
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn(*args)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    # a top-p-like law: ~1000 positive tokens per row, the rest exact zeros
    logits = torch.randn((a.rows, a.vocab), generator=g, device=dev, dtype=torch.float64) * 4
    keep = logits >= logits.topk(1000, dim=-1).values[:, -1:]
    w = torch.where(keep, torch.exp(logits - logits.amax(-1, keepdim=True)), 0.0)  # [N, V]
    u = torch.rand(a.rows, generator=g, device=dev, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    assert torch.equal(categorical(w, u), categorical_old(w, u))
    old = _time(categorical_old, w, u, reps=a.reps, dev=dev)
    new = _time(categorical, w, u, reps=a.reps, dev=dev)
    rec = {
        "bench": "categorical",
        "rows": a.rows,
        "vocab": a.vocab,
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "old_ms": round(old, 2),
        "new_ms": round(new, 2),
        "speedup": round(old / new, 2),
        "tokens_equal": True,
        "torch": torch.__version__,
    }
    print(json.dumps(rec))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
