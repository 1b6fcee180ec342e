"""The batch floor's rows decoded alone, several at once: each row still its own batch-1 plain
decode on its own worker model — as branches of one CUDA graph per step (``FloorBranches``, the
default on CUDA) or on a CUDA stream each (``FLOOR_STREAMS``: 1 by default, ``alone_logits``);
``decode_steps`` and ``concurrent`` serve both. Knows nothing about TVs, tables or which rows are
measured. Details: docs/internals.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

import torch

from spectest.models.base import Cache, LanguageModel
from spectest.models.static import StaticCache, step_inputs
from spectest.numerics.replay import ReplayStaticModel
from spectest.sampling.scaled import ScaledLogits

# rows decoded alone at once on CUDA (one stream each): 1, one at a time. 8 at once was measured
# slower on the H200 at P1: the numerics phase passed 140 s against 21.7 s one at a time
# (results/LOG.md "lead (session 11)"); ``drift_table(streams=)`` and the tools still take N
FLOOR_STREAMS = 1
_DONE = -1


def decode_steps(
    model: LanguageModel,
    cache: Cache,
    logits: torch.Tensor,  # [B, V] after the prompt
    tokens: torch.Tensor,  # [B, T]
    keep: torch.Tensor,  # [M] rows kept
    out: torch.Tensor,  # [M, T, V] float32, filled
) -> Iterator[int]:
    """Plain decode's steps after the prefill, one forward per ``next`` (yields the position whose
    logits it gave; ``alone_logits`` interleaves rows'). The caller holds ``torch.no_grad``."""
    T = int(tokens.shape[1])
    for t in range(T):
        out[:, t] = logits[keep].float()
        if t + 1 < T:
            logits = model.forward(cache, tokens[:, t : t + 1])[:, 0]
            yield t + 1


def concurrent(model: LanguageModel) -> TypeGuard[ReplayStaticModel]:
    """True when ``alone_logits`` can run ``model``'s one-row decodes at once: a replay model
    (the ``--fast`` replay's static-cache model; on CPU too, in turn, for the tests)."""
    return isinstance(model, ReplayStaticModel)


@torch.no_grad()
def alone_logits(
    model: ReplayStaticModel,
    prompt: torch.Tensor,  # [L]
    prompt_ids: Sequence[int],  # the same ids, on the host
    rows: Sequence[torch.Tensor],  # each [1, T]
    streams: int,
) -> Iterator[torch.Tensor]:
    """Each row decoded alone after ``prompt`` (``decode.decode_logits`` of that row, batch 1):
    its float32 logits ``[T, V]``, in order, ``streams`` rows at a time.

    Notes
    -----
    Bit-identical to one row at a time: the same batch-1 forwards on workers built like
    ``model``, only the issue order changes; the stream order (docs/internals.md
    "spectest/numerics/alone.py") keeps the kept prefill and the logits ready.
    """
    key = tuple(int(t) for t in prompt_ids)
    model.snapshot(key, prompt)  # on the caller's stream, before any worker reads it
    workers = model.workers(max(1, streams))
    for lo in range(0, len(rows), len(workers)):
        yield from _group(workers, key, rows[lo : lo + len(workers)])


