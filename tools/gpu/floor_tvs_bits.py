"""Session 31: are a batch's floor-row TVs in one ``_tvs`` call (session 30's ``_floor_tvs``,
reverted) the same bits as one ``_tv`` call a row on this device? And a plain float64 sum over
V = 151 936: the same bits for a row reduced among 32 rows as among 288? Prints, per law, the
count of differing TVs and the largest difference; exit 0 either way (a record, not a test).

    python tools/gpu/floor_tvs_bits.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch

from spectest.numerics import table
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.pipeline import FAST, REFERENCE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    M, T, V = 9, 32, 151_936  # P1: nine floor rows a prompt, 32 positions, Qwen3's vocabulary
    dec = torch.randn(M, T, V, generator=g, device=dev) * 3.0
    alone = [dec[i] + torch.randn(T, V, generator=g, device=dev) * 0.02 for i in range(M)]
    configs = [
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=1.0, top_k=50),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
    ]
    params = [configs[i % 3] for i in range(M)]
    for name, probs in (("reference", REFERENCE.probs), ("fast", FAST.probs)):
        per_row = torch.stack(
            [
                table._tv(one, dec[i], SamplingTensors.from_params([p] * T, device=dev), probs)
                for i, (one, p) in enumerate(zip(alone, params, strict=True))
            ]
        ).cpu()
        at_once = torch.from_numpy(table._tvs(torch.stack(alone), dec, params, probs)[0])
        diff = (per_row - at_once).abs()
        print(f"{name}: {int((diff > 0).sum())} of {diff.numel()} TVs differ, max {diff.max():.3g}")
    x = torch.rand(M * T, V, generator=g, device=dev, dtype=torch.float64)
    small = torch.cat([x[i * T : (i + 1) * T].sum(-1) for i in range(M)])
    print(
        f"float64 sum over V: {int((small != x.sum(-1)).sum())} of {M * T} rows differ "
        f"between {T}-row and {M * T}-row calls"
    )


if __name__ == "__main__":
    main()
