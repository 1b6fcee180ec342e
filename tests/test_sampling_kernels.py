"""The fused normaliser (``sampling/kernels.py``) against the torch expression it replaces: the
reference path is ``shortlist._weights(..).sum(-1)`` bit for bit; the Triton kernel equals it to
1e-12 relative (float64 reduction order only) under Triton's CPU interpreter and on CUDA, on
random, peaked and flat rows at a vocabulary that is not a multiple of the kernel's block; and the
shortlist law the fast pipeline builds with the kernel on CUDA equals the reference pipeline's.

False-failure rate: the inputs are fixed (seeded); a 1e-12 bound on sums whose reduction-order
difference is ~1e-15 relative fails only on a broken kernel."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spectest.sampling import kernels
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.shortlist import _weights, shortlist_probs
from spectest.sampling.transforms import logits_to_probs

HAS_TRITON = importlib.util.find_spec("triton") is not None


def rows(g: torch.Generator, M: int, V: int) -> torch.Tensor:
    """[M, V] float32: random, peaked (one large logit) and near-flat rows."""
    x = torch.randn(M, V, generator=g) * 3
    x[1::3] *= 0.01  # near-flat
    x[2::3, 7] += 40.0  # peaked
    return x.float()


def test_reference_is_the_weights_sum_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    x = rows(g, 9, 1000)
    t = torch.tensor([0.3, 0.8, 1.0, 1.7, 0.8, 1.0, 2.0, 0.5, 1.0], dtype=torch.float64)
    mx = x.amax(-1, keepdim=True).to(torch.float64)
    assert torch.equal(kernels.weight_sum_reference(x, t, mx), _weights(x, t, mx).sum(-1))
    # off CUDA the dispatcher is the reference
    assert torch.equal(kernels.weight_sum(x, t, mx), _weights(x, t, mx).sum(-1))


INTERPRETED = textwrap.dedent(
    """
    import json, torch
    from spectest.sampling import kernels
    out = {}
    for V in (300, 2048, 5001):
        g = torch.Generator().manual_seed(V)
        x = torch.randn(6, V, generator=g) * 3
        x[1::3] *= 0.01
        x[2::3, 7] += 40.0
        x = x.float()
        t = torch.tensor([0.3, 0.8, 1.0, 1.7, 0.8, 2.0], dtype=torch.float64)
        mx = x.amax(-1, keepdim=True).to(torch.float64)
        ref = kernels.weight_sum_reference(x, t, mx)
        got = kernels.launch(x, t, mx)
        out[V] = float(((got - ref).abs() / ref).max())
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernel_equals_reference_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPECTEST_NO_KERNELS": ""}
    res = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rel = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(rel) == {"300", "2048", "5001"}
    assert max(rel.values()) <= 1e-12, rel


@pytest.mark.gpu
def test_kernel_on_cuda_equals_reference_and_the_law_is_unchanged() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if kernels._kernel() is None:
        pytest.skip("triton not importable")
    g = torch.Generator().manual_seed(1)
    V = 151_936
    x = rows(g, 48, V).cuda()
    t = torch.tensor([0.3, 0.8, 1.0, 1.7] * 12, dtype=torch.float64, device="cuda")
    mx = x.amax(-1, keepdim=True).to(torch.float64)
    ref = kernels.weight_sum_reference(x, t, mx)
    got = kernels.weight_sum(x, t, mx)
    assert float(((got - ref).abs() / ref).max()) <= 1e-12
    # the fast pipeline's shortlist law (top-p without top-k: the kernel's sum decides the nucleus)
    # equals the reference pipeline's dense law on CUDA
    # peaked enough that every row's nucleus fits the 4096-wide shortlist (with N(0, 2²) logits
    # the 0.95 nucleus is wider: the shortlist falls back and returns None — seen on the H200)
    x = (torch.randn(64, V, generator=g) * 6).float().cuda()
    params = SamplingTensors.from_params(
        [SamplingParams(temperature=0.8, top_p=0.95)] * 32
        + [SamplingParams(temperature=1.0, top_p=0.5)] * 32,
        device=x.device,
    )
    law = shortlist_probs(x, params, width=4096)
    assert law is not None
    dense, want = law.dense(), logits_to_probs(x, params)
    assert torch.equal(dense > 0, want > 0)
    assert float((dense - want).abs().max()) <= 1e-12


@pytest.mark.gpu
def test_kernel_reads_bfloat16_logits_to_float64_rounding() -> None:
    """The model's own bfloat16 logits: the kernel's sum on them equals the reference and its sum
    on their float32 cast to 1e-12 relative — the same float64 terms (both conversions are exact),
    not bit for bit: Triton lays the block's reduction out by the load's width, so a bfloat16 load
    sums the same terms in another order (measured on the H200: results/LOG.md "lead (session
    8)")."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if kernels._kernel() is None:
        pytest.skip("triton not importable")
    g = torch.Generator().manual_seed(2)
    x = rows(g, 48, 151_936).to(torch.bfloat16).cuda()
    t = torch.tensor([0.3, 0.8, 1.0, 1.7] * 12, dtype=torch.float64, device="cuda")
    mx = x.amax(-1, keepdim=True).to(torch.float64)
    got = kernels.weight_sum(x, t, mx)
    cast = kernels.weight_sum(x.float(), t, mx)
    ref = kernels.weight_sum_reference(x, t, mx)
    assert float(((got - cast).abs() / cast).max()) <= 1e-12
    assert float(((got - ref).abs() / ref).max()) <= 1e-12
