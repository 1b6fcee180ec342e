"""Where P1's ``tooth sizes`` phase goes (issues 24, 32): ``tooth_sizes`` for the first prompt(s)
of the openinfer-512 plan at the 0.6B realistic shape (bf16, CUDA), under cProfile; prints the
wall time, the top functions by own time and by cumulative time, and with ``--torch`` the
torch profiler's top ops by device time and by host time. ``--warm``: one untimed call on
another prompt first (kernels, cuBLAS handles and the allocator warmed, as in a run, where the
phase follows generation). Runs on CPU too (``--device cpu --target bundled`` style overrides via
``--set``), at any shape the protocol names.

    python tools/gpu/tooth_size_profile.py --warm --torch --set models.device=cuda --set ...
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from spectest.generation import load_models
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol
from spectest.tooth_size import tooth_sizes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--warm", action="store_true", help="one untimed call on the last prompt")
    ap.add_argument("--torch", action="store_true", help="also the torch profiler's tables")
    ap.add_argument("--top", type=int, default=22)
    a = ap.parse_args()
    p = load_protocol(a.config, sets=a.set)
    t0 = time.perf_counter()
    models = load_models(p, need_draft=True)
    target, draft = models.target, models.draft
    assert target is not None and draft is not None
    print(f"load {time.perf_counter() - t0:.1f} s")
    every = list(prompt_token_ids(p, target.vocab_size).items())
    prompts = dict(every[: a.prompts])
    teeth = list(make_plan(p).settings.sized_teeth)

    def call(ps: dict) -> object:
        out = tooth_sizes(target, draft, ps, p.configs, teeth, p.drafter, p.positions,
                          budget=p.teeth.size_budget)  # fmt: skip
        _sync(target)
        return out

    if a.warm:
        t0 = time.perf_counter()
        call(dict(every[-1:]))
        print(f"warm-up (prompt {every[-1][0]}) {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    call(prompts)
    print(f"unprofiled: {time.perf_counter() - t0:.2f} s")
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    sizes = call(prompts)
    prof.disable()
    wall = time.perf_counter() - t0
    counts = sizes.status.value_counts().to_dict()  # type: ignore[attr-defined]
    print(f"tooth_sizes: {len(prompts)} prompt(s) x {len(p.configs)} configs x {teeth} "
          f"in {wall:.1f} s (cProfile); statuses {counts}")  # fmt: skip
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(a.top)
        print("\n".join(s.getvalue().splitlines()[: a.top + 9]))
    if a.torch:
        _torch_tables(lambda: call(prompts), a.top)


def _torch_tables(fn: object, top: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        fn()  # type: ignore[operator]
    print(f"torch profiler: {time.perf_counter() - t0:.2f} s")
    ka = prof.key_averages()
    if torch.cuda.is_available():
        print(ka.table(sort_by="self_cuda_time_total", row_limit=top, max_name_column_width=50))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=50))


def _sync(model: object) -> None:
    import torch

    if str(getattr(model, "device", "cpu")).startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
