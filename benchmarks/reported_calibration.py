"""Null calibration of the reported-p family (issue 31 item 4): false alarms ≤ α.

Part A (end to end, the run's path): the example program ``reporting_engine.py --lie none``
(spectest's exact loops, reporting the p each token was drawn from) on the toy pair, as the
candidate (speculative, rounds reported: the round-slot strata run) and as the reference
(plain), through the real ``command`` engine; the teacher (``engines.teacher``) forces the
tokens for the cross-check; ``stats.battery`` with the cells and reported-p families. Each
replication uses fresh seeds (disjoint ranges): the count of replications whose reported-p
family rejects, and each of its tests', at the family's share of α.

Part B (the truncated PIT): tokens drawn from random Dirichlet laws, reported as a top-n list
(n drawn per token) — the token's p, its cdf_lo when it is in the list, else only the list's
mass — through ``reported_p.arm_tests``: the PIT on the coarsened law must hold its level.

Usage: python benchmarks/reported_calibration.py [--reps 200] [--seeds 64] [--b-reps 1000]
Prints one line per part and a JSON record (results/bench/).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

ALPHA = 0.05
TOY_T = "toy:V=16,order=2,scale=2.0,seed=3"
TOY_D = "toy:V=16,order=2,scale=1.0,seed=4"


def _replicate(engines, r, n_seeds, configs, positions, drafter, target):
    """One replication's two arms through the command engine, teacher-forced: (samples, rounds)."""
    import pandas as pd

    from spectest.engines.base import ArmJob, RowSpec, rounds_frame, samples_frame
    from spectest.engines.teacher import teacher_force
    from spectest.generation import reported_columns

    samples, rounds = [], []
    for j, (arm, eng) in enumerate(engines.items()):
        seeds = range((2 * r + j) * n_seeds, (2 * r + j + 1) * n_seeds)
        rows = tuple(RowSpec(c, s, sp) for c, sp in configs for s in seeds)
        job = ArmJob(
            arm=arm,
            role=arm,
            variant=None,
            prompt_id="p0",
            prompt_ids=(1, 2, 3),
            rows=rows,
            num_positions=positions,
            run_key=11,
            batch_size=len(rows),
            drafter=drafter,
        )
        out = eng.generate(job)
        wb = teacher_force(target, job.prompt_ids, [x.params for x in rows], out.tokens)
        samples.append(
            samples_frame(out.tokens, "p0", rows, arm, reported_columns(out.reported, wb))
        )
        if out.rounds is not None:
            rounds.append(rounds_frame(out.rounds, "p0", rows, arm))
    s = pd.concat(samples, ignore_index=True)
    rd = pd.concat(rounds, ignore_index=True) if rounds else None
    return s, rd


def _engines(target: Any, draft: Any) -> dict[str, Any]:
    """The honest reporting program as the reference (plain) and candidate (speculative) arm."""
    from spectest.engines.base import Models
    from spectest.engines.command import CommandEngine

    base = [
        "{python}",
        "{programs}/reporting_engine.py",
        "--lie",
        "none",
        "--target",
        TOY_T,
        "--draft",
        TOY_D,
    ]
    engines = {
        "reference": CommandEngine(
            CommandEngine.parse_options({"command": base}, "ref"), Models(target, draft)
        ),
        "candidate": CommandEngine(
            CommandEngine.parse_options({"command": [*base, "--speculative"]}, "cand"),
            Models(target, draft),
        ),
    }
    return engines


