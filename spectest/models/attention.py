"""Grouped-query attention without the key/value copy, for ``static``: ``packed_gqa_sdpa``, its
reference ``repeat_kv_sdpa``, ``packed_attention`` and the lock it takes (``CONFIG_LOCK``). Knows
nothing about caches or sampling. Why and details: docs/internals.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch

from spectest.models import decode_attention

IMPLEMENTATION = "spectest_packed_gqa"  # the name registered in transformers' AttentionInterface
_KERNEL: ContextVar[bool] = ContextVar("spectest_decode_kernel", default=False)  # per thread
# the pool's count of leading slots every row holds alike (``decode_attention.gqa_decode``'s
# ``shared``), for the kernel's calls inside ``decode_kernel``; None: every row read as its own
_SHARED: ContextVar[torch.Tensor | None] = ContextVar("spectest_shared_slots", default=None)


class ConfigLock:
    """A readers-writer lock over the models' attention setting: ``exclusive`` for the forwards
    that switch it (``packed_attention``), ``shared`` for every other forward. A waiting writer
    goes first (new readers wait), and the thread that holds it exclusively may take it again
    either way, so a forward inside a switched one cannot deadlock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer: int | None = None  # the thread holding it exclusively
        self._depth = 0  # its nested exclusive holds
        self._waiting = 0  # writers waiting

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:  # inside this thread's exclusive hold
                mine = False
            else:
                while self._writer is not None or self._waiting:
                    self._cond.wait()
                self._readers += 1
                mine = True
        try:
            yield
        finally:
            if mine:
                with self._cond:
                    self._readers -= 1
                    if not self._readers:
                        self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                self._waiting += 1
                while self._writer is not None or self._readers:
                    self._cond.wait()
                self._waiting -= 1
                self._writer = me
            self._depth += 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                    self._cond.notify_all()


CONFIG_LOCK = ConfigLock()  # one per process: every model's attention setting


def packed_gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, S, D]
    key: torch.Tensor,  # [B, Hkv, W, D]
    value: torch.Tensor,  # [B, Hkv, W, Dv]
    attention_mask: torch.Tensor | None,  # [B, 1, S, W] bool or additive, or None
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA over the ``Hkv`` key/value heads with the ``G`` query heads of each packed into rows.

    Returns ``([B, S, Hq, Dv], None)``, the layout of transformers' ``sdpa_attention_forward``.
    Only for the fast engine's static cache: an explicit mask is required (no ``is_causal``), no
    softcap, sliding window or position bias (``NotImplementedError`` names the feature). Under
    ``decode_kernel`` a call ``decode_attention.applies`` to (a boolean mask, half precision) runs
    that Triton kernel instead of SDPA.
    """
    for name in ("softcap", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"packed GQA attention: {name} is not supported")
    if attention_mask is None:
        raise NotImplementedError("packed GQA attention needs the static cache's explicit mask")
    B, Hq, S, D = (int(s) for s in query.shape)
    Hkv = int(key.shape[1])
    assert Hq % Hkv == 0 and key.shape[0] == B, (tuple(query.shape), tuple(key.shape))
    G = Hq // Hkv
    kernel = _KERNEL.get() and not dropout
    if kernel and decode_attention.applies(query, key, value, attention_mask):
        scale = float(scaling) if scaling is not None else D**-0.5
        out = decode_attention.gqa_decode(
            query, key, value, attention_mask, scale, shared=_SHARED.get()
        )
        return out, None
    q = query.reshape(B, Hkv, G * S, D)  # [B, Hkv, G·S, D]: row g·S + s = head kv·G + g, query s
    mask = attention_mask
    if G > 1:
        M = attention_mask  # [B, 1, S, W]
        assert M.shape[1] == 1, tuple(M.shape)  # one mask shared by every head
        mask = (
            M[:, :, None]
            .expand(M.shape[0], 1, G, S, M.shape[-1])
            .reshape(M.shape[0], 1, G * S, M.shape[-1])
        )  # [B, 1, G·S, W]: block g repeats the S mask rows
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=False
    )  # [B, Hkv, G·S, Dv]
    out = out.reshape(B, Hq, S, int(value.shape[-1]))  # [B, Hq, S, Dv]
    return out.transpose(1, 2).contiguous(), None  # [B, S, Hq, Dv]


def repeat_kv_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, S, D]
    key: torch.Tensor,  # [B, Hkv, W, D]
    value: torch.Tensor,  # [B, Hkv, W, Dv]
    attention_mask: torch.Tensor | None,  # [B, 1, S, W]
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Slow reference: keys and values copied to ``Hq`` heads (transformers' ``repeat_kv``), one
    SDPA over ``Hq`` heads; ``([B, S, Hq, Dv], None)``."""
    G = int(query.shape[1]) // int(key.shape[1])
    k = key.repeat_interleave(G, dim=1)  # [B, Hq, W, D]: head h reads KV head h // G
    v = value.repeat_interleave(G, dim=1)  # [B, Hq, W, Dv]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, k, v, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False
    )  # [B, Hq, S, Dv]
    return out.transpose(1, 2).contiguous(), None


def register() -> bool:
    """Register ``packed_gqa_sdpa`` (and the sdpa mask builder) under ``IMPLEMENTATION`` in the
    installed transformers; False when this transformers has no ``AttentionInterface``."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(IMPLEMENTATION, packed_gqa_sdpa)
    with contextlib.suppress(ImportError, AttributeError):  # mask interface: transformers >= 4.53
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return True


def usable(config: Any) -> bool:
    """Whether a model of ``config`` can run the packed function in place of its own: sdpa
    attention with grouped KV heads, and a transformers that can register it."""
    impl = getattr(config, "_attn_implementation", None)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv = int(getattr(config, "num_key_value_heads", heads) or heads)
    switchable = hasattr(config, "_attn_implementation_internal")  # what packed_attention sets
    return (
        impl == "sdpa" and switchable and kv > 0 and heads > kv and heads % kv == 0 and register()
    )


@contextlib.contextmanager
def packed_attention(config: Any) -> Iterator[None]:
    """Run the forwards inside with ``IMPLEMENTATION`` as ``config``'s attention function (HF
    attention modules read ``config._attn_implementation`` at every forward), then restore it.

    NOTE one model object serves the reference engine and the fast engine (the static model shares
    its weights and config), so the switch lasts one forward (or one CUDA-graph capture: a replay
    runs no Python) and is undone in ``finally``. It holds ``CONFIG_LOCK`` exclusively, and every
    other forward of an ``HFModel`` holds it shared: a forward on another thread (the tooth sizes
    beside generation, ``teeth_phase``) never sees the switch.
    """
    with CONFIG_LOCK.exclusive():
        old = config._attn_implementation_internal
        config._attn_implementation_internal = IMPLEMENTATION
        try:
            yield
        finally:
            config._attn_implementation_internal = old


@contextlib.contextmanager
def decode_kernel(on: bool = True, shared: torch.Tensor | None = None) -> Iterator[None]:
    """Let ``packed_gqa_sdpa`` run ``decode_attention.gqa_decode`` (on this thread only) for the
    calls it applies to when ``on``, with ``shared`` (the key/value pool's count of leading
    slots every row holds alike, a device tensor, or None); a CUDA-graph capture inside keeps
    the kernel, and reads ``shared`` afresh at every replay."""
    token, token_shared = _KERNEL.set(bool(on)), _SHARED.set(shared)
    try:
        yield
    finally:
        _SHARED.reset(token_shared)
        _KERNEL.reset(token)
