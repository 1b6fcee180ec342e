"""Power table (issue 14): kill rate of every catalogue mutant and of ε-biased acceptors at 256
seeds per arm, black-box only and with white-box, default families vs with the sequence-level
families, plus the false-alarm rate of every family under H0.

Benchmark shape (issue 14): the bundled pair, 4 prompts (english-8, first 4) × 2 configs × 12
positions, one-hot drafter K = 3. Generating is the expensive part, so a big *pool* is generated
once per arm — ``--reps × --per-arm`` seeds per cell, disjoint seed ranges per arm — and cached as
Parquet under ``results/power_pool/`` (ignored by git); replications are disjoint slices of it.

    # 1. pools (resumable: one file per arm × prompt; CPU: ~14 min per speculative arm, 1 thread)
    OMP_NUM_THREADS=1 python benchmarks/power_table.py generate [--device cuda] [--arms a,b]
    # 2. the table (reads the pools; arms without a complete pool are skipped and listed)
    OMP_NUM_THREADS=1 python benchmarks/power_table.py table [--reps 20] [--h0-reps 200]

``table`` prints a markdown table and writes ``results/bench/power_table.json``. Under H0 a
replication draws 256 + 256 sequences per cell at random (without replacement) from the
reference and exact pools; replications then overlap a little (each uses 5 % of a pool), so the
false-alarm estimate is unbiased but its spread is slightly above the binomial one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "results" / "power_pool"
OUT_JSON = ROOT / "results" / "bench" / "power_table.json"

PROMPTS_FILE = ROOT / "protocols" / "prompts" / "english-8.jsonl"
N_PROMPTS = 4
# the pairs: the bundled byte-level pair (text prompts), and an analytic order-3 Markov pair
# (token-id prompts) ten times cheaper to sample on a CPU
PAIRS = {
    "bundled": ("bundled:target", "bundled:draft"),
    "toy": ("toy:V=64,order=3,scale=2.0,seed=1", "derived:noised,noise=0.5,seed=2"),
}
TOY_PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
POSITIONS = 12
K = 3
CONFIGS = {
    "t0.8-k20-p0.95": dict(temperature=0.8, top_k=20, top_p=0.95),
    "t1.0-p0.9": dict(temperature=1.0, top_p=0.9),
}
RUN_KEY = 14_2026
SEED_STRIDE = 1_000_000  # arm i draws seeds [i·stride, i·stride + pool size)
# priority order: the pools are generated in this order (subtle bugs first)
ARMS = (
    "reference",
    "exact",
    "eps_biased:0.1",
    "eps_biased:0.05",
    "eps_biased:0.2",
    "reuse_accept_uniform",
    "raw_q",
    "swapped_filter_order",
    "residual_from_p",
    "commit_on_telemetry",
    "bonus_wrong_row",
    "target_unprocessed",
    "bf16_ratio",
    "onehot_softmax_q",
    "greedy_verify",
    "always_accept",
)


def _prompts(pair: str) -> list[tuple[str, list[int]]]:
    """(prompt id, token ids) of the benchmark's prompts for ``pair``."""
    if pair == "toy":
        return [(f"p{i}", ids) for i, ids in enumerate(TOY_PROMPTS)]
    from spectest.models import bytetok

    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    return [(r["id"], bytetok.encode(r["text"])) for r in rows[:N_PROMPTS]]


def _pool_path(pair: str, arm: str, prompt_id: str) -> Path:
    return POOL / pair / arm.replace(":", "_") / f"{prompt_id}.parquet"


def _rounds_path(pair: str, arm: str, prompt_id: str) -> Path:
    return POOL / pair / arm.replace(":", "_") / f"{prompt_id}.rounds.parquet"


