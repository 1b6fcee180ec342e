"""What the shortlist's host read per call costs the fast arms (issue 32, P2).

Each ``shortlist_probs`` call decides two flags (finiteness, decidability): read at once, one
host sync per plain step and K + 1 per speculative round. This tool times P2's fast arms in one
process in three modes, alternating run by run: ``sync`` (every call reads at once:
``pipeline.DEFER_ON`` emptied), ``deferred`` (the loops' deferred reads, the default on CUDA:
docs/internals.md "Deferred shortlist reads") and ``nosync`` (the bound: every call deferred
and the flags read only once the run is over, where they must hold), and from one profiled run per
arm and mode the device's busy share (the union of kernel intervals over the wall). ``--old FILE``
adds the mode ``old``: ``deferred`` with the ``shortlist_probs`` of another tree's
``spectest/sampling/shortlist.py`` (an A/B of the shortlist's own host work in one process).

    PYTHONPATH=. python tools/gpu/sync_cost.py [--rows 1024,256] [--repeat 3] [--modes M,..]
        [--old FILE]
    (``--device cpu --rows 2 --positions 4``: a smoke test anywhere)

Prints one line per (rows, arm, mode): median wall, rows/s, × the first mode, busy share.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from spectest import bench
from spectest.engines import fast
from spectest.sampling import pipeline as pipeline_mod
from spectest.sampling import shortlist as sl
from spectest.sampling.laws import ShortlistLaw
from spectest.sampling.params import SamplingTensors

NOSYNC_READS = [sl.Deferred()]  # the nosync run's flags, read only after it (one per run)


def shortlist_nosync(logits: torch.Tensor, params: SamplingTensors) -> ShortlistLaw | None:
    """``shortlist_probs`` deferring into this run's ``Deferred``, which no loop reads."""
    return sl.shortlist_probs(logits, params, defer=NOSYNC_READS[-1])


SYNC = fast.FAST
NOSYNC = dataclasses.replace(fast.FAST, shortlist=shortlist_nosync)
ON = pipeline_mod.DEFER_ON
MODES = {  # mode: (the fast engine's pipeline, the device types that defer)
    "sync": (SYNC, frozenset()),
    "deferred": (SYNC, ON),
    "nosync": (NOSYNC, frozenset()),
}


def add_old(path: str) -> None:
    """Add the mode ``old``: the deferred loops on ``path``'s ``shortlist_probs``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("old_shortlist", path)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    MODES["old"] = (dataclasses.replace(fast.FAST, shortlist=old.shortlist_probs), ON)


def _mode(name: str) -> None:
    fast.FAST, pipeline_mod.DEFER_ON = MODES[name]


def busy_share(fn: Any, device: str) -> tuple[float, float]:
    """(wall s, device busy share) of one profiled ``fn()``: the union of kernel intervals."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        fn()
        bench._sync(device)
        wall = time.perf_counter() - t
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    spans = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    busy, end = 0.0, -1.0
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    first = spans[0][0] if spans else 0.0
    return wall, busy / max(end - first, 1e-9) if spans else 0.0


def timed(b: Any, arms: list[Any], rows: int, repeat: int, device: str) -> dict[Any, list]:
    """Wall of every (arm, mode) run, ``repeat`` rounds alternating mode by mode; the first
    round's rounds per row printed."""
    from spectest.engines.base import check_output

    walls: dict[tuple[str, str], list[float]] = {}
    for i in range(repeat):
        for arm in arms:
            for mode in MODES:
                _mode(mode)
                NOSYNC_READS.append(sl.Deferred())
                job = b.job(arm, rows, False)
                bench._sync(device)
                t = time.perf_counter()
                out = b.engine(arm.engine).generate(job)
                bench._sync(device)
                walls.setdefault((arm.label, mode), []).append(time.perf_counter() - t)
                check_output(out, job, b.models.target.vocab_size, arm.engine)
                first = i == 0 and mode == next(iter(MODES))
                if out.rounds is not None and len(out.rounds) and first:
                    per_row = out.rounds.groupby("row").size()
                    q = per_row.quantile([0.5, 0.9, 0.99, 1.0]).tolist()
                    used = per_row.sum() / (len(per_row) * per_row.max())
                    print(
                        f"rows {rows} {arm.label}: rounds per row p50/p90/p99/max {q}, "
                        f"active share of the batch's rounds {used:.1%}"
                    )
                if mode == "nosync":  # its laws were the synced ones only if every call decided
                    NOSYNC_READS[-1].check()
    return walls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1024,256")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--arms", default="fast-plain,fast-spec")
    ap.add_argument("--target", default="realistic:qwen3-0.6b")
    ap.add_argument("--draft", default="derived:first_layers,layers=4")
    ap.add_argument("--modes", default=None, help="of sync,deferred,nosync[,old] (default all)")
    ap.add_argument("--old", default=None, help="another tree's spectest/sampling/shortlist.py")
    a = ap.parse_args()
    if a.old:
        add_old(a.old)
    for name in [m for m in MODES if a.modes and m not in a.modes.split(",")]:
        del MODES[name]
    from spectest.engines.base import Models
    from spectest.models.zoo import load_pair

    dtype = "bfloat16" if a.device.startswith("cuda") else None
    target, draft = load_pair(a.target, a.draft, device=a.device, dtype=dtype, seed=0)
    for rows in (int(r) for r in a.rows.split(",")):
        cfg = bench.BenchConfig(
            target=a.target,
            draft=a.draft,
            device=a.device,
            rows=rows,
            positions=a.positions,
            onehot=False,
            arms=tuple(a.arms.split(",")),
        )
        prompt, _ = bench.bench_prompt(cfg, target.vocab_size)
        b = bench._Bench(cfg, Models(target, draft), print, prompt)
        arms = [bench.parse_arm(x) for x in cfg.arms]
        for arm in arms:
            b.warm(arm, False)
        walls = timed(b, arms, rows, a.repeat, a.device)
        for arm in arms:
            ref = next(iter(MODES))
            base = statistics.median(walls[(arm.label, ref)])
            for mode in MODES:
                _mode(mode)
                ws = walls[(arm.label, mode)]
                w = statistics.median(ws)
                run = functools.partial(b.engine(arm.engine).generate, b.job(arm, rows, False))
                pwall, share = busy_share(run, a.device)
                print(
                    f"rows {rows} {arm.label} {mode}: median {w:.3f} s ({min(ws):.3f}-"
                    f"{max(ws):.3f}), {rows / w:.1f} rows/s, {base / w:.3f}x {ref}; profiled "
                    f"{pwall:.3f} s, device busy {share:.1%}"
                )
        fast.FAST, pipeline_mod.DEFER_ON = SYNC, ON  # as shipped
        b.close()


if __name__ == "__main__":
    main()
