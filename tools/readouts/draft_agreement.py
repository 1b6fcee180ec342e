"""How often can a draft's proposals be accepted? The target's probability of the draft's argmax.

Prints, for each (logit scale, top-k), the mean over the positions of one prompt of: the target's
top probability, p(argmax draft) (the one-hot drafter's acceptance probability, and the mass an
ε-biased acceptor can add: its TV is about ε times this), and Σ min(p, q) with q the draft's
softmax. Used for issue 12 (results/LOG.md, 2026-11-30 h5): with ``derived:first_layers,layers=4``
of a random-init Qwen3-0.6B, p(argmax draft) = 0, so an ε tooth cannot be killed.

Usage: python tools/readouts/draft_agreement.py [TARGET] [DRAFT] [--scales 1,8] [--device cpu]
"""

from __future__ import annotations

import argparse
import json

import torch

from spectest.models.zoo import load_pair


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?", default="hf-preset:qwen3-0.6b")
    ap.add_argument("draft", nargs="?", default="derived:first_layers,layers=4")
    ap.add_argument("--scales", default="1,2,4,8,16", help="logit multipliers to apply")
    ap.add_argument("--top-k", default="0,50,20")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    target, draft = load_pair(a.target, a.draft, device=a.device, dtype=a.dtype)
    ids = torch.tensor([[100, 2000, 30000, 400, 5000, 60000, 700, 8000, 90000, 1000, 11, 12]])
    ids = ids % target.vocab_size
    with torch.inference_mode():
        lt = target.logits_full(ids.to(target.device))[0].double().cpu()  # [L, V]
        ld = draft.logits_full(ids.to(draft.device))[0].double().cpu()  # [L, V]
    for s in (float(x) for x in a.scales.split(",")):
        for k in (int(x) for x in a.top_k.split(",")):
            z = lt * s
            if k:
                thr = z.topk(k, -1).values[:, -1:]
                z = torch.where(z >= thr, z, torch.tensor(-float("inf"), dtype=z.dtype))
            p = torch.softmax(z, -1)  # [L, V]
            q = torch.softmax(ld * s, -1)  # [L, V]
            x = (ld * s).argmax(-1, keepdim=True)  # [L, 1]
            row = {
                "target": a.target,
                "draft": a.draft,
                "scale": s,
                "top_k": k,
                "top_p_mean": round(float(p.max(-1).values.mean()), 4),
                "p_argmax_draft_mean": round(float(p.gather(1, x).mean()), 4),
                "overlap_mean": round(float(torch.minimum(p, q).sum(-1).mean()), 4),
            }
            print(json.dumps(row))


if __name__ == "__main__":
    main()
