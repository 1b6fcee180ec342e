"""Grouped-query attention over a static cache as one Triton kernel, for ``attention``:
``gqa_decode`` (one program per (row, key/value head, tile of 16 packed queries) streams that
head's keys and values once; the ``G`` query heads of the head times the ``S`` queries are the
packed rows, so a decode step is one tile per head), ``applies`` and ``available``. The slow
reference is ``attention.packed_gqa_sdpa``. Knows nothing about caches, models or sampling. Why
and details: docs/internals.md "spectest/models/decode_attention.py".
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import torch

from spectest.errors import ModelError

BLOCK_M = 16  # packed query rows per program, whatever S: a row's bits do not depend on S (Notes)
BLOCK_N = 32  # key slots per step of the online softmax (the static cache's windows are 32k)
# the probabilities' precision in P·V (``pv_mode``): rounded to the value dtype (as FlashAttention
# does), float32 (IEEE products, no tensor cores), or two half-precision parts (the default)
PV_MODES = ("half", "float32", "split")
pv_step: Any = None  # the kernel's P·V step, a Triton function (``_define_pv_step``)
DTYPES = (torch.bfloat16, torch.float16)  # float32 keeps SDPA (Triton's dot would be TF32)


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, or None (no Triton, or ``SPECTEST_NO_KERNELS``: SDPA); see Notes."""
    if os.environ.get("SPECTEST_NO_KERNELS"):
        return None
    try:
        import triton.language  # noqa: F401  (imports triton too)
    except Exception:  # any import failure means: use SDPA
        return None
    _define_pv_step()
    return _jit_kernel()