def _group(
    workers: Sequence[ReplayStaticModel], key: tuple[int, ...], rows: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``rows`` (at most one per worker) decoded at once: their logits ``[T, V]``, in order."""
    dev = workers[0].device
    main = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
    T = int(rows[0].shape[1])
    keep = torch.zeros(1, dtype=torch.int64, device=dev)
    steps, outs = [], []
    for w, row in zip(workers, rows, strict=False):
        assert row.shape == (1, T), row.shape
        if w.stream is not None and main is not None:
            w.stream.wait_stream(main)  # the row's tokens and the kept prefill are ready
        with _on(w):
            cache, logits = w.restore(key, 1)
            out = torch.empty((1, T, w.vocab_size), dtype=torch.float32, device=dev)
        steps.append(decode_steps(w, cache, logits[-1].expand(1, -1), row, keep, out))
        outs.append(out)
    live = list(range(len(steps)))
    while live:  # one forward of each live row in turn
        for i in list(live):
            with _on(workers[i]):
                if next(steps[i], _DONE) == _DONE:
                    live.remove(i)
    for w, out in zip(workers, outs, strict=False):
        if w.stream is not None and main is not None:
            main.wait_stream(w.stream)
            out.record_stream(main)  # read on the caller's stream from here on
    return [out[0] for out in outs]


def _on(worker: ReplayStaticModel) -> Any:
    """A context issuing work on ``worker``'s stream (nothing on CPU)."""
    if worker.stream is None:
        return contextlib.nullcontext()
    return torch.cuda.stream(worker.stream)


class FloorBranches:
    """A batch's floor rows decoded alone at once: R one-row decodes after one prompt, on R
    worker models (``ReplayStaticModel.workers``), each step's R batch-1 forwards replayed as
    the branches of one CUDA graph per ``(R, W)`` (W: the attended window), captured on first
    use; without CUDA graphs (CPU, or a capture that failed: ``graph_error``) the same forwards
    eager, one row after another.

    Notes
    -----
    Every row is at the same cache length at the same step (the restored prompt plus one slot a
    step), so the rows share the mask, the positions and the written slot and differ only in
    their token and their pool. Each branch is the batch-1 forward ``StaticHFModel._forward``
    runs, at the same W, so the same kernels and the same bits as one row at a time
    (tests/test_numerics_alone.py). The graphs hold the workers' one-row pools they were
    captured on and are captured again when a pool was replaced (``reserve``). They share one
    memory pool for their scratch; inputs, outputs and pools live outside it, so no graph reads
    what another wrote there. Each branch is captured on a stream of its own and the graph runs
    beside the batch decode on another (``stream``), all drawn apart from the streams the replay
    model, its workers and torch's graph capture use (``ReplayStaticModel.streams_apart``), so no
    GEMM beside another holds its cuBLAS workspace (``models.streams``).
    """

    def __init__(self, model: ReplayStaticModel) -> None:
        self.model = model
        self.capture = model.cuda_graphs
        self.graph_error: str | None = None
        self._graphs: dict[tuple[int, int], tuple[Any, ...]] = {}
        self._mempool: Any = None
        self._stream: torch.cuda.Stream | None = None
        self._branches: list[torch.cuda.Stream] = []  # one per branch, apart (``_capture``)

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The stream the branches run on beside the batch decode (``numerics.decode.
        _decode_beside_alone``), drawn apart on first use; None off CUDA or when no stream
        apart is left (the branches then run on the caller's stream, in turn)."""
        if self._stream is None and self.model.device.type == "cuda":
            self._stream = self.model.stream_apart()
        return self._stream

    @torch.no_grad()  # not inference mode: the pools it makes are used outside it later
    def __call__(
        self, prompt: torch.Tensor, prompt_ids: Sequence[int], rows: torch.Tensor
    ) -> list[torch.Tensor]:
        """``rows`` ``[R, T]`` each decoded alone after ``prompt`` ``[L]``: their float32 logits
        ``[T, V]`` (``decode.decode_logits`` of each row at batch 1), in order."""
        outs: list[torch.Tensor] = []
        for _ in self.steps(prompt, prompt_ids, rows, outs):
            pass
        return outs

    def steps(
        self,
        prompt: torch.Tensor,  # [L]
        prompt_ids: Sequence[int],
        rows: torch.Tensor,  # [R, T]
        outs: list[torch.Tensor],  # filled: each row's float32 logits [T, V], in order
    ) -> Iterator[int]:
        """``__call__`` one step per ``next``, on the current stream: the rows restored, then
        each step's replay (yields the position it gave); ``outs`` is complete once exhausted.
        ``decode._decode_beside_alone`` interleaves them with the batch decode's steps. The
        caller holds ``torch.no_grad`` (not inference mode: the pools made here are used
        outside it later)."""
        R, T = (int(s) for s in rows.shape)
        key = tuple(int(t) for t in prompt_ids)
        self.model.reserve(len(key) + T)  # room for every step (a no-op after the verify's)
        self.model.snapshot(key, prompt)
        workers = self.model.workers(R)
        dev, scale = self.model.device, self.model.base.logit_scale
        kvs = []
        for w in workers:
            cache, logits = w.restore(key, 1)
            assert isinstance(cache, StaticCache), type(cache)
            kvs.append(cache.kv)
            out = torch.empty((T, w.vocab_size), dtype=torch.float32, device=dev)  # [T, V]
            out[0] = logits[-1].float()
            outs.append(out)
        valid, N = cache.valid, int(kvs[0].keys[0].shape[2])  # [1, n0]: every row's
        for t in range(1, T):
            W, mask, pos, new = step_inputs(valid, N, 1)  # as ``_forward``: [1, 1, W], [1, 1], [1]
            ids = rows[:, t - 1 : t]  # [R, 1]
            step = self._replay(workers, kvs, W, ids, mask, pos, new) if self.capture else None
            for i, w in enumerate(workers):
                raw = (
                    step[i]
                    if step is not None
                    else w._eager(kvs[i], ids[i : i + 1], mask, pos, new)
                )
                raw = raw[:, 0]  # [1, V]
                if w.native_logits and scale != 1.0:  # as ``_forward`` returns it
                    raw = ScaledLogits.wrap(raw, scale)
                outs[i][t] = raw[0].float()
            valid = torch.cat([valid, valid.new_ones((1, 1))], dim=1)
            yield t

    def _replay(
        self, workers: Sequence[ReplayStaticModel], kvs: list[Any], W: int, *inputs: torch.Tensor
    ) -> list[torch.Tensor] | None:
        """One replay of the ``(R, W)`` graph (captured on first use, again when a pool changed):
        each branch's logits ``[1, 1, V]``, read before the next replay; None if capture failed."""
        R = len(workers)
        entry = self._graphs.get((R, W))
        if entry is None or any(a is not b for a, b in zip(entry[0], kvs, strict=True)):
            try:
                entry = self._graphs[(R, W)] = self._capture(workers, kvs, W)
            except Exception as err:  # torch raises RuntimeError subclasses from capture
                self.capture = False
                self.graph_error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                torch.cuda.synchronize(self.model.device)
                return None
        _, graph, *buffers, outs = entry
        for buf, x in zip(buffers, inputs, strict=True):  # ids [R, 1], mask, pos, new
            buf.copy_(x)
        graph.replay()
        return list(outs)

    def _capture(
        self, workers: Sequence[ReplayStaticModel], kvs: list[Any], W: int
    ) -> tuple[Any, ...]:
        dev, R = self.model.device, len(workers)
        ids = torch.zeros((R, 1), dtype=torch.int64, device=dev)
        mask = torch.zeros((1, 1, W), dtype=torch.bool, device=dev)
        mask[0, 0, W - 1] = True  # warm-up queries attend to a slot no live row uses yet
        pos = torch.zeros((1, 1), dtype=torch.int64, device=dev)
        new = torch.tensor([W - 1], device=dev)
        if len(self._branches) < R:  # each branch's GEMMs keep a cuBLAS workspace of its own
            self._branches += self.model.streams_apart(R - len(self._branches))
        streams = self._branches[:R]
        main = torch.cuda.current_stream(dev)
        warm = []
        for i, (w, s) in enumerate(zip(workers, streams, strict=True)):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                warm.append(w._eager(kvs[i], ids[i : i + 1], mask, pos, new))
        for s in streams:
            main.wait_stream(s)
        outs = [torch.empty_like(x) for x in warm]  # [1, 1, V] each, outside the graph pool
        graph = torch.cuda.CUDAGraph()
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        # thread_local: as ``models.static._Graph`` (another thread's CUDA calls beside it)
        with torch.cuda.graph(graph, pool=self._mempool, capture_error_mode="thread_local"):
            cap = torch.cuda.current_stream(dev)
            for i, (w, s) in enumerate(zip(workers, streams, strict=True)):
                s.wait_stream(cap)  # fork: every branch after the inputs' copies
                with torch.cuda.stream(s):
                    w._eager(kvs[i], ids[i : i + 1], mask, pos, new, out=outs[i])
            for s in streams:
                cap.wait_stream(s)  # join
        return tuple(kvs), graph, ids, mask, pos, new, outs
