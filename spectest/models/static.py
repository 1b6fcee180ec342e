"""``StaticHFModel``: an ``HFModel`` with a key/value pool of ``max_slots`` slots per row allocated
once, an explicit attention mask over the slots and, on CUDA, one captured graph per fixed-shape
forward; its cache ``StaticCache``. Knows nothing about sampling, decoding loops or statistics. Why
and details: docs/internals.md.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import nullcontext
from typing import Any

import torch

from spectest.errors import ModelError
from spectest.models import attention, decode_attention, norms, rotary
from spectest.models.base import Cache, LanguageModel
from spectest.models.hf import HFModel
from spectest.sampling.scaled import HALF, ScaledLogits

# attention window granularity (slots): a forward attends to the first ceil((n0 + S) / step)·step
# slots of the pool, so its cost follows the row length, at one CUDA graph per window size
WINDOW_STEP = 32
# a prompt of at most this many tokens prefills as a CUDA graph of ``(1, L, W)``: the eager
# forward is the host's module calls (~36 ms for 28 layers on the H200), the device idle at the
# start of every decode call (docs/internals.md "Prompt prefills as graphs")
PREFILL_GRAPH_TOKENS = 128
PREFILL_GRAPH_LENGTHS = 16  # prompt lengths whose graphs (and [1, L, V] logits buffer) are kept
# the attention kernel reads a prompt's slots, copied to every row by ``prefill_shared``, from
# row 0: a batch reads them from memory once, not once per row (the same bits; False: each
# row's own, an A/B switch read when a model is built; docs/internals.md "Shared prompt reads")
SHARED_READS = True


# ----------------------------------------------------------------------------- static cache


class _StaticKV:
    """Duck-typed transformers cache: ``update`` writes the new keys/values at ``write_idx``
    (a device tensor, so the write is capturable in a CUDA graph) and returns the first
    ``window`` slots (a view: attention, and the GQA head expansion HF does before it with an
    explicit mask, cost O(window), not O(max_slots))."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys = keys  # per layer [B, H_kv, max_slots, D]
        self.values = values
        self.write_idx = torch.zeros(0, dtype=torch.int64, device=keys[0].device)  # [S]
        self.window = int(keys[0].shape[2])
        # [1] the leading slots every row holds alike (a prompt prefilled once and copied to
        # every row): the attention kernel reads them from row 0 (``decode_attention``'s
        # ``shared``); 0 for a fresh cache. A device tensor, so a graph reads it at replay
        self.shared = torch.zeros(1, dtype=torch.int64, device=keys[0].device)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *a: Any,
        **k: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[layer_idx].index_copy_(2, self.write_idx, key_states)
        self.values[layer_idx].index_copy_(2, self.write_idx, value_states)
        w = self.window
        return self.keys[layer_idx][:, :, :w], self.values[layer_idx][:, :, :w]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # never used: positions are explicit
        return 0


