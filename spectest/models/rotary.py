"""The rotary position embedding in one Triton kernel per tensor, for ``static``: ``fused_rotary``
(a context under which the modeling modules of a known formula rotate q and k with ``rotate``),
``install``, ``available`` and ``rotate`` itself. The slow reference is transformers' own
``apply_rotary_pos_emb``. Knows nothing about caches, decoding or sampling. Why and details:
docs/internals.md "spectest/models/rotary.py".
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch

# modeling modules whose ``apply_rotary_pos_emb`` is, word for word, the formula ``rotate``
# computes: cos/sin unsqueezed at ``unsqueeze_dim``, ``x·cos + rotate_half(x)·sin`` with
# ``rotate_half(x) = cat(-x[D/2:], x[:D/2])``, each operation rounded to x's dtype
FORMULA = frozenset(
    {
        "transformers.models.llama.modeling_llama",
        "transformers.models.mistral.modeling_mistral",
        "transformers.models.qwen2.modeling_qwen2",
        "transformers.models.qwen3.modeling_qwen3",
        "transformers.models.qwen2_moe.modeling_qwen2_moe",
        "transformers.models.qwen3_moe.modeling_qwen3_moe",
    }
)
DTYPES = (torch.bfloat16, torch.float16)  # float32 keeps the module's operations
_ON: ContextVar[bool] = ContextVar("spectest_fused_rotary", default=False)  # per thread
_ORIGINAL: dict[str, Callable[..., Any]] = {}


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, or None (no Triton, or ``SPECTEST_NO_KERNELS`` set)."""
    if os.environ.get("SPECTEST_NO_KERNELS"):
        return None
    try:
        import triton
        import triton.language as tl
    except Exception:  # any import failure means: the module's operations
        return None

    # fmt: off
    @triton.jit
    def spectest_rotary(
        X, C, S_, O, H,  # pointers (x [B, H, S, D], cos/sin [B, S, D], out like x), heads
        sxb, sxh, sxs, sxd, scb, scs, scd, ssb, sss, ssd, sob, soh, sos, sod,  # strides
        HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # NOTE no S: the grid has the positions (a constexpr S compiled once per prompt length)
        # fmt: on
        b = tl.program_id(0).to(tl.int64)  # the row: b·stride can pass 2³¹
        s = tl.program_id(1)  # the position
        h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H] heads
        d = tl.arange(0, BLOCK_D)  # [BLOCK_D] the first half's index
        ok = (h < H)[:, None] & (d < HALF)[None, :]
        x_at = X + b * sxb + s * sxs + h[:, None] * sxh + d[None, :] * sxd
        x1 = tl.load(x_at, mask=ok, other=0.0)
        x2 = tl.load(x_at + HALF * sxd, mask=ok, other=0.0)
        c_at = C + b * scb + s * scs + d * scd
        s_at = S_ + b * ssb + s * sss + d * ssd
        c1 = tl.load(c_at, mask=d < HALF, other=0.0)[None, :].to(tl.float32)
        c2 = tl.load(c_at + HALF * scd, mask=d < HALF, other=0.0)[None, :].to(tl.float32)
        s1 = tl.load(s_at, mask=d < HALF, other=0.0)[None, :].to(tl.float32)
        s2 = tl.load(s_at + HALF * ssd, mask=d < HALF, other=0.0)[None, :].to(tl.float32)
        dt = x1.dtype
        # torch's operations on 16-bit tensors: each product and the sum in float32, each
        # rounded to x's dtype (the launch turns FMA contraction off: docs/internals.md)
        a1 = (x1.to(tl.float32) * c1).to(dt)  # x·cos, first half
        a2 = (x2.to(tl.float32) * c2).to(dt)  # x·cos, second half
        r1 = (-(x2.to(tl.float32)) * s1).to(dt)  # rotate_half(x)·sin = (-x2, x1)·sin
        r2 = (x1.to(tl.float32) * s2).to(dt)
        o_at = O + b * sob + s * sos + h[:, None] * soh + d[None, :] * sod
        tl.store(o_at, (a1.to(tl.float32) + r1.to(tl.float32)).to(dt), mask=ok)
        tl.store(o_at + HALF * sod, (a2.to(tl.float32) + r2.to(tl.float32)).to(dt), mask=ok)

    return spectest_rotary


def available(device: torch.device) -> bool:
    """Whether ``rotate`` can run on ``device``: CUDA, Triton installed, ``SPECTEST_NO_KERNELS``
    unset."""
    return device.type == "cuda" and _kernel() is not None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x·cos + rotate_half(x)·sin`` for ``x`` ``[B, H, S, D]`` and ``cos``/``sin`` ``[B, S, D]``
    (``unsqueeze_dim=1``), in one launch; the output has ``x``'s layout (``empty_like``).

    Notes
    -----
    Bit for bit the module's five operations on 16-bit tensors: each multiply and the add in
    float32, rounded to ``x``'s dtype after each, as torch computes them (tests/test_rotary.py).
    """
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("rotary kernel: triton is not importable")
    B, H, S, D = (int(n) for n in x.shape)
    out = torch.empty_like(x)
    block_h = min(16, _pow2(H))
    grid = (B, S, -(-H // block_h))
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        kernel[grid](
            x, cos, sin, out, H, *x.stride(), *cos.stride(), *sin.stride(), *out.stride(),
            HALF=D // 2, BLOCK_H=block_h, BLOCK_D=_pow2(D // 2),
            enable_fp_fusion=False,  # NOTE no FMA: it would skip the product's rounding
        )  # fmt: skip
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def applies(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the call is ``rotate``'s: 16-bit q and k of one dtype, ``[B, H, S, D]`` with an
    even ``D``, and ``cos``/``sin`` ``[B, S, D]`` of that dtype."""
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    B, _, S, D = (int(n) for n in q.shape)
    return (
        q.dtype in DTYPES
        and k.dtype == cos.dtype == sin.dtype == q.dtype
        and D % 2 == 0
        and (int(k.shape[0]), int(k.shape[2]), int(k.shape[3])) == (B, S, D)
        and tuple(int(n) for n in cos.shape) == (B, S, D)
    )


def install(model: torch.nn.Module) -> bool:
    """Make ``model``'s modeling module (one of ``FORMULA``) dispatch its ``apply_rotary_pos_emb``
    on ``fused_rotary`` (unchanged outside it); False when the module is not one of them."""
    name = type(model).__module__
    module = sys.modules.get(name)
    if name not in FORMULA or module is None or not hasattr(module, "apply_rotary_pos_emb"):
        return False
    if name not in _ORIGINAL:
        _ORIGINAL[name] = module.apply_rotary_pos_emb
        setattr(module, "apply_rotary_pos_emb", functools.partial(_dispatch, name))  # noqa: B010
    return True


def _dispatch(
    name: str, q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any
) -> tuple[Any, Any]:
    dim = args[0] if args else kwargs.get("unsqueeze_dim", 1)
    if _ON.get() and q.is_cuda and dim == 1 and len(args) <= 1 and set(kwargs) <= {"unsqueeze_dim"}:
        if applies(q, k, cos, sin):
            return rotate(q, cos, sin), rotate(k, cos, sin)
    out: tuple[Any, Any] = _ORIGINAL[name](q, k, cos, sin, *args, **kwargs)
    return out


@contextlib.contextmanager
def fused_rotary(on: bool = True) -> Iterator[None]:
    """Run the forwards inside (on this thread only) with ``install``'s modules rotating in one
    kernel per tensor when ``on``; a CUDA-graph capture inside keeps the kernels for every
    replay."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)
