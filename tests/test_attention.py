"""Packed GQA attention (models/attention.py) against its references: ``repeat_kv_sdpa`` and
transformers' own ``sdpa_attention_forward`` on random inputs, and inside ``StaticHFModel``
(the packed function is really called; logits equal the unpacked static model's)."""

from __future__ import annotations

import pytest
import torch

from spectest.models import attention
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel


class _Module(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(B: int, Hq: int, Hkv: int, S: int, W: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((B, Hq, S, 16), generator=g)  # [B, Hq, S, D]
    k = torch.randn((B, Hkv, W, 16), generator=g)  # [B, Hkv, W, D]
    v = torch.randn((B, Hkv, W, 16), generator=g)  # [B, Hkv, W, D]
    mask = torch.rand((B, 1, S, W), generator=g) < 0.6  # [B, 1, S, W] bool, with holes
    mask[..., 0] = True  # every query sees something
    return q, k, v, mask


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (4, 2), (16, 8), (8, 1)])
@pytest.mark.parametrize("S", [1, 5])
def test_packed_equals_repeat_kv_and_transformers(Hq: int, Hkv: int, S: int) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, mask = _inputs(3, Hq, Hkv, S, 37, seed=Hq * 10 + S)
    module = _Module(Hq // Hkv)
    got, _ = attention.packed_gqa_sdpa(module, q, k, v, mask, scaling=0.25)
    ref, _ = attention.repeat_kv_sdpa(module, q, k, v, mask, scaling=0.25)
    hf, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert got.shape == ref.shape == hf.shape == (3, S, Hq, 16)
    # float32: the same per-row softmax(q Kᵀ·scale + mask) V, rounding of the kernel only
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, hf, rtol=1e-5, atol=1e-6)


def test_packed_refuses_what_it_does_not_implement() -> None:
    q, k, v, mask = _inputs(1, 4, 2, 2, 8, seed=0)
    with pytest.raises(NotImplementedError, match="explicit mask"):
        attention.packed_gqa_sdpa(_Module(2), q, k, v, None)
    with pytest.raises(NotImplementedError, match="softcap"):
        attention.packed_gqa_sdpa(_Module(2), q, k, v, mask, softcap=30.0)


def test_static_model_uses_packed_attention_and_restores_config() -> None:
    """qwen3-tiny has 4 query heads on 2 KV heads: the static model packs them; the logits equal
    the unpacked static model's to float32 rounding; the shared config is restored afterwards."""
    base = from_preset("qwen3-tiny", seed=5, logit_scale=12.0)
    packed = StaticHFModel(base, max_slots=16, cuda_graphs=False)
    plain = StaticHFModel(base, max_slots=16, cuda_graphs=False, packed_gqa=False)
    assert packed.packed_gqa and not plain.packed_gqa
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    outs = []
    for m in (packed, plain):
        cache, _ = m.prefill_shared(ids[0, :2], 2)
        outs.append(m.forward(cache, ids[:, 2:].expand(2, -1)))  # [2, 4, V]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert base.config._attn_implementation == "sdpa"

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("packed attention called")

    from transformers import AttentionInterface

    AttentionInterface.register(attention.IMPLEMENTATION, boom)
    try:
        cache, _ = plain.prefill_shared(ids[0, :2], 1)  # the unpacked model never calls it
        with pytest.raises(RuntimeError, match="packed attention called"):
            packed.prefill_shared(ids[0, :2], 1)
    finally:
        AttentionInterface.register(attention.IMPLEMENTATION, attention.packed_gqa_sdpa)
    assert base.config._attn_implementation == "sdpa"  # restored after the error too


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_equals_repeat_kv_on_cuda(dtype: torch.dtype) -> None:
    """On CUDA the packed call may pick another SDPA kernel than the 16-head call: equal to
    float32 rounding (bf16: to bf16 rounding)."""
    q, k, v, mask = (t.cuda() for t in _inputs(64, 16, 8, 5, 160, seed=1))
    q, k, v = (t.to(dtype) for t in (q, k, v))
    got, _ = attention.packed_gqa_sdpa(_Module(2), q, k, v, mask[:, :, :, :], scaling=0.25)
    ref, _ = attention.repeat_kv_sdpa(_Module(2), q, k, v, mask, scaling=0.25)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.float(), ref.float(), **tol)
