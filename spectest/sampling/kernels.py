"""``weight_sum``: the shortlist's full-vocabulary float64 normaliser ``sum_j exp((x_j - mx) / T)``
as one Triton kernel on CUDA (a row per program, every operation in float64), and the torch
expression it replaces (``weight_sum_reference``). Knows nothing about laws or engines. Why and
details: docs/internals.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import torch

from spectest.sampling.scaled import law_values

BLOCK = 2048  # loads per step of a program (a row is V / BLOCK steps)
# logit dtypes the kernel reads as they are: each converts to float64 exactly (the model's own
# bfloat16 / float16 logits need no float32 copy first)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def weight_sum_reference(
    x: torch.Tensor, t: torch.Tensor, mx: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """``[M]`` float64: ``exp((float64(x) - mx) / t).sum(-1)`` for ``x`` ``[M, V]``, ``t`` ``[M]``,
    ``mx`` ``[M, 1]`` float64 — the reference's operations in its order (``shortlist._weights``);
    with ``scale``, of the law's values ``scaled.law_values(x, scale)`` of native logits ``x``."""
    w = law_values(x, scale).to(torch.float64)  # [M, V]
    if w.data_ptr() == x.data_ptr():
        w = w.clone()
    return w.sub_(mx).div_(t.to(torch.float64)[:, None]).exp_().sum(-1)


def weight_sum(
    x: torch.Tensor, t: torch.Tensor, mx: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """``weight_sum_reference`` in one fused read of ``x`` where the kernel applies (float32
    logits on CUDA, Triton importable, ``SPECTEST_NO_KERNELS`` unset); the reference otherwise.

    Parameters
    ----------
    x : ``[M, V]`` logits: float32, bfloat16 or float16 (the kernel), float64 (the reference).
    t : ``[M]`` temperatures (> 0).
    mx : ``[M, 1]`` float64 row maxima of ``x``.
    scale : ``x`` is native bfloat16 / float16 logits standing for ``fl32(x) · scale``
        (``sampling.scaled``): the kernel multiplies in float32 as the model did.

    Returns
    -------
    ``[M]`` float64; equal to the reference up to float64 reduction order (docs/internals.md).
    """
    if not (x.is_cuda and x.dtype in KERNEL_DTYPES and x.dim() == 2 and _kernel() is not None):
        return weight_sum_reference(x, t, mx, scale)
    return launch(x, t, mx, scale)


def launch(
    x: torch.Tensor, t: torch.Tensor, mx: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Run the Triton kernel on ``x`` (any device Triton runs on: CUDA, or CPU tensors under
    ``TRITON_INTERPRET=1`` for the tests); ``weight_sum``'s contract."""
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("weight_sum kernel: triton is not importable")
    x = x.contiguous()
    M, V = (int(s) for s in x.shape)
    out = torch.empty(M, dtype=torch.float64, device=x.device)
    if M:
        t64 = t.to(device=x.device, dtype=torch.float64).contiguous()
        m64 = mx.to(device=x.device, dtype=torch.float64).reshape(M).contiguous()
        # Triton launches on the current device: make it x's (multi-GPU workers)
        with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
            s, scaled = (1.0, False) if scale is None else (float(scale), True)
            kernel[(M,)](x, t64, m64, out, s, V=V, BLOCK=BLOCK, SCALED=scaled)
    return out


@functools.cache
def _kernel() -> Any:
    """The jitted kernel, or None (no Triton, or ``SPECTEST_NO_KERNELS`` set)."""
    if os.environ.get("SPECTEST_NO_KERNELS"):
        return None
    try:
        import triton
        import triton.language as tl
    except Exception:  # any import failure means: use the reference
        return None

    # NOTE ``V`` is a compile-time constant (one compilation per vocabulary size), which also
    # keeps the loop bounds static for Triton's interpreter
    @triton.jit
    def _weight_sum_kernel(
        x_ptr,
        t_ptr,
        mx_ptr,
        out_ptr,
        scale,
        V: tl.constexpr,
        BLOCK: tl.constexpr,
        SCALED: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * V
        t = tl.load(t_ptr + row)  # float64
        m = tl.load(mx_ptr + row)  # float64
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(0, V, BLOCK):
            idx = start + offs
            ok = idx < V
            # via float32: both steps exact for float32 / bfloat16 / float16 loads; a scale
            # multiplies in float32 first, as the model's float32 product (``sampling.scaled``)
            v = tl.load(base + idx, mask=ok, other=0.0).to(tl.float32)
            if SCALED:
                v = v * scale
            v = v.to(tl.float64)
            w = tl.exp((v - m) / t)
            acc += tl.where(ok, w, 0.0)
        tl.store(out_ptr + row, tl.sum(acc, axis=0))

    return _weight_sum_kernel
