"""White-box columns of one speculative chunk: densified laws vs shortlist laws (h12), same values.

- dense (before h12): ``ShortlistLaw.dense`` of p and q to ``[rows, V]`` float64, then
  ``teacher.whitebox_columns`` (order key, ``before`` mask, three masked sums, min(p, q)), in
  row chunks of ``--chunk`` (the recorder's ``_WB_CHUNK_ELEMENTS`` bounds its temporaries alike);
- shortlist: ``teacher.whitebox_columns_shortlist`` on the ``[rows, W]`` laws (O(rows·W); record
  key ``candidates_ms``: the h12 name).
Columns asserted equal (rtol 1e-12, ``wb_in_a`` exact); ms per call (dense: one pass, the
shortlist path best of ``reps``). Laws: ``shortlist_probs`` of logits ``N(0, 12²)`` (t 0.8,
top-p 0.95, width 1024) for p and for a processed q (draft logits = p's + N(0, 3²)), a one-hot q
(the argmax of the draft logits) and no q; tokens drawn from p. No model forwards.

    python benchmarks/bench_whitebox.py [--rows 3840] [--vocab 151936] [--chunk 384]
        [--device cpu] [--threads 1] [--out results/bench/whitebox.jsonl]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from spectest.engines.teacher import whitebox_columns, whitebox_columns_shortlist
from spectest.sampling.draw import argmax_tokens
from spectest.sampling.laws import ShortlistLaw
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.shortlist import shortlist_probs


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _laws(
    dev: torch.device, N: int, V: int, C: int, g: torch.Generator
) -> tuple[ShortlistLaw, dict[str, ShortlistLaw | None]]:
    """N random target laws p and their q (processed, one-hot, none) on shortlists, built C rows
    at a time."""
    ids_p, pr_p, ids_q, pr_q, onehot = [], [], [], [], []
    for lo in range(0, N, C):  # laws built in chunks: [C, V] float32 logits at a time
        n = min(C, N - lo)
        params = SamplingTensors.from_params([SamplingParams(0.8, 0, 0.95)] * n, device=dev)
        t = torch.randn((n, V), generator=g, device=dev) * 12  # [n, V]
        d = t + torch.randn((n, V), generator=g, device=dev) * 3  # [n, V]
        p, q = shortlist_probs(t, params), shortlist_probs(d, params)
        assert p is not None and q is not None, "a row not decided on its shortlist"
        ids_p.append(p.ids)
        pr_p.append(p.probs)
        ids_q.append(q.ids)
        pr_q.append(q.probs)
        onehot.append(argmax_tokens(d))  # [n]
    p = ShortlistLaw(torch.cat(ids_p), torch.cat(pr_p), V)  # [N, W]
    qs: dict[str, ShortlistLaw | None] = {
        "processed_q": ShortlistLaw(torch.cat(ids_q), torch.cat(pr_q), V),
        "onehot_q": ShortlistLaw(
            torch.cat(onehot)[:, None], torch.ones((N, 1), dtype=torch.float64, device=dev), V
        ),
        "no_q": None,
    }
    return p, qs


def _dense_all(
    p: ShortlistLaw, q: ShortlistLaw | None, x: torch.Tensor, C: int
) -> dict[str, torch.Tensor]:
    """The slow reference: dense white-box columns, C rows at a time."""
    N = int(x.shape[0])
    parts: dict[str, list[torch.Tensor]] = {}
    for lo in range(0, N, C):
        qq = None if q is None else q.rows(lo, C).dense()
        cols = whitebox_columns(p.rows(lo, C).dense(), qq, x[lo : lo + C])
        for c, v in cols.items():
            parts.setdefault(c, []).append(v)
    return {c: torch.cat(v) for c, v in parts.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=768 * 5)  # batch 768 × (K+1) verify rows
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunk", type=int, default=384)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)  # CPU: 2 shared cores sync badly
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev, N, V, C = torch.device(a.device), a.rows, a.vocab, a.chunk
    g = torch.Generator(device=dev).manual_seed(0)
    p, qs = _laws(dev, N, V, C, g)
    u = torch.rand((N, 1), generator=g, device=dev, dtype=torch.float64)  # [N, 1]
    cdf = p.probs.cumsum(1)  # [N, W]
    pick = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=p.ids.shape[1] - 1)
    x = p.ids.gather(1, pick)[:, 0]  # [N] tokens drawn from p

    for name, q in qs.items():
        _sync(dev)
        t0 = time.perf_counter()
        want = _dense_all(p, q, x, C)
        _sync(dev)
        dense_ms = (time.perf_counter() - t0) * 1e3
        best = float("inf")
        got: dict[str, Any] = {}
        for _ in range(a.reps):
            _sync(dev)
            t0 = time.perf_counter()
            got = whitebox_columns_shortlist(p, q, x)
            _sync(dev)
            best = min(best, (time.perf_counter() - t0) * 1e3)
        for c in want:
            if want[c].dtype == torch.bool:
                assert torch.equal(got[c], want[c]), c
            else:
                torch.testing.assert_close(got[c], want[c], rtol=1e-12, atol=1e-15, equal_nan=True)
        rec = {
            "bench": "whitebox",
            "case": name,
            "device": str(dev),
            "rows": N,
            "vocab": V,
            "width": int(p.ids.shape[1]),
            "dense_ms": round(dense_ms, 1),
            "candidates_ms": round(best, 2),
            "speedup": round(dense_ms / best, 1),
            "threads": torch.get_num_threads(),
        }
        print(json.dumps(rec), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
