"""Where the fast arms' host time goes (issue 32, P2): P2's fast arms under cProfile.

Each arm of ``spectest bench`` (P2's pair in bfloat16, the sampled drafter) is warmed up, timed
plain, then run once under ``cProfile``. Prints per arm the plain wall, the profiled wall, and
the ``--top`` functions by own time (torch's ops and launches show as built-in methods; a host
read shows as the time ``tolist`` / ``item`` wait), then by cumulative time among spectest's own.

    PYTHONPATH=. python tools/gpu/host_profile.py [--rows 256] [--arms fast-plain,fast-spec]
    (``--device cpu --rows 2 --positions 4 --target bundled:target --draft bundled:draft``: a
    smoke test anywhere)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from spectest import bench


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--arms", default="fast-plain,fast-spec")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", default="realistic:qwen3-0.6b")
    ap.add_argument("--draft", default="derived:first_layers,layers=4")
    a = ap.parse_args()
    from spectest.engines.base import Models
    from spectest.models.zoo import load_pair

    dtype = "bfloat16" if a.device.startswith("cuda") else None
    target, draft = load_pair(a.target, a.draft, device=a.device, dtype=dtype, seed=0)
    cfg = bench.BenchConfig(
        target=a.target,
        draft=a.draft,
        device=a.device,
        rows=a.rows,
        positions=a.positions,
        onehot=False,
        arms=tuple(a.arms.split(",")),
    )
    prompt, _ = bench.bench_prompt(cfg, target.vocab_size)
    b = bench._Bench(cfg, Models(target, draft), print, prompt)
    for arm in (bench.parse_arm(x) for x in cfg.arms):
        b.warm(arm, False)
        engine, job = b.engine(arm.engine), b.job(arm, a.rows, False)
        walls = []
        for _ in range(3):
            bench._sync(a.device)
            t = time.perf_counter()
            engine.generate(job)
            bench._sync(a.device)
            walls.append(time.perf_counter() - t)
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        engine.generate(job)
        bench._sync(a.device)
        prof.disable()
        wall = time.perf_counter() - t
        print(f"== {arm.label} at {a.rows} rows: wall {min(walls):.3f} s, profiled {wall:.3f} s")
        for key, only in (("tottime", ""), ("cumulative", "spectest")):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(only, a.top)
            print("\n".join(ln for ln in s.getvalue().splitlines() if ln.strip()))
    b.close()


if __name__ == "__main__":
    main()
