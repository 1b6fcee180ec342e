"""Calibration of matched numerics mode (issue 21) under simulated bf16-sized numerics.

Each replication runs, on the toy LM with shape-dependent numerics (``toy:...,numerics=σ``,
``spectest.models.toy``), the matched arm and a null arm — spectest's exact speculative sampler
in the same loop, same batch size, disjoint seeds — and records:

- every test family's rejection of the null against the matched arm (``stats.battery``, the
  run's α split over the families): the black-box false-alarm rate under numerics;
- the white-box family of that comparison (recorded p_t: exact under numerics);
- claim (b) (``stats.drift.decide_drift`` on ``numerics.drift_table`` of the matched arm):
  ``beyond`` is a false fail (the verify and decode perturbations have the same size, so the
  true D = drift − floor is ≈ 0 < margin); and the coverage of the one-sided bounds: how often
  UCB(D) falls below the pooled D of all replications (should be ≤ α).

Prints one JSON line per replication and a summary with exact binomial (Clopper–Pearson)
upper bounds. Usage (about 2–4 s per replication on one CPU core)::

    OMP_NUM_THREADS=1 python benchmarks/drift_calibration.py --reps 200 --sigma 0.0065

``--dump`` keeps each replication's drift table; ``--redecide A.jsonl B.jsonl`` decides claim (b)
again from such files with this checkout's bounds (seconds per hundred replications).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from spectest.engines.base import DecodeRequest, DrafterSpec, RowSpec, rounds_frame, samples_frame
from spectest.engines.builtin import speculative_decode
from spectest.models.zoo import load_model
from spectest.numerics.table import drift_table
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.stats.battery import AnalysisOptions, analyze
from spectest.stats.drift import decide_drift


def _arm(target, draft, prompt, rows, name, T, K, batch):
    req = DecodeRequest(
        prompt,
        rows,
        num_positions=T,
        run_key=12345,
        prompt_id="p0",
        batch_size=batch,
        whitebox=True,
    )
    out = speculative_decode(
        target, draft, req, drafter=DrafterSpec(onehot=True, k=K), variant=get_variant("exact")
    )
    wb = out.whitebox
    return (
        samples_frame(np.asarray(out.tokens), "p0", rows, name, wb),
        rounds_frame(out.rounds, "p0", rows, name),
    )


def _null(target, draft, prompt, rows_n, sm, rm, shape, opts, rep):
    """The null arm generated and every family's analysis of it against the matched arm."""
    T, K, batch = shape
    sn, rn = _arm(target, draft, prompt, rows_n, "null", T, K, batch)
    return analyze(
        pd.concat([sm, sn], ignore_index=True), reference="matched", candidate="null",
        options=opts, rounds=pd.concat([rm, rn], ignore_index=True), rng_seed=rep,
    )  # fmt: skip


def coverage(recs: list[dict], D_all: float) -> dict:
    """The bounds checked against the pooled D of all replications (the toy's true D)."""
    n = len(recs)
    lo, hi = sum(r["lcb"] > D_all for r in recs), sum(r["ucb"] < D_all for r in recs)
    return {
        "D_pooled": D_all, "lcb_above_pooled_D": lo, "ucb_below_pooled_D": hi,
        "lcb_miss_cp95": cp95(lo, n), "ucb_miss_cp95": cp95(hi, n),
        "drift_beyond": sum(r["decision"] == "beyond" for r in recs),
        "drift_within": sum(r["decision"] == "within" for r in recs),
    }  # fmt: skip


def cp95(k: int, n: int) -> float:
    """Exact one-sided 95 % upper bound (Clopper–Pearson) of a binomial rate k / n."""
    return 1.0 if k == n else float(sps.beta.ppf(0.95, k + 1, n - k))


def redecide(paths: list[str], margin: float, alpha: float) -> None:
    """Claim (b) decided again, with this checkout's ``decide_drift``, from ``--dump`` files: the
    same per-token tables and bootstrap seeds, so old and new bounds are compared on the same
    data (``ucb_unchanged``: replications whose UCB is bit-identical to the dumped one)."""
    recs = []
    for path in paths:
        with open(path) as fh:
            for line in fh:
                rec = json.loads(line)
                tab = pd.DataFrame(rec["table"]).assign(prompt_id="p0", config_id="a")
                rng = np.random.default_rng([rec["rep"], 21])
                d = decide_drift(tab, margin=margin, alpha=alpha, rng=rng)
                assert d is not None
                recs.append({"D": d.statistic, "lcb": d.lcb, "ucb": d.ucb,
                             "decision": d.decision, "old_lcb": rec["lcb"],
                             "old_ucb": rec["ucb"], "old_decision": rec["decision"]})  # fmt: skip
    D_all = float(np.mean([r["D"] for r in recs]))
    old = [{"lcb": r["old_lcb"], "ucb": r["old_ucb"], "decision": r["old_decision"]} for r in recs]
    out = {
        "reps": len(recs), "new": coverage(recs, D_all), "dumped": coverage(old, D_all),
        "ucb_unchanged": sum(r["ucb"] == r["old_ucb"] for r in recs),
        "lcb_lowered": sum(r["lcb"] < r["old_lcb"] for r in recs),
        "lcb_raised": sum(r["lcb"] > r["old_lcb"] for r in recs),
        "mean_D_minus_lcb": {"new": float(np.mean([r["D"] - r["lcb"] for r in recs])),
                             "dumped": float(np.mean([r["D"] - r["old_lcb"] for r in recs]))},
    }  # fmt: skip
    print("REDECIDE " + json.dumps(out), flush=True)