def generate(args: argparse.Namespace) -> None:
    import torch

    from spectest.engines import builtin
    from spectest.engines.teacher import teacher_force
    from spectest.models.zoo import load_pair
    from spectest.sampling.mutants import get_variant
    from spectest.sampling.params import SamplingParams

    if args.device == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)
    target, draft = load_pair(*PAIRS[args.pair], device=args.device, dtype="float32")
    drafter = builtin.DrafterSpec(onehot=True, k=K)
    n_seeds = args.reps * args.per_arm
    arms = args.arms.split(",") if args.arms else list(ARMS)
    for i, arm in enumerate(ARMS):
        if arm not in arms or (args.workers > 1 and ARMS.index(arm) % args.workers != args.worker):
            continue
        base = i * SEED_STRIDE
        rows = [
            builtin.RowSpec(cid, base + s, SamplingParams(**p))
            for cid, p in CONFIGS.items()
            for s in range(n_seeds)
        ]
        for pid, ids in _prompts(args.pair):
            path = _pool_path(args.pair, arm, pid)
            if path.exists():
                continue
            t0 = time.perf_counter()
            common = dict(
                num_positions=POSITIONS, run_key=RUN_KEY, prompt_id=pid, batch_size=args.batch
            )
            if arm == "reference":
                out = builtin.plain_decode(target, ids, rows, **common)
            else:
                out = builtin.speculative_decode(
                    target, draft, ids, rows, drafter=drafter, variant=get_variant(arm), **common
                )
            samples = builtin.to_samples_frame(out, pid, rows, arm)
            wb = teacher_force(
                target, ids, [r.params for r in rows], out.tokens, draft=draft, drafter=drafter
            )
            samples = pd.concat([samples, wb], axis=1)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            if out.rounds is not None:
                builtin.to_rounds_frame(out, pid, rows, arm).to_parquet(
                    _rounds_path(args.pair, arm, pid), index=False
                )
            samples.to_parquet(tmp, index=False)
            tmp.rename(path)
            print(f"{arm} {pid}: {len(rows)} rows in {time.perf_counter() - t0:.0f} s", flush=True)


def load_pool(pair: str, arm: str) -> tuple[pd.DataFrame, pd.DataFrame | None] | None:
    """An arm's pool (samples, rounds) with ``seed`` rebased to 0..n-1, or None if incomplete."""
    parts, rparts = [], []
    base = ARMS.index(arm) * SEED_STRIDE
    for pid, _ in _prompts(pair):
        path = _pool_path(pair, arm, pid)
        if not path.exists():
            return None
        s = pd.read_parquet(path)
        s["seed"] -= base
        parts.append(s)
        rp = _rounds_path(pair, arm, pid)
        if rp.exists():
            r = pd.read_parquet(rp)
            r["seed"] -= base
            rparts.append(r)
    rounds = pd.concat(rparts, ignore_index=True) if rparts else None
    return pd.concat(parts, ignore_index=True), rounds


# ----------------------------------------------------------------------------- analysis
PER_ARM = 256
ALPHA = 0.05
# a configuration = the families whose decisions are combined, each at α / (number of them)
CONFIGS_FAMILIES = {
    "chi2+BH alone": ("cells",),
    "default black-box (cells, trie)": ("cells", "trie"),
    "black-box + sequence": ("cells", "trie", "sequence"),
    "sequence alone": ("sequence",),
    "default + white-box": ("cells", "trie", "whitebox"),
    "all (+ white-box + sequence)": ("cells", "trie", "whitebox", "sequence"),
}


