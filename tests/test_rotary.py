"""The rotary embedding in one Triton kernel (``models/rotary.py``) against transformers' own
``apply_rotary_pos_emb``: bit for bit under Triton's CPU interpreter (float16) and on CUDA
(bfloat16 and float16), at head counts that are not a multiple of the kernel's tile, strided q
(the attention's ``transpose(1, 2)``) and several positions; the dispatch only inside
``fused_rotary`` and only for what ``applies``; and on CUDA the static model's logits with the
kernel equal to those without, bit for bit.

All inputs are fixed (seeded) and every comparison is exact (``torch.equal``): the kernel does
torch's operations in torch's precision, so the false-failure rate is zero."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spectest.models import rotary
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel

HAS_TRITON = importlib.util.find_spec("triton") is not None

CASES = textwrap.dedent(
    """
    import json, torch
    from transformers.models.qwen3 import modeling_qwen3 as mq
    from spectest.models import rotary

    def case(B, H, S, D, dtype, device, seed):
        g = torch.Generator().manual_seed(seed)
        # q as the attention makes it: [B, S, H, D] viewed as [B, H, S, D]
        q = (torch.randn(B, S, H, D, generator=g) * 4).to(dtype).to(device).transpose(1, 2)
        k = (torch.randn(B, H, S, D, generator=g) * 4).to(dtype).to(device)
        pos = torch.randint(0, 4000, (B, S), generator=g).float()
        inv = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
        emb = torch.cat([pos[..., None] * inv] * 2, -1)
        cos, sin = emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)
        want = mq.apply_rotary_pos_emb(q, k, cos, sin)
        got = (rotary.rotate(q, cos, sin), rotary.rotate(k, cos, sin))
        return all(torch.equal(a, b) for a, b in zip(got, want)), got[0].stride() == q.stride()

    def run(dtypes, device):
        out = {}
        for dtype in dtypes:
            for i, (B, H, S, D) in enumerate([(3, 16, 1, 128), (2, 3, 5, 64), (1, 20, 7, 128)]):
                out[f"{dtype}-{B}x{H}x{S}x{D}"] = case(B, H, S, D, dtype, device, i)
        return out
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernel_is_the_modules_operations_bit_for_bit_under_the_interpreter() -> None:
    """float16 (the interpreter's bfloat16 arithmetic is not the GPU's:
    tests/test_decode_attention.py)."""
    script = CASES + "\nprint(json.dumps(run([torch.float16], 'cpu')))"
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPECTEST_NO_KERNELS": ""}
    res = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out) == 3 and all(equal and layout for equal, layout in out.values()), out


def test_dispatch_only_inside_the_context_and_only_where_it_applies() -> None:
    """``install`` takes the modules of the formula; outside ``fused_rotary``, on CPU, in float32
    or with another ``unsqueeze_dim`` the module's own function runs (the same tensors)."""
    model = from_preset("qwen3-tiny", seed=1, num_hidden_layers=1)
    assert rotary.install(model.model)
    assert not rotary.install(torch.nn.Linear(2, 2))  # not a modeling module of the formula
    from transformers.models.qwen3 import modeling_qwen3 as mq

    original = rotary._ORIGINAL["transformers.models.qwen3.modeling_qwen3"]
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 3, 8, generator=g), torch.randn(2, 2, 3, 8, generator=g)
    cos, sin = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    for on in (False, True):
        with rotary.fused_rotary(on):
            for got, want in zip(
                mq.apply_rotary_pos_emb(q, k, cos, sin), original(q, k, cos, sin), strict=True
            ):
                assert torch.equal(got, want)
    half = [t.to(torch.bfloat16) for t in (q, k, cos, sin)]
    assert rotary.applies(*half) and not rotary.applies(q, k, cos, sin)
    assert not rotary.applies(
        half[0][..., :7], half[1][..., :7], half[2][..., :7], half[3][..., :7]
    )
    assert not StaticHFModel(model, cuda_graphs=False).fused_rotary  # CPU: the module's operations


@pytest.mark.gpu
def test_kernel_on_cuda_is_the_modules_operations_and_the_logits_are_unchanged() -> None:
    if not torch.cuda.is_available() or not rotary.available(torch.device("cuda")):
        pytest.skip("needs CUDA and Triton")
    namespace: dict[str, object] = {}
    exec(CASES, namespace)
    out = namespace["run"]([torch.bfloat16, torch.float16], "cuda")  # type: ignore[operator]
    assert len(out) == 6 and all(equal and layout for equal, layout in out.values()), out
    base = from_preset(
        "qwen3-tiny", seed=3, num_hidden_layers=2, device="cuda", dtype=torch.bfloat16
    )
    logits = []
    for fused in (True, False):
        m = StaticHFModel(base, fused_rotary=fused)
        assert m.fused_rotary == fused
        cache, first = m.prefill_shared(torch.tensor([5, 3, 9, 1], device="cuda"), 8)
        step = m.forward(cache, torch.arange(8, device="cuda")[:, None])  # a graph replay
        verify = m.forward(cache, torch.arange(40, device="cuda").reshape(8, 5))
        logits.append((first, step, verify))
        assert m.graph_error is None, m.graph_error
    for a, b in zip(*logits, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_one_compile_for_every_prompt_length_on_cuda() -> None:
    """Rotations at seven query counts (a decode step, a verify, prompt prefills) compile the
    kernel once per head count (q's and k's), not once per length as a constexpr S did."""
    if not torch.cuda.is_available() or not rotary.available(torch.device("cuda")):
        pytest.skip("needs CUDA and Triton")
    from test_decode_attention import compiled_variants

    kernel = rotary._kernel()
    before = compiled_variants(kernel)
    for S in (1, 5, 7, 13, 29, 40, 57):
        x = torch.randn(2, S, 16, 128, device="cuda").to(torch.bfloat16).transpose(1, 2)
        cos = torch.randn(2, S, 128, device="cuda").to(torch.bfloat16)
        rotary.rotate(x, cos, cos)
    assert compiled_variants(kernel) - before <= 1
