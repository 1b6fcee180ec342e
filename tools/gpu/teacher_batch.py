"""Claim (b) teacher-forced at another teacher batch shape, on a finished run (issue 31).

Usage: python tools/gpu/teacher_batch.py RUN_DIR [--rows 1 13 64]

RUN_DIR: a finished ``spectest run`` with ``arms.floor.teacher_forced`` (its protocol.yaml,
samples.parquet and teacher_laws.parquet). For each ``--rows`` R the plain engine's laws at the
same prefixes are computed again in forwards of R rows (``plain_laws.law_table`` with
``arms.floor.batch_size: R``: in bfloat16 on a GPU a row's law moves with the batch shape) and
claim (b) is decided against them (``decide_teacher_forced``, the run's margin, α and key).
Prints per R the claim (b) line and, against the run's stored laws, the exact batch-shape
floor: per unit ‖mean over the unit's sequences of (π_R(h) − π_run(h))‖², averaged over units
— what U1 reads for a sampler exact at batch shape R judged against the run's teacher (no
sampling in it) — and the largest TV between the two laws at one prefix.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.decision.claims import TeacherForcedClaim
from spectest.engines.plain_laws import law_table
from spectest.generation import load_models
from spectest.plan import make_plan
from spectest.protocol import load_protocol
from spectest.stats.teacher_forced import _first, law_dict, prefix_key
from spectest.stats.token_floor import cell_matrices


def batch_floor(frame: pd.DataFrame, a: dict, b: dict, n_max: int) -> tuple[float, float, int]:
    """(mean over units of ‖mean_i (π_a(h_i) − π_b(h_i))‖², max TV at one prefix, units)."""
    per_unit, worst = [], 0.0
    for (pid, cid), X in _first(cell_matrices(frame), n_max).items():
        for t in range(X.shape[1]):
            diff: dict[int, float] = {}
            for row in X:
                key = (pid, cid, t, prefix_key(row[:t]))
                d = dict(zip(*a[key], strict=True))
                for i, p in zip(*b[key], strict=True):
                    d[int(i)] = d.get(int(i), 0.0) - p
                worst = max(worst, 0.5 * sum(abs(v) for v in d.values()))
                for i, v in d.items():
                    diff[i] = diff.get(i, 0.0) + v / len(X)
            per_unit.append(sum(v * v for v in diff.values()))
    return float(np.mean(per_unit)), worst, len(per_unit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--rows", type=int, nargs="+", default=[1])
    a = ap.parse_args()
    pr = load_protocol(a.run / "protocol.yaml")
    assert pr.floor is not None and pr.floor.teacher is not None, "not a teacher-forced run"
    samples = pd.read_parquet(a.run / "samples.parquet")
    stored = pd.read_parquet(a.run / "teacher_laws.parquet")
    models = load_models(pr, need_draft=False)
    cols = ["prompt_id", "config_id", "seed", "position", "token_id"]
    frames = [
        samples.loc[samples.arm == arm, cols].reset_index(drop=True)
        for arm in ("reference", "candidate")
    ]
    alpha = make_plan(pr).settings.run_alpha
    base = law_dict(stored)[0]
    for rows in a.rows:
        p = dataclasses.replace(pr, floor=dataclasses.replace(pr.floor, batch_size=rows))
        table = law_table(p, models, frames[::-1], pr.floor.teacher, lambda *_: None)
        n, m = pr.floor.teacher, pr.floor.margin
        claim = TeacherForcedClaim(frames[0], frames[1], n, m, alpha, pr.hash, table, p.floor.kind)
        r = claim.result()
        new = law_dict(table)[0]
        for arm, frame in (("candidate", frames[1]), ("reference", frames[0])):
            f, worst, units = batch_floor(frame, new, base, pr.floor.teacher)
            print(
                f"rows {rows}: {arm}'s prefixes: batch-shape floor {f:.3e} per unit over "
                f"{units} units (vs the run's laws), largest TV at one prefix {worst:.4f}"
            )
        print(f"rows {rows}: {r.line if r is not None else 'no claim'}", flush=True)


if __name__ == "__main__":
    main()