def family_pvalues(a: object) -> dict[str, float]:
    """Each family's smallest adjusted p-value (it rejects at level x iff this is <= x; the
    adjusted p-values of BH, Bonferroni and the max-T do not depend on the level) and each
    sequence statistic's own permutation p-value."""
    out: dict[str, float] = {}
    cells = a.cells  # type: ignore[attr-defined]
    ok = cells["status"] == "ok"
    out["cells"] = float(cells.loc[ok, "p_adj"].min()) if ok.any() else 1.0
    trie = a.trie  # type: ignore[attr-defined]
    out["trie"] = float(trie["p_adj"].min()) if len(trie) and trie["p_adj"].notna().any() else 1.0
    wb = a.whitebox  # type: ignore[attr-defined]
    cand = wb[(wb["arm"] == "candidate")] if len(wb) else wb
    if len(cand):
        support = bool(((cand["test"] == "support") & (cand["statistic"] > 0)).any())
        rest = cand[cand["test"] != "support"]["p_adj"].astype(float)
        out["whitebox"] = 0.0 if support else float(rest.min()) if len(rest) else 1.0
    else:
        out["whitebox"] = float("nan")
    out["sequence"] = float(a.sequence_pvalue)  # type: ignore[attr-defined]
    seq = a.sequence  # type: ignore[attr-defined]
    for r in seq[seq["scope"] == "pooled"].itertuples(index=False):
        out[f"seq:{r.test}"] = float(r.pvalue)
        out[f"mde:{r.test}"] = float(r.mde)
    out["mde_tv_cells"] = float(a.mde_tv)  # type: ignore[attr-defined]
    return out


def _slice(df: pd.DataFrame | None, seeds: np.ndarray, arm: str) -> pd.DataFrame | None:
    if df is None:
        return None
    return df[np.isin(df["seed"].to_numpy(), seeds)].assign(arm=arm)


def _analyze_one(
    ref: tuple[pd.DataFrame, pd.DataFrame | None],
    cand: tuple[pd.DataFrame, pd.DataFrame | None],
    ref_seeds: np.ndarray,
    cand_seeds: np.ndarray,
    perms: int,
    seed: int,
    statistics: tuple[str, ...] = (),
) -> dict[str, float]:
    from spectest.stats import AnalysisOptions, analyze

    s = pd.concat(
        [_slice(ref[0], ref_seeds, "reference"), _slice(cand[0], cand_seeds, "candidate")],
        ignore_index=True,
    )
    rounds = _slice(cand[1], cand_seeds, "candidate")
    a = analyze(
        s,
        reference="reference",
        candidate="candidate",
        options=AnalysisOptions(
            alpha=ALPHA,
            null_permutations=perms,
            **({"sequence_statistics": statistics} if statistics else {}),
        ),
        rounds=rounds,
        rng_seed=seed,
    )
    return family_pvalues(a)


def table(args: argparse.Namespace) -> None:
    """Analyse slices of the pools; one JSON line per (arm, replication) in the cache file."""
    cache = ROOT / "results" / f"power_{args.pair}{args.tag}.jsonl"
    done: set[tuple[str, int]] = set()
    if cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done.add((r["arm"], r["rep"]))
    ref = load_pool(args.pair, "reference")
    exact = load_pool(args.pair, "exact")
    if ref is None:
        sys.exit(f"no complete reference pool under {POOL / args.pair}")
    jobs: list[tuple[str, int]] = []
    if exact is not None:
        jobs += [("H0", r) for r in range(args.h0_reps)]
    for arm in ARMS[2:]:
        jobs += [(arm, r) for r in range(args.reps)]
    jobs = [j for j in jobs if j not in done]
    jobs = jobs[args.worker :: args.workers]
    pools: dict[str, tuple[pd.DataFrame, pd.DataFrame | None] | None] = {}
    stats_ = tuple(x for x in args.statistics.split(",") if x)
    n_pool = int(ref[0]["seed"].max()) + 1
    with cache.open("a") as fh:
        for arm, r in jobs:
            t0 = time.perf_counter()
            if arm == "H0":
                assert exact is not None
                rng = np.random.default_rng([14, r])
                rs = rng.choice(n_pool, args.per_arm, replace=False)
                cs = rng.choice(n_pool, args.per_arm, replace=False)
                res = _analyze_one(ref, exact, rs, cs, args.perms, r, stats_)
            else:
                if arm not in pools:
                    pools[arm] = load_pool(args.pair, arm)
                pool = pools[arm]
                if pool is None:
                    continue
                seeds = np.arange(r * args.per_arm, (r + 1) * args.per_arm)
                res = _analyze_one(ref, pool, seeds, seeds, args.perms, r, stats_)
            rec = {"arm": arm, "rep": r, "wall_s": time.perf_counter() - t0, **res}
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            print(f"{arm} rep {r}: {rec['wall_s']:.1f} s", flush=True)


