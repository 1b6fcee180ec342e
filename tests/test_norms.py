"""Fused RMSNorm (models/norms.py) against its reference, the module's own forward: every class in
``FORMULA`` computes the formula ``fused_rms_norm`` computes, the switch lasts one context on one
thread, ``StaticHFModel`` takes it only where asked (CUDA by default), and on CUDA the fused static
model decodes the unfused one's tokens (skipped cleanly without CUDA)."""

from __future__ import annotations

import importlib
import threading

import numpy as np
import pytest
import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec
from spectest.engines.fast import speculative_decode_fast
from spectest.models import norms
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams

MODULES = {  # class name: transformers module
    "LlamaRMSNorm": "llama",
    "MistralRMSNorm": "mistral",
    "Qwen2RMSNorm": "qwen2",
    "Qwen2MoeRMSNorm": "qwen2_moe",
    "Qwen3RMSNorm": "qwen3",
    "Qwen3MoeRMSNorm": "qwen3_moe",
}


def _formula(weight: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The T5-style RMSNorm in float64: x·rsqrt(mean(x²) + eps)·weight."""
    x64 = x.double()
    return weight.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("name", sorted(norms.FORMULA))
def test_formula_classes_compute_the_formula(name: str) -> None:
    """Each class named in ``FORMULA`` (as the installed transformers defines it) and
    ``fused_rms_norm`` on it agree with the float64 formula to float32 rounding, on CPU: a
    transformers release that changed one of them would fail here."""
    assert set(MODULES) == set(norms.FORMULA)
    mod = importlib.import_module(f"transformers.models.{MODULES[name]}.modeling_{MODULES[name]}")
    g = torch.Generator().manual_seed(0)
    m = getattr(mod, name)(48, eps=1e-5)
    with torch.no_grad():
        m.weight.copy_(torch.randn(48, generator=g))
    x = 3 * torch.randn((4, 7, 48), generator=g)  # [B, S, D]
    want = _formula(m.weight, x, 1e-5)
    own = norms._ORIGINAL.get(type(m), type(m).forward)(m, x)
    torch.testing.assert_close(own.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norms.fused_rms_norm(m, x).double(), want, rtol=1e-5, atol=1e-6)


def test_the_switch_is_one_context_on_one_thread() -> None:
    """``install`` changes nothing outside ``fused_norms`` (the same bits as the class's own
    forward); inside, ``rms_norm`` runs; another thread meanwhile still sees the switch off."""
    model = from_preset("qwen3-tiny", seed=5)
    assert norms.install(model.model) == 2 * 2 + 2 * 2 + 1  # 2 layers x (2 + q/k norms) + final
    m = model.model.model.norm
    x = torch.randn((2, 3, int(m.weight.shape[0])))
    calls: list[int] = []
    real = torch.nn.functional.rms_norm

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **k)

    seen: list[bool] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "rms_norm", counted)
        assert torch.equal(m(x), norms._ORIGINAL[type(m)](m, x)) and not calls
        with norms.fused_norms():
            m(x)
            thread = threading.Thread(target=lambda: seen.append(norms._ON.get()))
            thread.start()
            thread.join()
        assert len(calls) == 1
        m(x)
        assert len(calls) == 1
    assert seen == [False]


def test_static_model_fuses_only_where_asked() -> None:
    """Default off on CPU (CPU runs keep ``HFModel``'s operations); forced on, the logits equal
    the unfused static model's (on CPU ``rms_norm`` is the same composite); a model without a
    ``FORMULA`` norm cannot fuse."""
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0)
    assert not StaticHFModel(target, cuda_graphs=False).fused_norms
    on = StaticHFModel(target, cuda_graphs=False, fused_norms=True)
    off = StaticHFModel(target, cuda_graphs=False, fused_norms=False)
    assert on.fused_norms and not off.fused_norms
    ids = torch.tensor([3, 1, 4, 1, 5])
    (c_on, l_on), (c_off, l_off) = on.prefill_shared(ids, 2), off.prefill_shared(ids, 2)
    assert torch.equal(l_on, l_off)
    nxt = torch.tensor([[9], [2]])
    assert torch.equal(on.forward(c_on, nxt), off.forward(c_off, nxt))
    assert norms.install(torch.nn.Sequential(torch.nn.LayerNorm(4))) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_norms_decode_the_same_tokens_on_cuda() -> None:
    """float32 on CUDA, CUDA graphs on: the static model with fused RMSNorms (the default there)
    gives the tokens of the unfused one. The two may round the sum of squares differently in the
    last float32 bits, so a token could flip when a uniform lies within ~1e-6 of a CDF step:
    ~1e-3 chance over this test's 640 tokens and their acceptance draws (fixed keys: it passes or
    fails the same way every time on one platform). In bfloat16 the prompt's logits agree within
    0.05 (the realistic 0.6B model's were bit-identical on the H200: results/LOG.md "lead
    (session 14)")."""
    assert norms.available(torch.device("cuda"))
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, device="cuda", dtype="float32")
    draft = first_layers(target, 1)
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.95)]
    rows = [RowSpec(f"cfg{i}", s, p) for s in range(8) for i, p in enumerate(params)]
    req = DecodeRequest([1, 2, 3], rows, num_positions=40, run_key=99, prompt_id="p")
    outs = []
    for fused in (True, False):
        t = StaticHFModel(target, fused_norms=None if fused else False)
        d = StaticHFModel(draft, fused_norms=None if fused else False)
        assert t.fused_norms == fused
        outs.append(
            speculative_decode_fast(
                t, d, req, drafter=DrafterSpec(onehot=False, k=3), variant=get_variant("exact")
            )
        )
        assert t.graph_error is None and len(t._graphs) > 0, t.graph_error
    assert np.array_equal(outs[0].tokens, outs[1].tokens)
    bf = from_preset("qwen3-tiny", seed=5, device="cuda", dtype="bfloat16")
    ids = torch.tensor([3, 1, 4, 1, 5], device="cuda")
    a = StaticHFModel(bf, fused_norms=True).prefill_shared(ids, 1)[1].float()
    b = StaticHFModel(bf, fused_norms=False).prefill_shared(ids, 1)[1].float()
    torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)
