"""``spectest.models.streams.apart``: streams for work beside other work hold no cuBLAS workspace
another holds (``-m gpu``; skipped without CUDA: CPU has no streams).

Exact checks over every position of torch's round-robin stream pool: the streams handed out are
pairwise distinct and none is torch's graph-capture stream, the caller's stream or one to avoid;
a request the pool cannot meet raises ``RuntimeError``."""

from __future__ import annotations

import pytest
import torch

from spectest.models.streams import POOL_STREAMS, apart, capture_stream

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _handles(streams: list[torch.cuda.Stream]) -> list[int]:
    return [int(s.cuda_stream) for s in streams]


def test_apart_skips_the_streams_in_use_at_every_pool_position() -> None:
    dev = torch.device("cuda")
    cap = int(capture_stream().cuda_stream)
    for k in range(POOL_STREAMS):  # the pool's round robin moved on by k draws
        for _ in range(k):
            torch.cuda.Stream(device=dev)
        avoid = [torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)]
        side = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(side):
            got = _handles(apart(dev, 6, avoid=avoid))
        assert len(set(got)) == 6
        assert not set(got) & {cap, int(side.cuda_stream), *_handles(avoid)}, k


def test_apart_raises_when_the_pool_has_too_few() -> None:
    dev = torch.device("cuda")
    assert len(apart(dev, POOL_STREAMS - 1)) == POOL_STREAMS - 1  # all but the capture stream
    with pytest.raises(RuntimeError, match="torch's pool has 32"):
        apart(dev, POOL_STREAMS)