def part_a(reps: int, n_seeds: int, positions: int, offset: int = 0) -> dict[str, object]:
    from spectest import schema
    from spectest.engines.base import DrafterSpec
    from spectest.models.zoo import load_model
    from spectest.sampling.params import SamplingParams
    from spectest.stats.battery import AnalysisOptions, analyze
    from spectest.stats.family_cells import CellFamily
    from spectest.stats.reported_p import ReportedFamily

    target, draft = load_model(TOY_T), load_model(TOY_D)
    configs = [
        ("t1.0", SamplingParams(temperature=1.0)),
        ("t0.8-p0.9", SamplingParams(0.8, 0, 0.9, 0.0)),
    ]
    engines = _engines(target, draft)
    opts = AnalysisOptions(alpha=2 * ALPHA, null_permutations=20, trie_depth=0, sequence=False)
    fails: dict[str, int] = {}
    any_fail = cand_fail = control_fail = 0
    drafter = DrafterSpec(onehot=False, k=3)
    try:
        for r in range(offset, offset + reps):
            s, rd = _replicate(engines, r, n_seeds, configs, positions, drafter, target)
            a = analyze(
                s,
                reference="reference",
                candidate="candidate",
                options=opts,
                rng_seed=r,
                families=[CellFamily(), ReportedFamily()],
                all_rounds=rd,
            )
            res = a.families["reported"]
            assert abs(res.alpha - ALPHA) < 1e-12, res.alpha
            cand = res.table[res.table["arm"] == "candidate"]
            for t in cand.itertuples(index=False):
                fails[t.test] = fails.get(t.test, 0) + int(bool(t.reject))
            any_fail += int(res.rejected or res.control_failed)
            cand_fail += int(res.rejected)
            control_fail += int(res.control_failed)
            assert schema.REP_P in s.columns
    finally:
        for eng in engines.values():
            eng.close()
    return {
        "reps": reps,
        "seeds": n_seeds,
        "positions": positions,
        "alpha": ALPHA,
        "family_false_alarms": any_fail,
        "candidate_rejections": cand_fail,
        "control_failures": control_fail,
        "per_test": fails,
    }


def part_b(reps: int, n: int, V: int = 24) -> dict[str, object]:
    import pandas as pd

    from spectest import schema
    from spectest.stats.reported_p import arm_tests

    rng = np.random.default_rng(2026)
    fails, outside = 0, 0.0
    for _ in range(reps):
        law = rng.dirichlet(np.full(V, 0.3), size=n)  # [n, V]
        x = (law.cumsum(1) > rng.random((n, 1))).argmax(1)
        rank = np.argsort(-law, axis=1, kind="stable")
        pos = np.argsort(rank, axis=1)
        srt = np.take_along_axis(law, rank, 1)
        lo_all = srt.cumsum(1) - srt
        top = rng.integers(1, V + 1, n)  # the list length per token
        i = np.arange(n)
        r = pos[i, x]
        inside = r < top
        mass = np.array([srt[k, : top[k]].sum() for k in range(n)])
        df = pd.DataFrame(
            {
                schema.REP_P: law[i, x],
                schema.REP_CDF_LO: np.where(inside, lo_all[i, r], np.nan),
                schema.REP_MASS: mass,
            }
        )
        rows = arm_tests(df, None, rng, ALPHA, 1e-3, "candidate", False)
        fails += any(row["reject"] for row in rows)
        outside += float((~inside).mean())
    return {
        "reps": reps,
        "tokens": n,
        "alpha": ALPHA,
        "false_alarms": fails,
        "outside_fraction": outside / reps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=64)
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--b-reps", type=int, default=1000)
    ap.add_argument("--b-tokens", type=int, default=500)
    ap.add_argument("--skip-a", action="store_true")
    ap.add_argument("--skip-b", action="store_true")
    ap.add_argument("--offset", type=int, default=0, help="first replication (disjoint seeds)")
    a = ap.parse_args()
    out: dict[str, object] = {}
    t0 = time.perf_counter()
    if not a.skip_b:
        b = part_b(a.b_reps, a.b_tokens)
        print(
            f"part B (truncated PIT, synthetic): {b['false_alarms']}/{b['reps']} false alarms "
            f"at α {ALPHA} ({b['outside_fraction']:.1%} of tokens outside their list)",
            flush=True,
        )
        out["B"] = b
    if not a.skip_a:
        res = part_a(a.reps, a.seeds, a.positions, a.offset)
        print(
            f"part A (toy pair, command engine): candidate rejected in "
            f"{res['candidate_rejections']}/{res['reps']} replications at α {ALPHA} (control "
            f"failures {res['control_failures']}; either {res['family_false_alarms']}); per "
            f"test {res['per_test']}",
            flush=True,
        )
        out["A"] = res
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
