"""The static model with and without one of its CUDA kernels, side by side in one process on one
device (issue 32): what one forward costs and what it computes. ``--switch`` names the
``StaticHFModel`` option: ``fused_norms`` (``models/norms.py``, the default) or ``decode_kernel``
(``models/decode_attention.py``); the other options keep their defaults.

For the switch off and on (two ``StaticHFModel`` on the same weights), at P1's model
(``realistic:qwen3-0.6b`` in bfloat16, and its 4-layer draft) prints:

- ``kernels``: CUDA kernels one eager one-row decode forward launches (torch.profiler);
- ``ms/step``: milliseconds per CUDA-graph forward (median of ``--reps`` after a warm-up) at the
  shapes P1 runs: the one-row floor step, the batch-768 decode step, the batch-768 verify (S = 5),
  and the draft's batch-768 step;
- the logits of both on the same inputs (a 36-token prompt, then 8 one-row decode steps): largest
  absolute difference, share of equal values, the largest TV between their softmaxes, and whether
  every argmax is equal;
- with ``--profile``: the switched-on model's CUDA time by kernel (top 12) over ``--reps`` graph
  replays of the floor step and of the batch-768 decode step.

About 40 s on one H200; CUDA only.

    python tools/gpu/norms_ab.py [--switch fused_norms|decode_kernel] [--reps 30] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from spectest.models.static import StaticHFModel
from spectest.models.zoo import load_pair

SHAPES = {"floor B1": (1, 1), "decode B768": (768, 1), "verify B768": (768, 5)}


def _steps(model: StaticHFModel, prompt: torch.Tensor, B: int, S: int, reps: int) -> float:
    """Median ms of one graph forward of ``[B, S]`` after ``prompt``, the cache cut back to the
    prompt before each step (so every step attends the same window: one graph)."""
    cache, _ = model.prefill_shared(prompt, B)
    L = int(prompt.shape[0])
    ids = torch.randint(0, model.vocab_size, (B, S), device=model.device)
    times = []
    for i in range(reps + 3):
        cache.valid = cache.valid[:, :L]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.forward(cache, ids)
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _kernels(model: StaticHFModel, prompt: torch.Tensor) -> int:
    cache, _ = model.prefill_shared(prompt, 1)
    ids = prompt[None, :1]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model._forward(cache, ids, graphs=False)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _profile(model: StaticHFModel, prompt: torch.Tensor, B: int, S: int, reps: int) -> None:
    _steps(model, prompt, B, S, 1)  # captured before the profile
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        _steps(model, prompt, B, S, reps)
    table = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=12, max_name_column_width=60
    )
    print(f"-- [{B}, {S}] x {reps + 3} (switched on)\n{table}", flush=True)


def _logits(model: StaticHFModel, prompt: torch.Tensor, follow: torch.Tensor) -> torch.Tensor:
    cache, first = model.prefill_shared(prompt, 1)
    rows = [first.float()]  # [L, V]
    for t in range(int(follow.shape[0])):
        rows.append(model.forward(cache, follow[None, t : t + 1])[0].float())  # [1, V]
    return torch.cat(rows)  # [L + n, V]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--switch", choices=("fused_norms", "decode_kernel"), default="fused_norms")
    args = ap.parse_args()
    target, draft = load_pair(
        "realistic:qwen3-0.6b", "derived:first_layers,layers=4", device="cuda", dtype="bfloat16"
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (36,), generator=g, device="cuda")
    follow = torch.randint(0, target.vocab_size, (8,), generator=g, device="cuda")
    logits = {}
    for on in (False, True):
        t = StaticHFModel(target, **{args.switch: on})  # type: ignore[arg-type]
        d = StaticHFModel(draft, **{args.switch: on})  # type: ignore[arg-type]
        assert getattr(t, args.switch) == on, f"{args.switch} cannot run on this machine"
        row = [f"{args.switch}={on!s:5}", f"kernels {_kernels(t, prompt)}"]
        for name, (B, S) in SHAPES.items():
            row.append(f"{name} {_steps(t, prompt, B, S, args.reps):.3f}")
        row.append(f"draft decode B768 {_steps(d, prompt, 768, 1, args.reps):.3f}")
        print("  ".join(row), "(ms/step)", flush=True)
        logits[on] = _logits(t, prompt, follow)
        assert t.graph_error is None, t.graph_error
        if on and args.profile:
            for B, S in ((1, 1), (768, 1)):
                _profile(t, prompt, B, S, args.reps)
    a, b = logits[False], logits[True]
    tv = 0.5 * (a.softmax(-1) - b.softmax(-1)).abs().sum(-1)  # [L + n]
    print(
        f"logits off vs on: max |diff| {(a - b).abs().max().item():.4g}, "
        f"equal {(a == b).float().mean().item():.4%}, max TV {tv.max().item():.3g}, "
        f"argmax equal {bool((a.argmax(-1) == b.argmax(-1)).all())}"
    )


if __name__ == "__main__":
    main()
