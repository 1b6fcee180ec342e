"""The batch floor's rows decoded alone as branches of one CUDA graph per step (issue 32; an
experiment, not the package's path yet).

Every floor row of a prompt is at the same cache length at the same step, so R one-row forwards
(each on its own worker model's one-row pool, ``ReplayStaticModel.workers``) share the mask, the
positions and the written slot, and differ only in their token and their pool. Captured once per
attended window W on forked streams and joined, they replay as one graph: the same batch-1
kernels, so the same bits as ``numerics.alone.alone_logits`` one row at a time, with no host
work per row. Separate streams per row stalled (sessions 11-13, cause not found); this issues
no per-row launches at all.

Prints: whether every row's logits ``[T, V]`` equal the one-at-a-time ones bit for bit, and the
wall of both (the branches' first pass captures; the second replays). ``--eager`` runs the same
bookkeeping without graphs (on CPU too): it checks the masks, positions and slots here.

    python tools/gpu/floor_branches.py --set models.device=cuda --set models.dtype=bfloat16 \\
        --set models.target=realistic:qwen3-0.6b --rows 8 --positions 32
    python tools/gpu/floor_branches.py --eager --set models.target=realistic:qwen3-tiny
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch

from spectest.generation import load_models
from spectest.models.static import WINDOW_STEP
from spectest.numerics.alone import alone_logits
from spectest.numerics.replay import ReplayStaticModel, replay_model
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol
from spectest.sampling.scaled import ScaledLogits


class Branches:
    """R one-row decodes after one prompt, one forward each per step (module docstring)."""

    def __init__(self, model: ReplayStaticModel, R: int, capture: bool) -> None:
        self.workers = model.workers(R)
        self.capture = capture and model.device.type == "cuda"
        self.graphs: dict[int, tuple[Any, ...]] = {}
        self.pool: Any = None
        self.dev = model.device

    @torch.inference_mode()
    def run(
        self, prompt: torch.Tensor, prompt_ids: Sequence[int], rows: torch.Tensor
    ) -> list[torch.Tensor]:
        """``rows`` [R, T] decoded alone after ``prompt``: their float32 logits [T, V] each."""
        key = tuple(int(t) for t in prompt_ids)
        self.workers[0].snapshot(key, prompt)
        R, T = (int(s) for s in rows.shape)
        caches, outs = [], []
        for w in self.workers[:R]:
            cache, logits = w.restore(key, 1)
            caches.append(cache)
            out = torch.empty((T, w.vocab_size), dtype=torch.float32, device=self.dev)
            out[0] = logits[-1].float()
            outs.append(out)
        n0, N = caches[0].num_slots, caches[0].max_slots
        for t in range(T - 1):
            W = min(N, -(-(n0 + 1) // WINDOW_STEP) * WINDOW_STEP)
            # as ``StaticHFModel._forward`` builds them for one row and one new slot; every
            # row's validity is the restored prompt's plus one slot a step, so row 0's serves all
            mask = torch.zeros((1, 1, W), dtype=torch.bool, device=self.dev)  # [1, 1, W]
            mask[0, 0, :n0] = caches[0].valid[0]
            mask[0, 0, n0] = True
            pos = caches[0].valid.sum(dim=1, keepdim=True)  # [1, 1]
            new = torch.tensor([n0], device=self.dev)  # [1]
            ids = rows[:, t : t + 1]  # [R, 1]
            step = self._graphed(W, R, ids, mask, pos, new) if self.capture else None
            for i, w in enumerate(self.workers[:R]):
                raw = (
                    step[i]
                    if step is not None
                    else w._eager(caches[i].kv, ids[i : i + 1], mask, pos, new)[0]
                )  # [1, V]
                if w.native_logits and w.base.logit_scale != 1.0:  # as ``_forward`` returns it
                    raw = ScaledLogits.wrap(raw, w.base.logit_scale)
                outs[i][t + 1] = raw[0].float()
            for c in caches:
                c.valid = torch.cat([c.valid, c.valid.new_ones((1, 1))], dim=1)
            n0 += 1
        return outs

    def _graphed(self, W: int, R: int, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """One replay of the R-branch graph of window W (captured on first use)."""
        if W not in self.graphs:
            self.graphs[W] = self._capture(W, R, inputs[1].dtype)
        g, *buffers, outs = self.graphs[W]
        for buf, x in zip(buffers, inputs, strict=True):  # ids [R, 1], mask, pos, new
            buf.copy_(x)
        g.replay()
        return [o[0].clone() for o in outs]  # each [1, V]

    def _capture(self, W: int, R: int, mdtype: torch.dtype) -> tuple[Any, ...]:
        dev, ws = self.dev, self.workers[:R]
        ids_b = torch.zeros((R, 1), dtype=torch.int64, device=dev)
        mask_b = torch.zeros((1, 1, W), dtype=mdtype, device=dev)
        mask_b[0, 0, W - 1] = True  # warm-up queries attend to a slot no live row uses yet
        pos_b = torch.zeros((1, 1), dtype=torch.int64, device=dev)
        new_b = torch.tensor([W - 1], device=dev)
        streams = [torch.cuda.Stream(device=dev) for _ in ws]
        main = torch.cuda.current_stream(dev)
        warm = []
        for i, (w, s) in enumerate(zip(ws, streams, strict=True)):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                kv = w._pool(1)
                warm.append(w._eager(kv, ids_b[i : i + 1], mask_b, pos_b, new_b))
        for s in streams:
            main.wait_stream(s)
        outs = [torch.empty_like(x) for x in warm]  # [1, 1, V] outside the graph pool
        g = torch.cuda.CUDAGraph()
        if self.pool is None:  # the branches' own: replayed in capture order (W ascending)
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
            cap = torch.cuda.current_stream(dev)
            for i, (w, s) in enumerate(zip(ws, streams, strict=True)):
                s.wait_stream(cap)
                with torch.cuda.stream(s):
                    w._eager(w._pool(1), ids_b[i : i + 1], mask_b, pos_b, new_b, out=outs[i])
            for s in streams:
                cap.wait_stream(s)
        return g, ids_b, mask_b, pos_b, new_b, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--eager", action="store_true", help="no graphs: the bookkeeping alone")
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    _sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    p = load_protocol(a.config, sets=a.set)
    target = load_models(p, need_draft=False).target
    model = replay_model(target, fast=True, static=True)
    assert isinstance(model, ReplayStaticModel)
    pid, prompt_ids = next(iter(prompt_token_ids(p, model.vocab_size).items()))
    prompt = torch.tensor(prompt_ids, device=model.device)
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, model.vocab_size, (a.rows, a.positions), generator=g).to(model.device)
    _sync()
    t0 = time.perf_counter()
    one = list(alone_logits(model, prompt, prompt_ids, [r[None] for r in rows], streams=1))
    _sync()
    t_one = time.perf_counter() - t0
    br = Branches(model, a.rows, capture=not a.eager)
    for label in ("first", "second"):
        _sync()
        t0 = time.perf_counter()
        got = br.run(prompt, prompt_ids, rows)
        _sync()
        wall = time.perf_counter() - t0
        same = all(torch.equal(x, y) for x, y in zip(one, got, strict=True))
        worst = max(float((x - y).abs().max()) for x, y in zip(one, got, strict=True))
        print(
            f"prompt {pid} (L {len(prompt_ids)}), {a.rows} rows × {a.positions} positions: one at "
            f"a time {t_one:.3f} s; branches ({'eager' if a.eager else 'graphs'}, {label}) "
            f"{wall:.3f} s; bit-identical {same} (max |Δ| {worst:.3g})"
        )


if __name__ == "__main__":
    main()