def _jit_kernel() -> Any:
    """The kernel itself, jitted (``_kernel`` checked that Triton imports)."""
    import triton
    import triton.language as tl

    # fmt: off
    @triton.jit(do_not_specialize=["W", "S"])
    def spectest_gqa_decode(
        Q, K, V, M, O, SH, scale, W, S,  # pointers, the window (slots), queries; Triton's naming
        sqb, sqh, sqs, sqd, skb, skh, skw, skd, svb, svh, svw, svd, smb, sms, smw,  # strides
        sob, sos, soh, sod,
        G: tl.constexpr, D: tl.constexpr, SHARED: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PV: tl.constexpr,
    ):
        # fmt: on
        b = tl.program_id(0).to(tl.int64)  # the row: b·stride can pass 2³¹ in a large pool
        h = tl.program_id(1)  # the key/value head
        r = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = g·S + s: head h·G + g
        g, s = r // S, r % S
        live = r < G * S
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        q_ptr = Q + b * sqb + (h * G + g)[:, None] * sqh + s[:, None] * sqs + d[None, :] * sqd
        q = tl.load(q_ptr, mask=live[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of each row
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if SHARED:  # the leading slots every row holds alike: read from row 0 (cached in L2)
            shared = tl.load(SH)
        else:
            shared = 0
        for start in range(0, W, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] slots
            n_ok = n < W
            kv_ok = n_ok[:, None] & d_ok[None, :]
            src = tl.where(n < shared, 0, b)  # [BLOCK_N] the row each slot's key/value is read from
            k_ptr = K + src[:, None] * skb + h * skh + n[:, None] * skw + d[None, :] * skd
            k = tl.load(k_ptr, mask=kv_ok, other=0.0)  # [BLOCK_N, BLOCK_D]
            qk = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_M, BLOCK_N] float32
            seen = tl.load(
                M + b * smb + s[:, None] * sms + n[None, :] * smw,
                mask=live[:, None] & n_ok[None, :],
                other=0,
            )
            qk = tl.where(seen != 0, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing
            p = tl.exp(qk - m_use[:, None])  # [BLOCK_M, BLOCK_N]
            alpha = tl.exp(m_i - m_use)
            v_ptr = V + src[:, None] * svb + h * svh + n[:, None] * svw + d[None, :] * svd
            v = tl.load(v_ptr, mask=kv_ok, other=0.0)  # [BLOCK_N, BLOCK_D]
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = pv_step(acc, alpha, p, v, PV)  # [BLOCK_M, BLOCK_D]
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptr = O + b * sob + s[:, None] * sos + (h * G + g)[:, None] * soh + d[None, :] * sod
        tl.store(o_ptr, out.to(O.dtype.element_ty), mask=live[:, None] & d_ok[None, :])

    return spectest_gqa_decode


def _define_pv_step() -> None:
    """Set ``pv_step``: the kernel's step ``acc · alpha + P·V`` with the probabilities at
    ``PV_MODES[PV]``'s precision (a Triton function, inlined into the kernel; a module global,
    since Triton's interpreter resolves no closure variables)."""
    global pv_step
    import triton
    import triton.language as tl

    @triton.jit
    def spectest_pv_step(acc, alpha, p, v, PV: tl.constexpr):
        if PV == 1:  # the probabilities in float32 (IEEE products, no tensor cores)
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        elif PV == 2:  # as two half-precision parts: 16 of p's mantissa bits
            p_hi = p.to(v.dtype)
            p_lo = (p - p_hi.to(tl.float32)).to(v.dtype)
            acc = acc * alpha[:, None] + (tl.dot(p_hi, v) + tl.dot(p_lo, v))
        else:  # rounded to the value dtype, as FlashAttention does
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return acc

    pv_step = spectest_pv_step


def pv_mode() -> str:
    """``SPECTEST_ATTN_PV`` (default ``split``): how the kernel rounds the softmax probabilities
    before their product with the values, one of ``PV_MODES``; an A/B switch like
    ``SPECTEST_NO_KERNELS``, recorded in the fast engine's provenance (``attention_pv``).

    Notes
    -----
    ``half`` rounds each probability to the value dtype (8 significant bits in bfloat16);
    ``float32`` keeps them (the product on IEEE float32 FMAs); ``split`` multiplies a high and a
    low half-precision part (16 bits, two tensor-core products). Each mode is schedule-invariant.
    Why it is a switch: docs/internals.md "spectest/models/decode_attention.py" (the drift at
    8B on fixed tokens moves with the kernel's rounding).
    """
    mode = os.environ.get("SPECTEST_ATTN_PV") or "split"
    if mode not in PV_MODES:
        raise ModelError(f"SPECTEST_ATTN_PV={mode!r}: expected one of {', '.join(PV_MODES)}")
    return mode


def settings() -> str:
    """The environment's kernel switches as one string (``SPECTEST_NO_KERNELS``,
    ``SPECTEST_ATTN_PV``): part of a ``--fast`` arm's fingerprint (``runner._fingerprints``), as
    they change a CUDA run's tokens."""
    if os.environ.get("SPECTEST_NO_KERNELS"):
        return "kernels=off"
    return f"kernels=on,attention_pv={pv_mode()}"


def available(device: torch.device) -> bool:
    """Whether ``gqa_decode`` can run on ``device``: CUDA, Triton installed, ``SPECTEST_NO_KERNELS``
    unset."""
    return device.type == "cuda" and _kernel() is not None


def applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any) -> bool:
    """Whether the call's shapes and dtypes are the kernel's: a boolean ``[B, 1, S, W]`` mask, a
    half-precision query, equal key and value head sizes."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
        return False
    _, Hq, S, D = (int(x) for x in query.shape)
    Hkv = int(key.shape[1])
    return (
        query.dtype in DTYPES
        and key.dtype == value.dtype == query.dtype
        and int(value.shape[-1]) == D == int(key.shape[-1])
        and Hq % Hkv == 0
        and int(mask.shape[1]) == 1
        and tuple(mask.shape[2:]) == (S, int(key.shape[2]))
    )


def gqa_decode(
    query: torch.Tensor,  # [B, Hq, S, D]
    key: torch.Tensor,  # [B, Hkv, W, D]
    value: torch.Tensor,  # [B, Hkv, W, D]
    mask: torch.Tensor,  # [B, 1, S, W] bool: True where the query sees the slot
    scale: float,
    *,
    shared: torch.Tensor | None = None,
    block_n: int = BLOCK_N,
    num_warps: int = 2,
) -> torch.Tensor:
    """Softmax attention of every query head over its key/value head's slots in ``mask``, as
    ``[B, S, Hq, D]`` (transformers' layout after attention); any strides, no copies.
    ``shared``: a one-element int64 tensor on the device, the count of leading slots whose keys
    and values are the same in every row (a prompt prefilled once and copied to every row:
    ``static.StaticHFModel.prefill_shared``); those are read from row 0, so a batch reads them
    from memory once, not once per row. Read at run time (a CUDA graph replays the value of the
    moment). ``block_n`` (slots a step, a power of two >= 16) and ``num_warps`` are the launch's
    tuning.

    Notes
    -----
    Scores, the running max and sum and the output accumulate in float32; the probabilities are
    rounded to the value dtype before their product with the values, as FlashAttention does (by
    default: ``pv_mode``). So a bf16 output can differ from SDPA's in its last bits. A query's
    output is computed from its own query row, its mask row and the slots in order, 32 at a
    time, in tiles of a fixed ``BLOCK_M``: its bits depend neither on the batch size, nor on how
    many queries the forward has (a prompt prefill, a verify of K + 1, a decode step), nor on
    masked slots after the last it sees (each adds exact zeros). So the static model computes a
    position's attention the same way in every schedule, and claim (b) measures only the GEMMs'
    differences (docs/internals.md). A query that sees no slot gets zeros (SDPA gives NaN). The
    window ``W`` and the query count ``S`` are runtime values, not specialised: one compile for
    every prompt length. ``pv_mode`` says how the probabilities are rounded before their
    product. Reading a shared slot from row 0 loads the same values the row holds: the same bits
    (the caller's promise that they are the same is the contract of ``shared``).
    """
    kernel = _kernel()
    assert kernel is not None and applies(query, key, value, mask)
    B, Hq, S, D = (int(x) for x in query.shape)
    Hkv, W = int(key.shape[1]), int(key.shape[2])
    G = Hq // Hkv
    out = torch.empty((B, S, Hq, D), dtype=query.dtype, device=query.device)
    m8 = mask.view(torch.uint8)  # same strides, loadable bytes
    # Triton launches on the current device: make it the tensors' (scale-out workers)
    with torch.cuda.device(query.device) if query.is_cuda else contextlib.nullcontext():
        kernel[(B, Hkv, -(-G * S // BLOCK_M))](
            query, key, value, m8, out, m8 if shared is None else shared, float(scale), W, S,
            *query.stride(), *key.stride(), *value.stride(),
            m8.stride(0), m8.stride(2), m8.stride(3), *out.stride(),
            G=G, D=D, SHARED=shared is not None,
            BLOCK_M=BLOCK_M, BLOCK_D=max(16, 1 << (D - 1).bit_length()), BLOCK_N=block_n,
            PV=PV_MODES.index(pv_mode()), num_warps=num_warps,
        )  # fmt: skip
    return out
