"""CUDA streams for work that runs beside other work: ``apart`` hands out pooled streams none of
which shares a cuBLAS workspace with work already running or captured. Knows nothing about models,
caches or sampling. Why: docs/internals.md "spectest/models/streams.py".
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# torch hands out its streams round robin from a pool of this many per device and priority
# (c10/cuda/CUDAStream.cpp ``kStreamsPerPool``): one turn of the pool sees each of them once
POOL_STREAMS = 32


def capture_stream() -> torch.cuda.Stream:
    """The stream ``torch.cuda.graph`` captures on when given none (made now if no graph was
    captured yet, as ``torch.cuda.graph`` would make it): the stream whose cuBLAS workspace
    every graph captured without a stream of its own keeps."""
    graph = torch.cuda.graph
    stream = getattr(graph, "default_capture_stream", None)  # torch's class attribute
    if stream is None:
        stream = graph.default_capture_stream = torch.cuda.Stream()
    return stream


def apart(
    device: torch.device, n: int, avoid: Iterable[torch.cuda.Stream | None] = ()
) -> list[torch.cuda.Stream]:
    """``n`` pooled streams of ``device``, pairwise distinct and none of ``avoid``, the current
    stream or ``capture_stream()``: work issued on them (eager or captured into a graph) gets
    cuBLAS workspaces of its own.

    Raises ``RuntimeError`` when one turn of the pool (``POOL_STREAMS``) has no ``n`` such
    streams (callers fall back to issuing one thing after another).

    Notes
    -----
    torch keeps one cuBLAS and one cuBLASLt workspace per (thread's handle, stream), and a CUDA
    graph keeps the workspace of the stream each GEMM was captured on. Streams come from a pool
    of ``POOL_STREAMS``, round robin, and graphs without a stream of their own are all captured
    on ``capture_stream()``. So two things issued by one thread that run at the same time
    (a graph replayed beside another graph, or beside eager work) may hold one workspace; a
    split-K GEMM keeps its partial sums and its semaphores there, and two of them at once give
    wrong values or a kernel that never ends — a run that stalled with the GPU at 100 % for
    minutes (results/LOG.md "lead (session 27)"). Streams drawn past the ones in use avoid it.
    """
    taken = {
        int(s.cuda_stream)
        for s in (*avoid, torch.cuda.current_stream(device), capture_stream())
        if s is not None
    }
    out: list[torch.cuda.Stream] = []
    for _ in range(POOL_STREAMS):
        if len(out) == n:
            break
        s = torch.cuda.Stream(device=device)
        if int(s.cuda_stream) not in taken:
            taken.add(int(s.cuda_stream))
            out.append(s)
    if len(out) < n:
        raise RuntimeError(
            f"{n} CUDA streams apart from {len(taken) - len(out)} in use: "
            f"torch's pool has {POOL_STREAMS}"
        )
    return out
