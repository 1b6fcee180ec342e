"""The batch floor's rows decoded alone as branches of one CUDA graph per step
(``numerics.alone.FloorBranches``, issue 32) against one row at a time, on one prompt.

Prints: whether every row's logits ``[T, V]`` equal the one-at-a-time ones bit for bit, and the
wall of both (the branches' first pass captures; the second replays). ``--eager`` runs the same
bookkeeping without graphs (on CPU too).

    python tools/gpu/floor_branches.py --set models.device=cuda --set models.dtype=bfloat16 \\
        --set models.target=realistic:qwen3-0.6b --rows 8 --positions 32
    python tools/gpu/floor_branches.py --eager --set models.draft=derived:first_layers,layers=1 \
        --set models.target=realistic:qwen3-tiny,draft_layers=1
"""

from __future__ import annotations

import argparse
import time

import torch

from spectest.generation import load_models
from spectest.numerics.alone import FloorBranches
from spectest.numerics.decode import decode_logits
from spectest.numerics.replay import ReplayStaticModel, replay_model
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol


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
    keep = torch.zeros(1, dtype=torch.int64, device=model.device)
    one = [decode_logits(model, prompt, r[None], keep)[0] for r in rows]
    _sync()
    t_one = time.perf_counter() - t0
    br = FloorBranches(model)
    br.capture = br.capture and not a.eager
    for label in ("first", "second"):
        _sync()
        t0 = time.perf_counter()
        got = br(prompt, prompt_ids, rows)
        _sync()
        wall = time.perf_counter() - t0
        same = all(torch.equal(x, y) for x, y in zip(one, got, strict=True))
        worst = max(float((x - y).abs().max()) for x, y in zip(one, got, strict=True))
        print(
            f"prompt {pid} (L {len(prompt_ids)}), {a.rows} rows × {a.positions} positions: one at "
            f"a time {t_one:.3f} s; branches ({'graphs' if br.capture else 'eager'}, {label}) "
            f"{wall:.3f} s; bit-identical {same} (max |Δ| {worst:.3g})"
        )


if __name__ == "__main__":
    main()
