"""RMSNorm in one fused kernel for ``static``: ``fused_norms`` (a context under which the RMSNorm
modules of a known formula run ``fused_rms_norm``), ``install`` and ``available``; the slow
reference is the module's own forward. Knows nothing about caches, decoding or sampling. Why and
details: docs/internals.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch

# classes whose forward is, word for word, transformers' T5-style RMSNorm: x cast to float32,
# x·rsqrt(mean(x²) + variance_epsilon), cast back to x's dtype, times ``weight``
FORMULA = frozenset(
    {
        "LlamaRMSNorm",
        "MistralRMSNorm",
        "Qwen2RMSNorm",
        "Qwen2MoeRMSNorm",
        "Qwen3RMSNorm",
        "Qwen3MoeRMSNorm",
    }
)
_ON: ContextVar[bool] = ContextVar("spectest_fused_norms", default=False)  # per thread
_ORIGINAL: dict[type, Callable[..., torch.Tensor]] = {}


def available(device: torch.device) -> bool:
    """Whether ``device`` has torch's fused RMSNorm kernel (CUDA, torch >= 2.8): elsewhere
    ``rms_norm`` is the same composite of small operations as the module's own forward."""
    return device.type == "cuda" and hasattr(torch.ops.aten, "_fused_rms_norm")


def fused_rms_norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s RMSNorm of ``x`` [..., D] as two kernels: the normalisation (float32 inside,
    rounded once to ``x``'s dtype, as the module's ``.to(input_dtype)``) then ``weight ·``.

    Notes
    -----
    The same maths as the module's forward; only the float32 sum of squares may be added in
    another order (and ``rsqrt`` is the kernel's), so a bf16 output can differ in its last bit.
    """
    eps = float(module.variance_epsilon)  # type: ignore[arg-type]
    weight: torch.Tensor = module.weight  # type: ignore[assignment]
    y = torch.nn.functional.rms_norm(x, (int(x.shape[-1]),), None, eps)  # [..., D] x.dtype
    return weight * y


def install(model: torch.nn.Module) -> int:
    """Make the RMSNorm classes in ``FORMULA`` used by ``model`` dispatch on ``fused_norms``
    (their forward unchanged outside it); returns how many of ``model``'s modules can fuse."""
    n = 0
    for m in model.modules():
        cls = type(m)
        if cls.__name__ not in FORMULA or not hasattr(m, "variance_epsilon"):
            continue
        n += 1
        if cls not in _ORIGINAL:
            _ORIGINAL[cls] = cls.forward
            cls.forward = _dispatch
    return n


def _dispatch(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if _ON.get():
        return fused_rms_norm(self, hidden_states)
    cls = next(c for c in type(self).__mro__ if c in _ORIGINAL)
    return _ORIGINAL[cls](self, hidden_states)


@contextlib.contextmanager
def fused_norms(on: bool = True) -> Iterator[None]:
    """Run the forwards inside (on this thread only) with ``install``'s classes fused when
    ``on``; a CUDA-graph capture inside keeps the fused kernels for every replay."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)