def step_inputs(
    valid: torch.Tensor, N: int, S: int
) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A forward's inputs beside its ids, for rows whose slots so far are ``valid`` ``[B, n0]``
    in pools of ``N`` slots, taking ``S`` new tokens: the attended window ``W`` (bucketed), the
    mask ``[B, S, W]``, the positions ``[B, S]`` and the slots written ``[S]``."""
    B, n0 = (int(s) for s in valid.shape)
    dev = valid.device
    W = min(N, -(-(n0 + S) // WINDOW_STEP) * WINDOW_STEP)  # attended slots, bucketed
    slots = torch.arange(W, device=dev)  # [W]
    new = torch.arange(n0, n0 + S, device=dev)  # [S] slots written by this call
    # [B, S, W]: query i sees the row's valid earlier slots and the new slots n0..n0+i;
    # slots >= n0 + S are never seen (unwritten, or garbage from a graph's warm-up)
    old = torch.zeros((B, W), dtype=torch.bool, device=dev)
    old[:, :n0] = valid
    mask = old[:, None, :] | ((slots[None, :] >= n0) & (slots[None, :] <= new[:, None]))[None]
    pos = valid.sum(dim=1, keepdim=True) + torch.arange(S, device=dev)  # [B, S]
    return W, mask, pos, new


class StaticCache(Cache):
    """Slot validity (the ``Cache`` contract) over a preallocated ``_StaticKV`` of ``max_slots``."""

    def __init__(self, kv: _StaticKV, batch_size: int, device: torch.device) -> None:
        self.kv = kv
        self.valid = torch.zeros((batch_size, 0), dtype=torch.bool, device=device)  # [B, N]

    @property
    def max_slots(self) -> int:
        return int(self.kv.keys[0].shape[2])

    def repeat_rows(self, n: int) -> None:
        raise ModelError("StaticCache: use StaticHFModel.prefill_shared (it fills an n-row pool)")


class StaticHFModel(LanguageModel):
    """An ``HFModel`` with a static KV cache and, on CUDA, CUDA-graph replay of decode steps.

    Parameters
    ----------
    base : the ``HFModel`` (weights are shared, not copied).
    max_slots : slots per row (prompt + every slot a decode appends); ``reserve`` raises it.
    cuda_graphs : capture fixed-shape forwards on CUDA (ignored on CPU).
    packed_gqa : attend with ``attention.packed_gqa_sdpa`` (the query heads of a KV head packed
        into rows, no ``repeat_kv`` copy) where the model is sdpa with grouped KV heads.
    native_logits : return the logits in the dtype the model computes them in (e.g. bfloat16)
        instead of their float32 cast: as they are where that cast is all ``HFModel`` does to
        them (``logit_scale == 1``), as ``sampling.scaled.ScaledLogits`` (standing for the float32
        product) for a bfloat16 / float16 model with a ``logit_scale``; a float32 model with a
        scale is unaffected.
    fused_norms : run the model's RMSNorms as torch's fused kernel (``models/norms.py``); None:
        where the device has it (CUDA), so CPU runs keep ``HFModel``'s operations.
    fused_rotary : rotate q and k in one Triton kernel each (``models/rotary.py``, bit for bit
        the model's operations; bf16/fp16 only); None: where it runs (CUDA with Triton,
        ``SPECTEST_NO_KERNELS`` unset).
    decode_kernel : attend in every forward (prompt prefill, decode, verify) with the Triton
        kernel of ``models/decode_attention.py`` (packed GQA, bf16/fp16 only); None: where it
        runs (CUDA with Triton, ``SPECTEST_NO_KERNELS`` unset), so CPU runs keep SDPA.

    Notes
    -----
    One key/value pool per batch size, reused by every cache of that size, so a CUDA graph is
    captured once per ``(B, S, W)``; only one cache per batch size is live at a time. Native
    logits are the same law as their float32 cast. Both: docs/internals.md
    "spectest/models/static.py".
    """

    def __init__(
        self,
        base: HFModel,
        *,
        max_slots: int = 256,
        cuda_graphs: bool = True,
        packed_gqa: bool = True,
        native_logits: bool = True,
        fused_norms: bool | None = None,
        decode_kernel: bool | None = None,
        fused_rotary: bool | None = None,
    ) -> None:
        if not isinstance(base, HFModel):
            raise ModelError(f"StaticHFModel wraps an HFModel, got {type(base).__name__}")
        self.base = base
        self.name = base.name
        self.vocab_size = base.vocab_size
        self.max_slots = int(max_slots)
        self.cuda_graphs = bool(cuda_graphs) and base.device.type == "cuda"
        self._pools: dict[int, _StaticKV] = {}
        self._graphs: dict[tuple[int, int, int], _Graph] = {}
        # the stream its graphs are captured on, so they keep its cuBLAS workspace (a replay
        # worker's own: ``models.streams``); None: torch's default capture stream
        self.stream: torch.cuda.Stream | None = None
        # CUDA-graph memory: one pool shared by every capture of this model (scratch only) and one
        # logits buffer per (B, S) outside it (the NOTE in ``_Graph``)
        self._graph_pool: Any = None
        self._outs: dict[tuple[int, int], torch.Tensor] = {}
        self._prefill_lengths: OrderedDict[int, None] = OrderedDict()  # by last use
        cfg = base.config
        self._layers = int(cfg.num_hidden_layers)
        self._kv_heads = int(getattr(cfg, "num_key_value_heads", cfg.num_attention_heads))
        self._head_dim = int(
            getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        )
        self._additive = getattr(cfg, "_attn_implementation", "sdpa") == "eager"
        # GQA without transformers' K/V copy (models/attention.py); off when ``packed_gqa=False``
        self.packed_gqa = bool(packed_gqa) and attention.usable(cfg)
        self.graph_error: str | None = None  # why CUDA graphs were turned off, if they were
        # native logits: the model's dtype; under a logit_scale, half precision only, as
        # ``ScaledLogits`` (the float32 product made where something needs it)
        half = base.dtype in HALF
        self.native_logits = bool(native_logits) and (base.logit_scale == 1.0 or half)
        if fused_norms is None:
            fused_norms = norms.available(base.device)
        self.fused_norms = bool(fused_norms) and norms.install(base.model) > 0
        if fused_rotary is None:
            fused_rotary = rotary.available(base.device)
        self.fused_rotary = bool(fused_rotary) and rotary.install(base.model)
        if decode_kernel is None:
            decode_kernel = decode_attention.available(base.device)
        self.decode_kernel = bool(decode_kernel) and self.packed_gqa
        self.shared_reads = SHARED_READS
        if self.decode_kernel:
            decode_attention.pv_mode()  # a bad SPECTEST_ATTN_PV is refused here, at load

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def reserve(self, max_slots: int) -> None:
        """Make room for ``max_slots`` slots per row (drops pools and graphs if it grows)."""
        if max_slots > self.max_slots:
            self.max_slots = int(max_slots)
            self._pools.clear()
            self._graphs.clear()
            self._outs.clear()
            self._prefill_lengths.clear()
            self._graph_pool = None

    def _pool(self, batch_size: int) -> _StaticKV:
        kv = self._pools.get(batch_size)
        if kv is None or int(kv.keys[0].shape[2]) != self.max_slots:
            shape = (batch_size, self._kv_heads, self.max_slots, self._head_dim)
            keys = [self._zeros(shape) for _ in range(self._layers)]
            values = [self._zeros(shape) for _ in range(self._layers)]
            kv = self._pools[batch_size] = _StaticKV(keys, values)
            self._graphs = {k: g for k, g in self._graphs.items() if k[0] != batch_size}
        return kv

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def new_cache(self, batch_size: int) -> StaticCache:
        kv = self._pool(batch_size)
        kv.shared.zero_()  # no slot shared until a prefill copies one row to all
        return StaticCache(kv, batch_size, self.device)

    def prefill_shared(self, prompt: torch.Tensor, batch_size: int) -> tuple[Cache, torch.Tensor]:
        """One prompt forward on a one-row pool, its keys/values copied into every row."""
        assert prompt.dim() == 1, prompt.shape
        one = self.new_cache(1)
        graphs = self._prefill_graph(int(prompt.shape[0]))
        logits = self._forward(one, prompt[None, :], graphs=graphs)[0]  # [L, V]
        if batch_size == 1:
            return one, logits
        cache = self.new_cache(batch_size)
        L = int(prompt.shape[0])
        for src, dst in ((one.kv.keys, cache.kv.keys), (one.kv.values, cache.kv.values)):
            for s, d in zip(src, dst, strict=True):
                d[:, :, :L] = s[:, :, :L]  # broadcast the one row to B rows
        cache.kv.shared.fill_(L)  # slots < L: the same in every row until the pool's next cache
        cache.valid = one.valid.expand(batch_size, -1).clone()  # [B, L]
        return cache, logits

    def _prefill_graph(self, L: int) -> bool:
        """Whether an ``L``-token prefill replays a graph (``PREFILL_GRAPH_TOKENS``): the same
        forward as eager, bit for bit. Past ``PREFILL_GRAPH_LENGTHS`` lengths, the graphs and the
        logits buffer of the length least recently prefilled are dropped (a one-row decode of
        ``S = L`` tokens, which shares them, captures again)."""
        if not self.cuda_graphs or L > PREFILL_GRAPH_TOKENS:
            return False
        kept = self._prefill_lengths
        kept[L] = None
        kept.move_to_end(L)
        if len(kept) > PREFILL_GRAPH_LENGTHS:
            old, _ = kept.popitem(last=False)
            self._graphs = {k: g for k, g in self._graphs.items() if k[:2] != (1, old)}
            self._outs.pop((1, old), None)
        return True

    def forward(self, cache: Cache, input_ids: torch.Tensor) -> torch.Tensor:
        return self._forward(cache, input_ids, graphs=self.cuda_graphs)

    @torch.inference_mode()
    def _forward(self, cache: Cache, input_ids: torch.Tensor, *, graphs: bool) -> torch.Tensor:
        assert isinstance(cache, StaticCache), type(cache)
        assert input_ids.dim() == 2 and input_ids.shape[0] == cache.batch_size, input_ids.shape
        if input_ids.dtype != torch.int64:
            raise ModelError(f"{self.name}: input_ids must be int64, got {input_ids.dtype!r}")
        B, S = (int(s) for s in input_ids.shape)
        n0, N = cache.num_slots, cache.max_slots
        if n0 + S > N:
            raise ModelError(
                f"{self.name}: static cache full ({n0} + {S} slots > max_slots {N}); reserve more"
            )
        W, mask, pos, new = step_inputs(cache.valid, N, S)
        graph = self._graph(B, S, W) if graphs and self.cuda_graphs else None
        if graph is not None:
            logits = graph.run(cache.kv, input_ids, mask, pos, new)
        else:
            logits = self._eager(cache.kv, input_ids, mask, pos, new)
        cache.valid = torch.cat([cache.valid, cache.valid.new_ones((B, S))], 1)
        if self.native_logits and self.base.logit_scale != 1.0:
            return ScaledLogits.wrap(logits, self.base.logit_scale)  # fl32(logits) · scale
        return logits

    def _eager(
        self,
        kv: _StaticKV,
        ids: torch.Tensor,  # [B, S]
        mask: torch.Tensor,  # [B, S, W] bool
        pos: torch.Tensor,  # [B, S]
        new: torch.Tensor,  # [S]
        out: torch.Tensor | None = None,  # [B, S, V] (``_out_buffer``): write the logits here
    ) -> torch.Tensor:
        kv.write_idx = new
        kv.window = int(mask.shape[2])
        m4 = mask[:, None]  # [B, 1, S, W]
        if self._additive:
            m4 = torch.zeros(m4.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~m4, torch.finfo(self.dtype).min
            )
        kwargs: dict[str, Any] = {self.base._cache_kw: kv}
        if self.base._pass_cache_position:
            kwargs["cache_position"] = new
        packed = attention.packed_attention(self.base.config) if self.packed_gqa else nullcontext()
        shared = kv.shared if self.shared_reads else None
        kernel = attention.decode_kernel(self.decode_kernel, shared=shared)
        fused = rotary.fused_rotary(self.fused_rotary)
        with packed, norms.fused_norms(self.fused_norms), fused, kernel:
            res = self.base.model(
                input_ids=ids, attention_mask=m4, position_ids=pos, use_cache=True, **kwargs
            )
        if out is None and self.native_logits:
            return res.logits  # [B, S, V] as computed, scaled by ``_forward`` (class NOTE)
        if out is None:
            return self.base.scaled(res.logits)  # [B, S, V]
        # the same operations, into a buffer of the dtype eager returns (conversion is exact)
        out.copy_(res.logits)  # [B, S, V]
        if self.base.logit_scale != 1.0 and not self.native_logits:
            out.mul_(self.base.logit_scale)
        return out

    def _out_buffer(self, B: int, S: int, dtype: torch.dtype) -> torch.Tensor:
        """The ``[B, S, V]`` logits buffer every graph of ``(B, S)`` writes into, in ``dtype``
        (what the eager forward returns: float32, or the native dtype)."""
        buf = self._outs.get((B, S))
        if buf is None or buf.dtype != dtype:
            shape = (B, S, self.vocab_size)
            buf = self._outs[(B, S)] = torch.empty(shape, dtype=dtype, device=self.device)
        return buf

    def _pool_handle(self) -> Any:
        if self._graph_pool is None:
            with torch.cuda.device(self.device):
                self._graph_pool = torch.cuda.graph_pool_handle()
        return self._graph_pool

    def _graph(self, B: int, S: int, W: int) -> _Graph | None:
        """The graph of ``(B, S, W)``, captured on first use; ``None`` (eager from then on, the
        reason in ``graph_error``) if capture fails, e.g. a model with a host sync inside."""
        g = self._graphs.get((B, S, W))
        if g is None:
            try:
                g = self._graphs[(B, S, W)] = _Graph(self, B, S, W)
            except Exception as err:  # torch raises RuntimeError subclasses from capture
                self.cuda_graphs = False
                self.graph_error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                torch.cuda.synchronize(self.device)
                return None
        return g

    def logits_full(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.base.logits_full(input_ids)


class _Graph:
    """One CUDA graph of ``StaticHFModel._eager`` at a fixed ``(B, S, W)`` over the B-row pool;
    every graph of a model shares one memory pool (docs/internals.md)."""

    def __init__(self, model: StaticHFModel, B: int, S: int, W: int) -> None:
        dev = model.device
        self.kv = model._pool(B)
        self.ids = torch.zeros((B, S), dtype=torch.int64, device=dev)
        self.new = torch.arange(W - S, W, device=dev)  # [S] overwritten by every run
        self.mask = torch.zeros((B, S, W), dtype=torch.bool, device=dev)
        self.mask[:, :, W - S] = True  # warm-up queries attend to something
        self.pos = torch.zeros((B, S), dtype=torch.int64, device=dev)
        # warm-up on a side stream, then capture, writing into slots no live row uses yet
        # (docs/internals.md "The key/value pool and the CUDA graphs")
        with torch.cuda.device(dev):  # capture streams are created on the current device
            stream = torch.cuda.Stream(device=dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    warm = model._eager(self.kv, self.ids, self.mask, self.pos, self.new)
            torch.cuda.current_stream(dev).wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            self.out = model._out_buffer(B, S, warm.dtype)  # [B, S, V] outside the graph pool
            # thread_local: another thread's CUDA calls (the tooth sizes beside generation,
            # ``teeth_phase``) neither fail nor break this capture; its forwards wait (CONFIG_LOCK)
            with torch.cuda.graph(
                self.graph,
                pool=model._pool_handle(),
                stream=model.stream,
                capture_error_mode="thread_local",
            ):
                model._eager(self.kv, self.ids, self.mask, self.pos, self.new, out=self.out)

    def run(
        self,
        kv: _StaticKV,
        ids: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        new: torch.Tensor,
    ) -> torch.Tensor:
        assert kv is self.kv, "a graph replays only on the pool it was captured with"
        self.ids.copy_(ids)
        self.mask.copy_(mask)
        self.pos.copy_(pos)
        self.new.copy_(new)
        with torch.cuda.device(self.ids.device):
            self.graph.replay()
            # consumed before any other replay: the buffer (and the shared pool) is reused by
            # every graph of this (B, S)
            return self.out.clone()  # [B, S, V]