def _replication(
    a: argparse.Namespace,
    rep: int,
    target: Any,
    draft: Any,
    prompt: list[int],
    configs: list,
    opts: AnalysisOptions,
) -> tuple[dict[str, Any], pd.DataFrame]:
    """One replication: the matched and null arms on fresh seeds, the analysis of null vs
    matched, claim (b)'s drift decision; its record and drift table."""
    K, T = 3, a.positions
    base = 10_000 + rep * 2 * a.seeds
    rows_m = [RowSpec(cid, base + s, sp) for cid, sp in configs for s in range(a.seeds)]
    rows_n = [RowSpec(cid, base + a.seeds + s, sp) for cid, sp in configs for s in range(a.seeds)]
    batch = len(rows_m)
    sm, rm = _arm(target, draft, prompt, rows_m, "matched", T, K, batch)
    an = (  # --drift-only: claim (b) alone, no null arm
        None
        if a.drift_only
        else _null(target, draft, prompt, rows_n, sm, rm, (T, K, batch), opts, rep)
    )
    table = drift_table(
        target, sm, rm, {"p0": prompt}, configs, arm="matched", K=K, batch_size=batch,
        positions=T, rows_per_cell=a.measured, floor_rows_per_cell=a.floor_rows,
    )  # fmt: skip
    d = decide_drift(table, margin=a.margin, alpha=a.alpha, rng=np.random.default_rng([rep, 21]))
    assert d is not None
    rec = {
        "rep": rep,
        "rejected": bool(an.rejected) if an is not None else False,
        "families": {} if an is None else {
            n: bool(r.rejected) for n, r in an.families.items() if r.active
        },
        "drift": d.drift, "floor": d.floor, "D": d.statistic, "lcb": d.lcb, "ucb": d.ucb,
        "decision": d.decision,
    }  # fmt: skip
    return rec, table


def _summary(a: argparse.Namespace, recs: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """The replications' rates: null rejections (with its 95 % bound), per family, coverage."""
    T = a.positions
    n = len(recs)
    D_all = float(np.mean([r["D"] for r in recs]))

    fams = sorted({f for r in recs for f in r["families"]})
    out = {
        "reps": n, "sigma": a.sigma, "seeds": a.seeds, "positions": T, "alpha": a.alpha,
        "margin": a.margin, "measured": a.measured, "floor_rows": a.floor_rows,
        "wall_s": round(time.perf_counter() - t0, 1),
        "null_rejected": sum(r["rejected"] for r in recs),
        "per_family": {f: sum(r["families"].get(f, False) for r in recs) for f in fams},
        "drift_mean": float(np.mean([r["drift"] for r in recs])),
        "floor_mean": float(np.mean([r["floor"] for r in recs])),
        **coverage(recs, D_all),
    }  # fmt: skip
    out["null_rejected_cp95"] = cp95(out["null_rejected"], n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--first-rep", type=int, default=0, help="to extend a run with new seeds")
    ap.add_argument("--sigma", type=float, default=0.0065)
    ap.add_argument("--seeds", type=int, default=200, help="seeds per arm and config")
    ap.add_argument("--positions", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--margin", type=float, default=0.002)
    ap.add_argument("--permutations", type=int, default=100)
    ap.add_argument("--measured", type=int, default=64, help="drift sequences per cell")
    ap.add_argument("--floor-rows", type=int, default=32, help="floor sequences per cell")
    ap.add_argument(
        "--drift-only", action="store_true",
        help="claim (b) only: skip the families' analysis of the null (their calibration is h31's)",
    )  # fmt: skip
    ap.add_argument(
        "--dump", default=None, help="write each replication's per-token drift table (JSONL)"
    )
    ap.add_argument(
        "--redecide", default=None, nargs="+",
        help="decide claim (b) again from --dump files (no generation; bounds only)",
    )  # fmt: skip
    a = ap.parse_args()
    if a.redecide:
        redecide(a.redecide, a.margin, a.alpha)
        return
    dump = open(a.dump, "w") if a.dump else None
    target = load_model(f"toy:V=16,order=2,scale=2.0,seed=3,numerics={a.sigma}")
    draft = load_model("toy:V=16,order=2,scale=1.0,seed=4")
    prompt = [1, 2, 3]
    configs = [("a", SamplingParams(temperature=0.8, top_p=0.95))]
    opts = AnalysisOptions(alpha=a.alpha, null_permutations=a.permutations)
    recs = []
    t0 = time.perf_counter()
    for rep in range(a.first_rep, a.first_rep + a.reps):
        rec, table = _replication(a, rep, target, draft, prompt, configs, opts)
        recs.append(rec)
        print(json.dumps(rec), flush=True)
        if dump is not None:
            cols = ["seed", "position", "tv", "floor_tv", "flip"]
            tab = {c: table[c].tolist() for c in cols}
            dump.write(json.dumps({"rep": rep, **rec, "table": tab}) + "\n")
            dump.flush()
    print("SUMMARY " + json.dumps(_summary(a, recs, t0)), flush=True)


if __name__ == "__main__":
    main()
