"""Where P1's ``tooth sizes`` phase goes (issue 24): ``tooth_sizes`` for the first prompt of the
openinfer-512 plan at the 0.6B realistic shape (bf16, CUDA), under cProfile; prints the wall time
and the top functions by own time. Runs on CPU too (``--device cpu --target bundled`` style
overrides via ``--set``), at any shape the protocol names.

    python tools/gpu/tooth_size_profile.py --set models.device=cuda --set ...
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from spectest.generation import drafter_of, load_models
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol
from spectest.tooth_size import tooth_sizes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--prompts", type=int, default=1)
    a = ap.parse_args()
    p = load_protocol(a.config, sets=a.set)
    t0 = time.perf_counter()
    models = load_models(p, need_draft=True)
    target, draft = models.target, models.draft
    print(f"load {time.perf_counter() - t0:.1f} s")
    prompts = dict(list(prompt_token_ids(p, target.vocab_size).items())[: a.prompts])
    plan = make_plan(p)
    teeth = list(plan.settings.sized_teeth)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    sizes = tooth_sizes(target, draft, prompts, p.configs, teeth, drafter_of(p), p.positions,
                        budget=p.teeth.size_budget)  # fmt: skip
    prof.disable()
    wall = time.perf_counter() - t0
    counts = sizes.status.value_counts().to_dict()
    print(f"tooth_sizes: {len(prompts)} prompt(s) x {len(p.configs)} configs x {teeth} "
          f"in {wall:.1f} s; statuses {counts}")  # fmt: skip
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print("\n".join(s.getvalue().splitlines()[:45]))


if __name__ == "__main__":
    main()
