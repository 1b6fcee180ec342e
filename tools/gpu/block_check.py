"""A larger direct check of SGLang's block verification on the H200 (issue 10 follow-up).

Under any lossless verification the *first* emitted token of a round is distributed as the
target's first-position law p_0, whatever the coupling. For several random (p, q) laws, 4 M rows
each, this compares the first emitted token of the sglang chain and block kernels (spectest's
acceptor adapters, fed spectest's uniforms) with p_0 by a one-sample chi2, and prints the mean
number of accepted drafts next to spectest's exact sampler. Run from the repository root on a
CUDA machine with $SPECTEST_SGLANG_REJECT_SAMPLING set (tools/gpu/kernels.sh sets it).
"""

import importlib

import torch
from scipy.stats import chisquare

from spectest.engines.acceptor import kernel_sampler
from spectest.sampling.rejection import rejection_sample

dev, B, K = "cuda", 4_000_000, 3
for V, scale, seed in ((8, 1.5, 0), (8, 1.5, 1), (16, 2.0, 2), (5, 1.0, 3)):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(1, K + 1, V, generator=g, dtype=torch.float64) * scale, -1)
    q = torch.softmax(torch.randn(1, K, V, generator=g, dtype=torch.float64) * scale, -1)
    p, q = p.to(dev), q.to(dev)
    tp, dp = p.expand(B, -1, -1).contiguous(), q.expand(B, -1, -1).contiguous()
    x = torch.multinomial(q[0], B, replacement=True).T.contiguous()  # [B, K] drafts ~ q_j
    u = torch.rand(B, K + 1, dtype=torch.float64, device=dev).clamp(1e-12, 1 - 1e-12)
    ref = rejection_sample(tp, dp, x, u[:, :K], u[:, K])
    expected = (p[0, 0] * B).cpu().numpy()
    line = [f"V={V} seed={seed}"]
    for spec in ("sglang:chain", "sglang:block"):
        mod, fn = spec.split(":")
        kernel = getattr(importlib.import_module(f"spectest.acceptors.{mod}"), fn)
        res = kernel_sampler(kernel, spec)(tp, dp, x, u[:, :K], u[:, K])
        counts = torch.bincount(res.emitted[:, 0].cpu(), minlength=V).double().numpy()
        stat, pv = chisquare(counts, expected)
        line.append(
            f"{spec}: first-token chi2 {stat:.1f} p {pv:.3g}, "
            f"accepted {res.num_accepted.double().mean().item():.4f}"
        )
    c = torch.bincount(ref.emitted[:, 0].cpu(), minlength=V).double().numpy()
    line.append(
        f"exact: chi2 p {chisquare(c, expected)[1]:.3g}, "
        f"accepted {ref.num_accepted.double().mean().item():.4f}"
    )
    print(" | ".join(line), flush=True)