def _markdown(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def report(args: argparse.Namespace) -> None:
    """Kill rates (markdown) from the cache; writes results/bench/power_table_<pair>.json."""
    cache = ROOT / "results" / f"power_{args.pair}{args.tag}.jsonl"
    df = pd.DataFrame([json.loads(line) for line in cache.read_text().splitlines()])
    rows = []
    for arm, g in df.groupby("arm", sort=False):
        row: dict[str, object] = {"arm": arm, "reps": len(g)}
        for name, fams in CONFIGS_FAMILIES.items():
            level = ALPHA / len(fams)
            hit = np.zeros(len(g), dtype=bool)
            for f in fams:
                hit |= g[f].fillna(1.0).to_numpy() <= level
            row[name] = int(hit.sum())
        for f in ("cells", "trie", "whitebox", "sequence"):
            row[f"{f} @α"] = int((g[f].fillna(1.0) <= ALPHA).sum())
        for c in [c for c in g.columns if c.startswith("seq:")]:
            row[f"{c} @α"] = int((g[c] <= ALPHA).sum())
        rows.append(row)
    out = pd.DataFrame(rows)
    order = {a: i for i, a in enumerate(("H0", *ARMS))}
    out = out.sort_values("arm", key=lambda s: s.map(order)).reset_index(drop=True)
    mutants = out[out["arm"] != "H0"]
    totals = {c: int(mutants[c].sum()) for c in CONFIGS_FAMILIES}
    mde = {c: float(df[c].median()) for c in df.columns if c.startswith("mde")}
    print(_markdown(out))
    print("\ntotal kills over mutant arms:", json.dumps(totals))
    print("median resolutions:", json.dumps(mde))
    OUT_JSON.parent.mkdir(parents=True, exist_ok=True)
    path = OUT_JSON.with_name(f"power_table_{args.pair}{args.tag}.json")
    path.write_text(
        json.dumps(
            {"pair": args.pair, "alpha": ALPHA, "per_arm": PER_ARM, "rows": rows,
             "totals": totals, "median_resolution": mde},
            indent=1,
        )
    )  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate the per-arm pools (resumable)")
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    g.add_argument("--pair", default="toy", choices=sorted(PAIRS))
    g.add_argument("--reps", type=int, default=20)
    g.add_argument("--per-arm", type=int, default=256)
    g.add_argument("--batch", type=int, default=1024)
    g.add_argument("--arms", default="", help="comma-separated subset of the arms")
    g.add_argument("--workers", type=int, default=1, help="split the arms over N processes")
    g.add_argument("--worker", type=int, default=0)
    t = sub.add_parser("table", help="analyse replications (resumable JSON lines cache)")
    t.add_argument("--pair", default="toy", choices=sorted(PAIRS))
    t.add_argument("--reps", type=int, default=20)
    t.add_argument("--per-arm", type=int, default=PER_ARM)
    t.add_argument("--h0-reps", type=int, default=200)
    t.add_argument("--perms", type=int, default=200)
    t.add_argument("--tag", default="", help="suffix of the cache file (e.g. -all5)")
    t.add_argument("--statistics", default="", help="sequence statistics (default: DEFAULT)")
    t.add_argument("--workers", type=int, default=1)
    t.add_argument("--worker", type=int, default=0)
    r = sub.add_parser("report", help="print the kill-rate table from the cache")
    r.add_argument("--pair", default="toy", choices=sorted(PAIRS))
    r.add_argument("--tag", default="")
    a = ap.parse_args()
    {"generate": generate, "table": table, "report": report}[a.cmd](a)
